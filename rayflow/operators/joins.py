"""Joins of two keyed streams. Pure logic, no Ray; state lives in the step's state backend.

- :class:`WindowJoin` (``left.join(step_id, right, window, how=...)``, Flink's
  ``join().where().equalTo().window()``): the records of both sides that share a key and a
  window (tumbling, sliding or session) are paired when the window fires. ``how="inner"``
  emits every pair; ``"left"`` also emits each left record of a window without a right one
  as ``(key, left, None)``; ``"outer"`` also the unmatched right ones as ``(key, None,
  right)``. A window join *is* a windowed aggregation whose accumulator keeps both sides'
  records, so it shares the windows' state layout, firing queue, checkpoints and rescaling.
- :class:`IntervalJoin` (``left.interval_join(step_id, right, lower_s, upper_s)``): pairs
  with ``left.t + lower_s <= right.t <= left.t + upper_s``, emitted as soon as both are
  there; each record is kept until the watermark shows that nothing can match it any more.

Output records are ``(key, left, right)`` tuples. A record that comes too late leaves on
the ``late`` output: for a window join, one whose windows have all closed (behind the
watermark, it still joins a window or session that is open); for an interval join, one
whose time is below the watermark.

    >>> from rayflow.core.operators import StepContext
    >>> from rayflow.operators.windows import TumblingWindow
    >>> j = WindowJoin(TumblingWindow(10.0), "inner", str, str).build(StepContext("j", 0, 1))
    >>> _ = j.process_input(0, ["a"], None); _ = j.process_input(1, ["a", "b"], None)
    >>> j.on_end().items
    [('a', 'a', 'a')]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rayflow.core.operators import Logic, OperatorSpec, Output, StepContext, describe_exception
from rayflow.core.records import rows
from rayflow.errors import check_number
from rayflow.operators.keyed import _GLOBAL, _StatefulLogic, check_ttl
from rayflow.operators.queues import KeyDeadlines
from rayflow.operators.windows import (
    Aggregator,
    EventTime,
    ProcessingTime,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    Windowed,
)
from rayflow.operators.windows.clocks import _times, not_finite

How = Literal["inner", "left", "outer"]
LEFT, RIGHT = 0, 1


class _BothSides(Aggregator):
    """A window's records of each side: ``([left...], [right...])``."""

    def create(self):
        return ([], [])

    def add(self, acc, tagged):
        acc[tagged[0]].append(tagged[1])
        return acc

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])


@dataclass(frozen=True)
class _Tagged:
    """The key of a record tagged with its side."""

    left_key: Callable[[Any], Any]
    right_key: Callable[[Any], Any]

    def __call__(self, tagged):
        return (self.left_key if tagged[0] == LEFT else self.right_key)(tagged[1])


@dataclass(frozen=True)
class _TaggedTime:
    timestamp: Callable[[Any], float]

    def __call__(self, tagged):
        return self.timestamp(tagged[1])


@dataclass(frozen=True)
class WindowJoin(OperatorSpec):
    """Pair the records of two keyed streams that share a key and a window.

    Args:
        window: TumblingWindow, SlidingWindow or SessionWindow.
        how: ``inner``, ``left`` or ``outer``.
        left_key, right_key: each side's key function (their ``key_by``).
        clock: ProcessingTime() or EventTime(...) (then both inputs need watermarks).
        ttl_s: remove a key's open windows after this many seconds without its records.
    """

    window: TumblingWindow | SlidingWindow | SessionWindow
    how: How
    left_key: Callable[[Any], Any]
    right_key: Callable[[Any], Any]
    clock: ProcessingTime | EventTime = ProcessingTime()
    ttl_s: float | None = None

    def __post_init__(self):
        check_ttl(self.ttl_s)
        if self.how not in ("inner", "left", "outer"):
            raise ValueError(f"join: how must be 'inner', 'left' or 'outer', got {self.how!r}")
        if not isinstance(self.window, (TumblingWindow, SlidingWindow, SessionWindow)):
            raise ValueError(f"join: window must be a TumblingWindow, SlidingWindow or "
                             f"SessionWindow, got {self.window!r}")

    @property
    def event_time(self) -> bool:
        return isinstance(self.clock, EventTime)

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _WindowJoinLogic(self, ctx, resume_state)


