"""Log records of rayflow's actors reach Ray's worker logs.

A Ray worker process has no handler on the root logger, so records below WARNING from
``logging.getLogger(__name__)`` in an actor would be dropped. :func:`worker_logging` gives
the ``rayflow`` logger a stderr handler there: Ray writes a worker's stderr to its log file
(``worker-*.err`` in the session's logs) and forwards the lines to the driver, so ``ray job
logs`` and the Ray dashboard show them. The level is ``RAYFLOW_LOG_LEVEL`` in the worker's
environment (default INFO; set it through the job's runtime environment, ``env_vars``).
"""

from __future__ import annotations

import logging
import os
import sys

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
_installed = False


def worker_logging() -> None:
    """Once per process: rayflow's records at ``RAYFLOW_LOG_LEVEL`` (INFO) to stderr."""
    global _installed
    if _installed:
        return
    _installed = True
    logger = logging.getLogger("rayflow")
    level = os.environ.get("RAYFLOW_LOG_LEVEL", "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    known = logging.getLevelName(level)  # the number of a level's name
    logger.setLevel(known if isinstance(known, int) else logging.INFO)
    logger.propagate = False  # a root handler set up by Ray's logging config: not twice
