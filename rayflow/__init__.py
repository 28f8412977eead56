"""rayflow: streams and MPI stages in one Python program, on Ray.

Importing rayflow does not import Ray; the runtime starts (or connects to) Ray when a job runs.

    >>> from rayflow import Dataflow, MemorySource, CollectSink
    >>> flow = Dataflow("hello")
    >>> flow.source("in", MemorySource([1, 2, 3])).map("double", lambda x: 2 * x).sink("out", CollectSink())
"""

# first: it sets Ray's authentication mode before anything imports Ray
from rayflow import _raycontext  # noqa: F401
from rayflow.config import load_config
from rayflow.connectors.broker import EmbeddedBroker
from rayflow.connectors.kafka import KafkaSink, KafkaSource
from rayflow.connectors.memory import CollectSink, DiscardSink, GeneratorSource, MemorySource
from rayflow.core.records import Field
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
    "init",
    "load_config",
    "run",
]
__version__ = "0.1.0"


def run(flow, **kwargs):
    """Run ``flow`` on Ray (see :func:`rayflow.runtime.job.run`)."""
    from rayflow.runtime.job import run as _run

    return _run(flow, **kwargs)


def init(address=None, num_cpus=None, **ray_options):
    """Start the embedded local Ray, or connect to a cluster; returns the ``ray`` module.

    Optional: streams and MPI stages start the embedded Ray themselves when nothing did.

    Args:
        address: a cluster (``auto``, ``host:6379`` or ``ray://host:10001``); ``None`` starts
            a private local Ray (never another cluster on the machine by accident).
        num_cpus: logical CPUs of the local Ray (default: the machine's cores).
        **ray_options: passed to ``ray.init`` (e.g. ``namespace``).

    Raises:
        RuntimeError: Ray already runs in this process and ``address`` or ``num_cpus`` asks
            for another one.

    Example:
        ``rayflow.init(num_cpus=4)`` before the first stage.
    """
    import ray

    from rayflow._raycontext import ensure_ray

    if ray.is_initialized() and (address is not None or num_cpus is not None or ray_options):
        raise RuntimeError(
            "Ray already runs in this process; call rayflow.init(...) before anything starts "
            "it, or ray.shutdown() first"
        )
    return ensure_ray(address, num_cpus, **ray_options)
