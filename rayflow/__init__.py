"""rayflow: streams and MPI stages in one Python program, on Ray.

Importing rayflow does not import Ray; the runtime starts (or connects to) Ray when a job runs.

    >>> from rayflow import Dataflow, MemorySource, CollectSink
    >>> flow = Dataflow("hello")
    >>> flow.source("in", MemorySource([1, 2, 3])).map("double", lambda x: 2 * x).sink("out", CollectSink())
"""

import os as _os

# Ray 2.60 turns token auth on; a client that connects by address, or that starts a local
# instance after a token was written, needs this before Ray is imported (see RAY_NOTES).
_os.environ.setdefault("RAY_AUTH_MODE", "token")

from rayflow.batches import Field  # noqa: E402
from rayflow.config import load_config  # noqa: E402
from rayflow.connectors.broker import EmbeddedBroker
from rayflow.connectors.kafka import KafkaSink, KafkaSource
from rayflow.connectors.memory import CollectSink, DiscardSink, GeneratorSource, MemorySource
from rayflow.dataflow import Dataflow
from rayflow.errors import StepError

__all__ = [
    "CollectSink",
    "Dataflow",
    "DiscardSink",
    "EmbeddedBroker",
    "Field",
    "GeneratorSource",
    "KafkaSink",
    "KafkaSource",
    "MemorySource",
    "StepError",
    "load_config",
    "run",
]
__version__ = "0.1.0"


def run(flow, **kwargs):
    """Run ``flow`` on Ray (see :func:`rayflow.runtime.job.run`)."""
    from rayflow.runtime.job import run as _run

    return _run(flow, **kwargs)
