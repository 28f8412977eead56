"""The control messages that travel in the channels, in order with the batches: the end of
a stream, checkpoint barriers, watermarks and ticks. Pure and Ray-free: the runtime sends
and aligns them; the watermark generators of :mod:`rayflow.operators.watermarks` make
watermarks (which is why they sit here, below both, and not in the runtime).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EndOfStream:
    """Sent once by each upstream instance on each channel when its input is exhausted."""

    step_id: str
    instance: int
    drain: bool = True  # False after a savepoint: operators keep open windows in the state


@dataclass(frozen=True, slots=True)
class Barrier:
    """Checkpoint barrier ``checkpoint_id``; travels in the channels between batches."""

    checkpoint_id: int
    stop_after: bool = False


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time has reached ``time``: no more records with an event time ``<= time`` are
    expected from this sender. ``idle=True``: the sender has no active input for now and
    leaves the receiver's minimum until it sends an active watermark again (see
    :mod:`rayflow.operators.watermarks`). Travels in the channels in order with the data."""

    time: float
    idle: bool = False


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passes (sent by idle sources), so timers fire without data."""

    now: float
