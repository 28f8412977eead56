"""The batch helpers' earlier home, kept for code (and pickled checkpoints) written against
it: records live in :mod:`rayflow.core.records`, channel messages in
:mod:`rayflow.core.messages`."""

from rayflow.core.messages import Barrier, EndOfStream, Tick, Watermark  # noqa: F401
from rayflow.core.records import *  # noqa: F403
