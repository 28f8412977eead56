"""Clocks: processing time and event time, and each record's time on a clock. Pure."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayflow.core.records import num_rows, rows
from rayflow.errors import check_number


@dataclass(frozen=True)
class ProcessingTime:
    """Windows by the wall clock when the record is processed."""


@dataclass(frozen=True)
class EventTime:
    """Event time: on a source, how its watermarks are made; on a window, join or timer
    step, that it runs on event time and fires on the watermarks that reach it.

    On a source (``flow.source(..., watermarks=EventTime(...))``) each split (a Kafka
    partition) keeps a bounded out-of-orderness watermark; see
    :mod:`rayflow.operators.watermarks`. On a step (``clock=EventTime()``) only ``timestamp``
    applies: the watermark comes from upstream.

    Args:
        timestamp: record -> seconds since the epoch. On a source it sets the records' event
            times (which then travel with them); None uses the source's own (Kafka record
            timestamps). On a step it reads the time from the record instead of the event
            time that came with it.
        max_delay_s: (sources) bounded out-of-orderness: a split's watermark trails the
            largest event time it has seen by this much.
        idle_timeout_s: (sources) a split without records for this long (wall clock) is idle
            and leaves the minimum, so it cannot hold windows open forever; None: never idle.
    """

    timestamp: Callable[[Any], float] | None = None
    max_delay_s: float = 0.0
    idle_timeout_s: float | None = 5.0

    def __post_init__(self):
        check_number("EventTime", "max_delay_s", self.max_delay_s, above=None, at_least=0.0)
        check_number("EventTime", "idle_timeout_s", self.idle_timeout_s, or_none=True)

    @property
    def sets_watermarks(self) -> bool:
        """Whether the fields that only a source uses differ from their defaults."""
        return self.max_delay_s != 0.0 or self.idle_timeout_s != 5.0



def _times(clock, items, event_times) -> np.ndarray:
    """Each record's time on ``clock``: now (processing time), the timestamp function, or
    the event times that came with the batch."""
    if not isinstance(clock, EventTime):
        return np.full(num_rows(items), time.time())
    if clock.timestamp is not None:
        return np.array([clock.timestamp(r) for r in rows(items)], dtype=np.float64)
    if event_times is None:
        raise ValueError("EventTime without a timestamp function needs event times from the "
                         "source (Kafka record timestamps, or watermarks=EventTime(timestamp=...)"
                         " on the source)")
    return np.asarray(event_times, dtype=np.float64)


def not_finite(t: float) -> str:
    """The dead-letter reason of a record whose event time is NaN or infinite: it has no
    window, and no watermark would ever pass it (event-time operators route such records to
    the dead letters instead of keeping them for ever)."""
    return f"event time {t!r} is not a finite number"
