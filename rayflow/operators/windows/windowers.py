"""Windowers (count, tumbling, sliding and session windows) and the results they close.
Pure."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rayflow.errors import check_number


@dataclass(frozen=True)
class CountWindow:
    """A key's window closes after ``size`` records."""

    size: int

    def __post_init__(self):
        if (isinstance(self.size, bool) or not isinstance(self.size, numbers.Integral)
                or self.size < 1):
            raise ValueError(f"CountWindow: size must be an int >= 1, got {self.size!r}")


@dataclass(frozen=True)
class TumblingWindow:
    """Consecutive windows of ``length_s`` seconds aligned to ``align_s`` (epoch by default)."""

    length_s: float
    align_s: float = 0.0

    def __post_init__(self):
        check_number("TumblingWindow", "length_s", self.length_s)
        check_number("TumblingWindow", "align_s", self.align_s, above=None)

    def windows_of(self, t: float) -> list[tuple[float, float]]:
        start = self.align_s + math.floor((t - self.align_s) / self.length_s) * self.length_s
        return [(start, start + self.length_s)]

    def windows_of_many(self, times: np.ndarray) -> list[list[tuple[float, float]]]:
        """:meth:`windows_of` of every time in ``times``, computed as arrays (a batch
        rarely spans more than a few windows; records of one window share its list)."""
        if not len(times):
            return []
        starts, index = np.unique(np.floor((times - self.align_s) / self.length_s),
                                  return_inverse=True)
        windows = [[(start, start + self.length_s)] for start in
                   (self.align_s + starts * self.length_s).tolist()]
        return [windows[i] for i in index.tolist()]


@dataclass(frozen=True)
class SlidingWindow:
    """Windows of ``length_s`` seconds starting every ``slide_s`` seconds."""

    length_s: float
    slide_s: float
    align_s: float = 0.0

    def __post_init__(self):
        check_number("SlidingWindow", "length_s", self.length_s)
        check_number("SlidingWindow", "slide_s", self.slide_s)
        check_number("SlidingWindow", "align_s", self.align_s, above=None)

    def windows_of(self, t: float) -> list[tuple[float, float]]:
        last = self.align_s + math.floor((t - self.align_s) / self.slide_s) * self.slide_s
        out = []
        start = last
        while start > t - self.length_s:
            out.append((start, start + self.length_s))
            start -= self.slide_s
        return out[::-1]

    def windows_of_many(self, times: np.ndarray) -> list[list[tuple[float, float]]]:
        """:meth:`windows_of` of every time in ``times``: the times are grouped by the
        latest window start at or before them (numpy), and a group whose earliest and
        latest time get the same windows shares one list (a time's windows only lose old
        ones as it grows within a group); any other group is assigned time by time."""
        if not len(times):
            return []
        lasts, index = np.unique(np.floor((times - self.align_s) / self.slide_s),
                                 return_inverse=True)
        lo = np.full(len(lasts), np.inf)
        hi = np.full(len(lasts), -np.inf)
        np.minimum.at(lo, index, times)
        np.maximum.at(hi, index, times)
        shared = [w if w == self.windows_of(b) else None for w, b in
                  zip(map(self.windows_of, lo.tolist()), hi.tolist())]
        return [shared[i] if shared[i] is not None else self.windows_of(t)
                for i, t in zip(index.tolist(), times.tolist())]


@dataclass(frozen=True)
class SessionWindow:
    """Per-key sessions: a record at ``t`` opens the window ``[t, t + gap_s)``, and windows
    of one key that touch or overlap merge (Flink's session windows), so a session ends
    ``gap_s`` after its last record. A closed session's state is deleted."""

    gap_s: float

    def __post_init__(self):
        check_number("SessionWindow", "gap_s", self.gap_s)


class WindowResult(NamedTuple):
    """One closed window: its key, its bounds (or count sequence) and the aggregate.

    An immutable named tuple: a window step makes one per closed window, and a tuple costs
    a fraction of a frozen dataclass to build (the W4 word count closes more than one window
    a sentence)."""

    key: Any
    start: float
    end: float
    value: Any



def result_times(results: list) -> np.ndarray | None:
    """Event time of each window result: the window's last instant (just before its end), as
    Flink's ``maxTimestamp``, so a result falls in the same window of a later step."""
    if not results:
        return None
    return np.nextafter(np.array([r.end for r in results], dtype=np.float64), -math.inf)