class _WindowJoinLogic(Logic):
    def __init__(self, spec: WindowJoin, ctx: StepContext, resume_state: Any):
        super().__init__(ctx)
        self.spec = spec
        clock = spec.clock
        if isinstance(clock, EventTime) and clock.timestamp is not None:
            clock = EventTime(timestamp=_TaggedTime(clock.timestamp))
        inner = Windowed(spec.window, _BothSides(), _Tagged(spec.left_key, spec.right_key),
                         clock, spec.ttl_s)
        self.inner = inner.build(ctx, resume_state)

    @property
    def state(self):
        """The inner windowed aggregation's keyed state."""
        return self.inner.state

    @property
    def now(self):
        """The clock of ``ttl_s`` (tests replace it)."""
        return self.inner.now

    @now.setter
    def now(self, clock):
        self.inner.now = clock

    def process(self, items, event_times):
        raise TypeError(f"step {self.ctx.step_id!r}: a join takes each batch with its side "
                        f"(process_input)")

    def process_input(self, index, items, event_times):
        # (the inner windows' process_input: expired keys go before the batch reads them)
        out = self.inner.process_input(0, [(index, r) for r in rows(items)], event_times)
        dead = [dataclasses.replace(d, record=d.record[1]) if isinstance(d.record, tuple)
                else d for d in out.dead]  # the record, without its side tag
        late = out.side.get("late")
        side = {"late": ([r for _, r in late[0]], late[1])} if late else {}
        return Output(*self._pairs(out), dead, side, out.expired)

    def _pairs(self, out: Output | None) -> tuple[list, np.ndarray | None]:
        pairs: list = []
        times: list = []
        how = self.spec.how
        if out is None or not out.items:
            return pairs, None
        # (ignored below: the windowed inner logic stamps every output with its window's time)
        for r, t in zip(out.items, out.event_times.tolist()):  # type: ignore[union-attr]
            lefts, rights = r.value
            before = len(pairs)
            if rights:
                pairs.extend((r.key, a, b) for a in lefts for b in rights)
            elif how != "inner":
                pairs.extend((r.key, a, None) for a in lefts)
            if how == "outer" and not lefts:
                pairs.extend((r.key, None, b) for b in rights)
            times.extend([t] * (len(pairs) - before))
        return pairs, (np.asarray(times, dtype=np.float64) if pairs else None)

    def _wrap(self, out: Output | None) -> Output | None:
        if out is None:
            return None
        items, times = self._pairs(out)
        return Output(items, times, expired=out.expired)

    def on_watermark(self, watermark):
        return self._wrap(self.inner.on_watermark(watermark))

    def on_tick(self, now):
        return self._wrap(self.inner.on_tick(now))

    def on_end(self):
        return self._wrap(self.inner.on_end())

    def snapshot(self):
        return self.inner.snapshot()

    def discard(self, handle):
        self.inner.discard(handle)

    def close(self):
        self.inner.close()


@dataclass(frozen=True)
class IntervalJoin(OperatorSpec):
    """Pairs ``(key, left, right)`` with ``left.t + lower_s <= right.t <= left.t + upper_s``
    (event time; Flink's interval join). Output event time: the later of the two."""

    lower_s: float
    upper_s: float
    left_key: Callable[[Any], Any]
    right_key: Callable[[Any], Any]
    clock: EventTime = EventTime()
    ttl_s: float | None = None

    def __post_init__(self):
        check_ttl(self.ttl_s)
        for name in ("lower_s", "upper_s"):
            check_number("interval_join", name, getattr(self, name), above=None)
        if self.lower_s > self.upper_s:
            raise ValueError(f"interval_join: lower_s ({self.lower_s}) is above upper_s "
                             f"({self.upper_s})")
        if not isinstance(self.clock, EventTime):
            raise ValueError("interval_join runs on event time: clock must be EventTime()")

    event_time = True

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _IntervalLogic(self, ctx, resume_state)


