"""Watermarks: how far event time has progressed. Pure logic, no Ray.

A watermark ``w`` is a promise that no more records with event time ``t <= w`` are expected.
It is made at the sources and travels in the channels in order with the data, as Flink does:

- :class:`SplitWatermarks` runs in a source instance. Each split (a Kafka partition, a slice
  of a list) keeps its own bounded out-of-orderness watermark, ``max event time seen -
  max_delay_s``, and the instance's watermark is the minimum over its *active* splits. A split
  with no record for ``idle_timeout_s`` turns idle and leaves the minimum: it neither holds the
  others back nor advances time by the wall clock. When every split is idle the instance says
  so downstream.
- :class:`InputWatermarks` runs in every other instance (Flink's "status watermark valve"):
  the instance's watermark is the minimum over its inputs that are neither idle nor finished,
  and it is forwarded only when that minimum advances, so watermarks never go back.

    >>> gen = SplitWatermarks(max_delay_s=1.0, idle_timeout_s=None, splits=["p0", "p1"])
    >>> gen.observe("p0", [10.0], now=0.0); gen.observe("p1", [4.0], now=0.0)
    >>> gen.advance(now=0.0)                      # min over splits: 4 - 1
    Watermark(time=3.0, idle=False)
    >>> valve = InputWatermarks([("src", 0), ("src", 1)])
    >>> valve.update(("src", 0), Watermark(3.0)) is None    # input 1 has said nothing yet
    True
    >>> valve.update(("src", 1), Watermark(5.0))
    Watermark(time=3.0, idle=False)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from rayflow.core.messages import Watermark

NEVER = -math.inf


class SplitWatermarks:
    """Per-split bounded out-of-orderness watermarks of one source instance.

    Args:
        max_delay_s: how far behind the largest event time seen a split's watermark trails.
        idle_timeout_s: a split with no record for this long (wall clock) is idle; None: never.
        splits: the splits the instance reads; :meth:`set_splits` changes them.
        state: what :meth:`snapshot` returned (restores every split's largest event time).
    """

    def __init__(self, max_delay_s: float, idle_timeout_s: float | None,
                 splits: Iterable[Any] = (0,), state: dict | None = None, now: float = 0.0):
        if max_delay_s < 0:
            raise ValueError(f"max_delay_s must be >= 0, got {max_delay_s}")
        if idle_timeout_s is not None and idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0 or None, got {idle_timeout_s}")
        self.max_delay_s, self.idle_timeout_s = float(max_delay_s), idle_timeout_s
        state = state or {}
        self.max_seen: dict[Any, float] = dict(state.get("max_seen", {}))
        self.emitted: float = state.get("emitted", NEVER)
        self.last_record: dict[Any, float] = {}
        self.idle = False  # what downstream was told last
        self.splits: list = []
        self.set_splits(splits, now)

    def set_splits(self, splits: Iterable[Any], now: float) -> None:
        """The splits read from now on: a new split starts active (its clock for idleness
        starts now); a removed one (finished, reassigned) leaves the minimum."""
        self.splits = list(splits)
        for s in self.splits:
            self.max_seen.setdefault(s, NEVER)
            self.last_record.setdefault(s, now)

    def observe(self, split: Any, times: Any, now: float) -> None:
        """Records of one poll: ``split`` is one split id for all of them, or one id per
        record (an array as long as ``times``)."""
        times = np.asarray(times, dtype=np.float64)
        if not times.size:
            return
        if isinstance(split, np.ndarray) and split.ndim:
            if len(split) != len(times):
                raise ValueError(f"{len(split)} split ids for {len(times)} records")
            for s in np.unique(split).tolist():
                self._seen(s, float(times[split == s].max()), now)
        else:
            self._seen(split, float(times.max()), now)

    def _seen(self, split: Any, t: float, now: float) -> None:
        if split not in self.max_seen:
            self.splits.append(split)
            self.max_seen[split] = NEVER
        if t > self.max_seen[split]:
            self.max_seen[split] = t
        self.last_record[split] = now

    def active(self, now: float) -> list:
        """The splits that are not idle at wall-clock time ``now``."""
        if self.idle_timeout_s is None:
            return list(self.splits)
        return [s for s in self.splits if now - self.last_record[s] < self.idle_timeout_s]

    def current(self, now: float) -> tuple[float, bool]:
        """``(watermark, idle)``: the minimum over the active splits, and whether all are
        idle. When all are, the watermark is where the splits that had records and turned
        idle last left it, as if the splits had turned idle one after the other: a split
        that never had a record holds nothing back, even when it turns idle at the same
        moment as the last one that had."""
        live = self.active(now)
        if not live:
            seen = [s for s in self.splits if self.max_seen[s] > NEVER]
            if not seen:
                return self.emitted, True
            last = max(self.last_record[s] for s in seen)
            return min(self.max_seen[s] for s in seen
                       if self.last_record[s] == last) - self.max_delay_s, True
        return min(self.max_seen[s] for s in live) - self.max_delay_s, False

    def advance(self, now: float) -> Watermark | None:
        """The message to send downstream now, if any: a higher watermark, or a change
        between active and idle (turning idle, first the watermark the last active splits
        had reached, then the idle status)."""
        wm, idle = self.current(now)
        if idle:
            if wm > self.emitted:
                self.emitted, self.idle = wm, False
                return Watermark(wm, False)
            if self.idle:
                return None
            self.idle = True
            return Watermark(self.emitted, True)
        if wm > self.emitted or self.idle:
            self.emitted = max(self.emitted, wm)
            self.idle = False
            return Watermark(self.emitted, False)
        return None

    def wake(self) -> Watermark | None:
        """Records arrived while downstream was told this instance is idle: the message that
        makes it active again (sent before those records), carrying the last watermark."""
        if not self.idle:
            return None
        self.idle = False
        return Watermark(self.emitted, False)

    def snapshot(self) -> dict:
        return {"max_seen": dict(self.max_seen), "emitted": self.emitted}


class InputWatermarks:
    """The watermark of an instance with several inputs: the minimum over the inputs that are
    neither idle nor finished; forwarded only when it advances (or the instance turns idle or
    active again)."""

    def __init__(self, inputs: Iterable[Any]):
        self.wm: dict[Any, float] = {i: NEVER for i in inputs}
        self.idle: set = set()
        self.finished: set = set()
        self.current = NEVER
        self.is_idle = False

    def update(self, sender: Any, msg: Watermark) -> Watermark | None:
        """A watermark (or idle status) from ``sender``; returns what to forward, if any."""
        if sender not in self.wm:
            raise KeyError(f"watermark from {sender!r}, which is not an input")
        if msg.idle:
            self.idle.add(sender)
        else:
            self.idle.discard(sender)
            if msg.time > self.wm[sender]:
                self.wm[sender] = msg.time
        return self._combine()

    def of(self, senders: Iterable[Any]) -> float:
        """The watermark of ``senders`` alone (one input of a step with several): the
        minimum of theirs, where a finished one no longer holds it back and an idle one
        still does (it may send records from its last watermark on when it wakes)."""
        return min((math.inf if s in self.finished else self.wm[s] for s in senders),
                   default=NEVER)

    def finish(self, sender: Any) -> Watermark | None:
        """``sender`` ended its stream: it no longer holds the minimum."""
        self.finished.add(sender)
        return self._combine()

    def _combine(self) -> Watermark | None:
        live = [w for i, w in self.wm.items() if i not in self.idle and i not in self.finished]
        if not live:
            if len(self.finished) == len(self.wm) or self.is_idle:
                return None  # all finished: end of stream says the rest
            self.is_idle = True
            return Watermark(self.current, True)
        wm = min(live)
        if wm > self.current or self.is_idle:
            self.current = max(self.current, wm)
            self.is_idle = False
            return Watermark(self.current, False)
        return None


class SourcePosition:
    """A source instance's checkpointed state when it makes watermarks: the reader's position
    and the split watermarks (so that after a restore the watermarks continue where they
    were, and windows close at the same event times)."""

    __slots__ = ("position", "watermarks")

    def __init__(self, position: Any, watermarks: dict):
        self.position, self.watermarks = position, watermarks

    def __reduce__(self):
        return (SourcePosition, (self.position, self.watermarks))

    def __repr__(self) -> str:
        return f"SourcePosition({self.position!r}, {self.watermarks!r})"


def split_position(resume: Any) -> tuple[Any, dict | None]:
    """``(reader position, watermark state)`` of a source's resume state: a plain position,
    a :class:`SourcePosition`, or a ``Rescaled`` of either (then each old instance's position
    is unwrapped, and the split watermarks of all old instances are merged)."""
    from rayflow.core.operators import Rescaled

    if isinstance(resume, SourcePosition):
        return resume.position, resume.watermarks
    if isinstance(resume, Rescaled):
        merged: dict = {}
        found = False
        handles = []
        for h in resume.handles:
            if isinstance(h, SourcePosition):
                found = True
                for s, t in h.watermarks.get("max_seen", {}).items():
                    merged[s] = max(merged.get(s, NEVER), t)
                h = h.position
            handles.append(h)
        state = {"max_seen": merged, "emitted": NEVER} if found else None
        return Rescaled(tuple(handles), resume.old_parallelism), state
    return resume, None