class _IntervalLogic(_StatefulLogic):
    """State: ``("__i", key) -> ([(t, left)...], [(t, right)...])`` plus the watermark. A
    left record is kept while ``t + upper_s >= watermark``, a right one while
    ``t - lower_s >= watermark``; the queue holds when each key has records to drop."""

    WM = "__watermark__"

    def routing_key(self, state_key):
        if isinstance(state_key, tuple) and len(state_key) == 2 and state_key[0] == "__i":
            return state_key[1]
        return _GLOBAL

    def __init__(self, spec: IntervalJoin, ctx: StepContext, resume_state: Any):
        super().__init__(spec, ctx, resume_state)
        self.watermark = self.state.get(self.WM, -math.inf)
        # One cleanup deadline per key, at the earliest time one of its records can go
        # (Flink registers a cleanup timer per record): when it passes, the key's records
        # are pruned and the next deadline is set.
        self._cleanup = KeyDeadlines()
        for k, v in self.state.items():
            if isinstance(k, tuple) and len(k) == 2 and k[0] == "__i":
                self._cleanup.schedule(k[1], self._next_due(v))

    def _next_due(self, sides) -> float:
        lo, hi = self.spec.lower_s, self.spec.upper_s
        return min(min((t + hi for t, _ in sides[LEFT]), default=math.inf),
                   min((t - lo for t, _ in sides[RIGHT]), default=math.inf))

    def snapshot(self):
        self.state.put(self.WM, self.watermark)
        return super().snapshot()

    def process(self, items, event_times):
        raise TypeError(f"step {self.ctx.step_id!r}: a join takes each batch with its side "
                        f"(process_input)")

    def process_side(self, index, items, event_times):
        spec, state = self.spec, self.state
        try:
            times = _times(spec.clock, items, event_times)
        except Exception as exc:  # noqa: BLE001 - user timestamp function
            return Output([], None, [self.dead(describe_exception(exc), items, "batch")])
        key_fn = spec.left_key if index == LEFT else spec.right_key
        lo, hi = spec.lower_s, spec.upper_s
        out, out_t, dead, late, late_t = [], [], [], [], []
        cache: dict = {}  # state key -> (its sides, the earliest time a new record can go)
        for rec, t in zip(rows(items), times.tolist()):
            if not math.isfinite(t):
                dead.append(self.dead(not_finite(t), rec))
                continue
            if t < self.watermark:
                late.append(rec)
                late_t.append(t)
                continue
            try:
                key = key_fn(rec)
                skey = ("__i", key)
                entry = cache.get(skey)
                if entry is None:
                    got = state.get(skey)
                    # the lists are changed in place and put back (snapshots copy them)
                    entry = cache[skey] = [([], []) if got is None else got, math.inf]
            except Exception as exc:  # noqa: BLE001 - user key function
                dead.append(self.dead(describe_exception(exc), rec))
                continue
            sides = entry[0]
            if index == LEFT:
                for tr, r in sides[RIGHT]:
                    if t + lo <= tr <= t + hi:
                        out.append((key, rec, r))
                        out_t.append(max(t, tr))
                sides[LEFT].append((t, rec))
                due = t + hi
            else:
                for tl, left in sides[LEFT]:
                    if tl + lo <= t <= tl + hi:
                        out.append((key, left, rec))
                        out_t.append(max(tl, t))
                sides[RIGHT].append((t, rec))
                due = t - lo
            if due < entry[1]:
                entry[1] = due
        for skey, (sides, due) in cache.items():
            state.put(skey, sides)
            self._cleanup.schedule(skey[1], due)
        self.touch(skey[1] for skey in cache)
        side = {"late": (late, np.asarray(late_t, dtype=np.float64))} if late else {}
        return self.with_expiry(
            Output(out, np.asarray(out_t, dtype=np.float64) if out else None, dead, side))

    def drop_key(self, key):
        self.state.delete(("__i", key))
        self._cleanup.drop(key)

    def on_tick(self, now):
        return self.with_expiry(None)

    def on_watermark(self, watermark):
        if watermark <= self.watermark:
            return self.with_expiry(None)
        self.watermark = watermark
        lo, hi = self.spec.lower_s, self.spec.upper_s
        # a record is dropped once nothing at or after the watermark can match it
        for key in list(self._cleanup.pop_until(np.nextafter(watermark, -math.inf))):
            skey = ("__i", key)
            sides = self.state.get(skey)
            if sides is None:
                continue
            lefts = [(t, r) for t, r in sides[LEFT] if t + hi >= watermark]
            rights = [(t, r) for t, r in sides[RIGHT] if t - lo >= watermark]
            if lefts or rights:
                self.state.put(skey, (lefts, rights))
                self._cleanup.schedule(key, self._next_due((lefts, rights)))
            else:
                self.state.delete(skey)
        return self.with_expiry(None)

    def on_end(self):
        return None
