"""Lookups: join a stream with a table that changes, or with an external service. Pure logic,
no Ray.

- :class:`LookupJoin` (``stream.lookup_join(step_id, table)``): the second input is a
  changelog stream, each of its records the new value of its key (an upsert). Each record of
  the first input is emitted as ``(key, record, value)`` with its key's value:

  - on processing time (``ProcessingTime()``, the default; Quix's lookup join): the latest
    value that has arrived when the record is processed;
  - on event time (``EventTime()``; Flink's event-time temporal join): the value *as of the
    record's event time*, the table record with the largest event time at or before it. A
    record waits until the table input's watermark passes its time, so every table version
    up to it has arrived: the output does not depend on how the two inputs interleave. (A
    record is emitted as soon as the table's watermark has passed it, without waiting for the
    stream's: with a static table, from its end on, every record joins as it comes. A table
    record behind the table's own watermark is late, as behind the step's.)

  ``how="inner"`` drops records whose key has no value yet; ``"left"`` emits them with
  ``None``. The table and the waiting records live in the state backend (checkpointed,
  restored, rescaled by key); on event time a key keeps only the versions that records at or
  after the watermark can still need.
- :class:`EnrichCached` (``stream.enrich_cached(step_id, fn, ttl_s)``): ``fn(key)`` looks a
  value up elsewhere (a database, a service) and each record is emitted as ``(key, record,
  value)``; values are cached per key for ``ttl_s`` seconds. With ``batch=True``, ``fn``
  gets the list of the batch's keys that are not cached (each once, in order of first
  appearance) and returns their values as a list in the same order or as a dict. The cache
  is not state: after a restore lookups start afresh.

    >>> from rayflow.core.operators import StepContext
    >>> j = LookupJoin(key_fn=lambda r: r[0], table_key=lambda r: r[0]).build(
    ...     StepContext("j", 0, 1))
    >>> _ = j.process_input(1, [("eur", 1.1)], None)
    >>> j.process_input(0, [("eur", 10), ("usd", 5)], None).items
    [('eur', ('eur', 10), ('eur', 1.1))]
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rayflow.core.operators import Logic, OperatorSpec, Output, StepContext, describe_exception
from rayflow.core.records import num_rows, rows
from rayflow.operators.keyed import _GLOBAL, _StatefulLogic, check_ttl
from rayflow.operators.queues import KeyDeadlines, WindowQueue
from rayflow.operators.windows.clocks import EventTime, ProcessingTime, _times, not_finite

STREAM, TABLE = 0, 1
_TABLE, _WAITING = "__t", "__l"


@dataclass(frozen=True)
class LookupJoin(OperatorSpec):
    """Join each record with its key's value in a changelog stream (see the module).

    Args:
        key_fn: the stream's key function; table_key: the table's.
        how: ``inner`` or ``left``.
        clock: ProcessingTime() (latest value) or EventTime() (value as of the record's
            time; both inputs need watermarks).
        ttl_s: remove a key's value (and waiting records) after this many seconds without a
            record of it on either input.
    """

    key_fn: Callable[[Any], Any]
    table_key: Callable[[Any], Any]
    how: Literal["inner", "left"] = "inner"
    clock: ProcessingTime | EventTime = ProcessingTime()
    ttl_s: float | None = None

    def __post_init__(self):
        check_ttl(self.ttl_s)
        if self.how not in ("inner", "left"):
            raise ValueError(f"lookup_join: how must be 'inner' or 'left', got {self.how!r}")
        if not isinstance(self.clock, (ProcessingTime, EventTime)):
            raise ValueError(f"lookup_join: clock must be ProcessingTime() or EventTime(), "
                             f"got {self.clock!r}")

    @property
    def event_time(self) -> bool:
        return isinstance(self.clock, EventTime)

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _LookupLogic(self, ctx, resume_state)


class _LookupLogic(_StatefulLogic):
    """State: ``("__t", key) ->`` the key's value (processing time) or its versions
    ``((t, record), ...)`` in time order (event time); ``("__l", key) -> ((t, record), ...)``
    the records waiting for the watermark; the watermark."""

    WM = "__watermark__"
    TABLE_WM = "__table_watermark__"

    def routing_key(self, state_key):
        if isinstance(state_key, tuple) and len(state_key) == 2 and state_key[0] in (
                _TABLE, _WAITING):
            return state_key[1]
        return _GLOBAL

    def __init__(self, spec: LookupJoin, ctx: StepContext, resume_state: Any):
        super().__init__(spec, ctx, resume_state)
        self.event_time = spec.event_time
        self.watermark = self.state.get(self.WM, -math.inf)
        # the table input's own watermark; a stream record before it has every table
        # version it can join and is emitted at once. Checkpointed with the step's, so that
        # a table record replayed after a restore is late exactly when it was the first time
        # (before its upstream instances announce their watermarks again)
        self.table_watermark = self.state.get(self.TABLE_WM, -math.inf)
        # one deadline per key with waiting records, at the earliest of their times (set
        # again for what is left when it passes)
        self.waiting = KeyDeadlines()
        for k, v in self.state.items():
            if isinstance(k, tuple) and len(k) == 2 and k[0] == _WAITING and v:
                self.waiting.schedule(k[1], min(t for t, _ in v))

    def snapshot(self):
        self.state.put(self.WM, self.watermark)
        self.state.put(self.TABLE_WM, self.table_watermark)
        return super().snapshot()

    def drop_key(self, key):
        self.state.delete((_TABLE, key))
        self.state.delete((_WAITING, key))
        self.waiting.drop(key)

    def process(self, items, event_times):
        raise TypeError(f"step {self.ctx.step_id!r}: a lookup join takes each batch with its "
                        f"input (process_input)")

    def process_side(self, index, items, event_times):
        spec = self.spec
        if self.event_time:
            try:
                times = _times(spec.clock, items, event_times)
            except Exception as exc:  # noqa: BLE001 - user timestamp function
                return Output([], None, [self.dead(describe_exception(exc), items, "batch")])
        else:
            times = None if event_times is None else np.asarray(event_times, np.float64)
        key_fn = spec.key_fn if index == STREAM else spec.table_key
        keys, recs, ts, dead = [], [], [], []
        for i, rec in enumerate(rows(items)):
            if times is not None and self.event_time and not math.isfinite(times[i]):
                dead.append(self.dead(not_finite(float(times[i])), rec))
                continue
            try:
                key = key_fn(rec)
                hash(key)  # (a key that cannot be one, a list..., is the record's error)
                keys.append(key)
            except Exception as exc:  # noqa: BLE001 - user key function
                dead.append(self.dead(describe_exception(exc), rec))
                continue
            recs.append(rec)
            ts.append(None if times is None else float(times[i]))
        if self.event_time:
            out = self._event_time(index, keys, recs, ts)
        else:
            out = self._processing_time(index, keys, recs, ts)
        out.dead.extend(dead)
        if self.ttl_s is not None:
            self.touch(dict.fromkeys(keys))
        return self.with_expiry(out)

    def _processing_time(self, index, keys, recs, ts) -> Output:
        state = self.state
        if index == TABLE:
            latest = dict(zip(keys, recs))  # the last record of a key in the batch wins
            for key, rec in latest.items():
                state.put((_TABLE, key), rec)
            return Output([], None)
        cache: dict = {}
        out, out_t = [], []
        inner = self.spec.how == "inner"
        for key, rec, t in zip(keys, recs, ts):
            if key not in cache:
                cache[key] = state.get((_TABLE, key))
            value = cache[key]
            if value is None and inner:
                continue
            out.append((key, rec, value))
            out_t.append(t)
        times = None if not out or out_t[0] is None else np.asarray(out_t, np.float64)
        return Output(out, times)

    def _event_time(self, index, keys, recs, ts) -> Output:
        state, wm = self.state, self.watermark
        late, late_t = [], []
        cache: dict = {}
        what = _TABLE if index == TABLE else _WAITING
        ready, ready_t = [], []  # stream records whose table is final up to their time
        table_wm = self.table_watermark
        # a table record behind the table's watermark is late: records may have joined
        # without it (what is kept of the versions still follows the step's watermark)
        late_below = max(wm, table_wm) if index == TABLE else wm
        if index == TABLE:
            table_wm = -math.inf
        for key, rec, t in zip(keys, recs, ts):
            if t < late_below:
                late.append(rec)
                late_t.append(t)
                continue
            if t < table_wm:
                ready.append((key, rec))
                ready_t.append(t)
                continue
            skey = (what, key)
            got = cache.get(skey)
            if got is None:
                got = cache[skey] = list(state.get(skey) or ())
            if index == TABLE:
                # versions in time order; an equal time: the later arrival wins (goes after)
                got.insert(bisect.bisect_right([v[0] for v in got], t), (t, rec))
            else:
                got.append((t, rec))
        for (what_, key), got in cache.items():
            if what_ == _TABLE:
                got = _prune(got, wm)
            else:
                self.waiting.schedule(key, min(t for t, _ in got))
            state.put((what_, key), tuple(got))
        side: dict[str, tuple[Any, np.ndarray | None]] = (
            {"late": (late, np.asarray(late_t, dtype=np.float64))} if late else {})
        out, out_t = self._join_now(ready, ready_t)
        return Output(out, np.asarray(out_t, np.float64) if out else None, [], side)

    def _join_now(self, ready: list, ready_t: list) -> tuple[list, list]:
        """``(key, record, value)`` of stream records ``(key, record)`` at times
        ``ready_t``, each before the table's watermark: its value as of its time is final."""
        out: list = []
        out_t: list = []
        if not ready:
            return out, out_t
        inner, get = self.spec.how == "inner", self.state.get
        tables: dict = {}  # key -> (versions, their times)
        for (key, rec), t in zip(ready, ready_t):
            got = tables.get(key)
            if got is None:
                versions = get((_TABLE, key)) or ()
                got = tables[key] = (versions, [v[0] for v in versions])
            versions, vt = got
            i = bisect.bisect_right(vt, t)
            value = versions[i - 1][1] if i else None
            if value is None and inner:
                continue
            out.append((key, rec, value))
            out_t.append(t)
        return out, out_t

    def on_input_watermark(self, index, watermark):
        if not self.event_time or index != TABLE or watermark <= self.table_watermark:
            return None
        self.table_watermark = watermark
        if watermark <= self.watermark:
            return None  # the step's own watermark has released those records already
        return self._fire(watermark, prune_at=self.watermark)

    def on_watermark(self, watermark):
        if not self.event_time or watermark <= self.watermark:
            return self.with_expiry(None)
        self.watermark = watermark
        return self.with_expiry(self._fire(watermark))

    def on_tick(self, now):
        return self.with_expiry(None)

    def on_end(self):
        if not self.event_time:
            return None
        self.watermark = math.inf
        return self._fire(math.inf)

    def _fire(self, watermark: float, prune_at: float | None = None) -> Output:
        """Emit the waiting records before ``watermark``: no table version at or before
        their time can arrive any more. The versions a record from ``prune_at`` on (the
        step's watermark; ``watermark`` by default) can still need are kept."""
        state, inner = self.state, self.spec.how == "inner"
        prune_at = watermark if prune_at is None else prune_at
        out, out_t = [], []
        below = watermark if watermark == math.inf else np.nextafter(watermark, -math.inf)
        for key in self.waiting.pop_until(below):
            waiting = state.get((_WAITING, key))
            if not waiting:
                continue
            versions = state.get((_TABLE, key)) or ()
            vt = [v[0] for v in versions]
            keep = []
            for t, rec in sorted(waiting, key=lambda w: w[0]):
                if t >= watermark:
                    keep.append((t, rec))
                    continue
                i = bisect.bisect_right(vt, t)
                value = versions[i - 1][1] if i else None
                if value is None and inner:
                    continue
                out.append((key, rec, value))
                out_t.append(t)
            if keep:
                state.put((_WAITING, key), tuple(keep))
                self.waiting.schedule(key, keep[0][0])  # (sorted: the earliest left)
            else:
                state.delete((_WAITING, key))
            if versions:
                state.put((_TABLE, key), tuple(_prune(list(versions), prune_at)))
        return Output(out, np.asarray(out_t, np.float64) if out else None)


def _prune(versions: list, watermark: float) -> list:
    """The versions a record at or after ``watermark`` can still need: those from the
    watermark on, and the last one before it."""
    i = bisect.bisect_left([v[0] for v in versions], watermark)
    return versions[max(0, i - 1):]


# -- external lookups with a cache -----------------------------------------------------------

@dataclass(frozen=True)
class EnrichCached(OperatorSpec):
    """``(key, record, fn(key))`` per record, ``fn``'s values cached per key for ``ttl_s``.

    Args:
        fn: key -> value; with ``batch=True``, list of keys -> list of values (same order)
            or dict key -> value.
        key_fn: the stream's key function.
        ttl_s: how long a looked-up value is used before ``fn`` is asked again.
        batch: whether ``fn`` takes a list of keys.
    """

    fn: Callable[[Any], Any]
    key_fn: Callable[[Any], Any]
    ttl_s: float
    batch: bool = False

    def __post_init__(self):
        if self.ttl_s is None:
            raise ValueError("enrich_cached: ttl_s is required (how long a value is cached)")
        check_ttl(self.ttl_s)
        if not callable(self.fn):
            raise ValueError(f"enrich_cached: fn must be callable, got {self.fn!r}")
        if not isinstance(self.batch, bool):
            raise ValueError(f"enrich_cached: batch must be True or False, got {self.batch!r}")

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _EnrichLogic(self, ctx)


class _EnrichLogic(Logic):
    def __init__(self, spec: EnrichCached, ctx: StepContext):
        super().__init__(ctx)
        self.spec = spec
        self.now: Callable[[], float] = time.time  # tests replace it
        self.cache: dict = {}  # key -> (value, fetched at)
        self.expiry = WindowQueue()
        self.lookups = 0  # calls of fn (one per key, or one per batch with batch=True)

    def _evict(self) -> int:
        now, n = self.now(), 0
        for _, key, fetched in self.expiry.pop_until(now):
            got = self.cache.get(key)
            if got is not None and got[1] == fetched:  # not refreshed since
                del self.cache[key]
                n += 1
        return n

    def _lookup(self, missing: list) -> tuple[dict, dict]:
        """Values of ``missing`` keys, and the error of each key that failed."""
        fn = self.spec.fn
        values: dict = {}
        errors: dict = {}
        if not missing:
            return values, errors
        if self.spec.batch:
            self.lookups += 1
            try:
                got = fn(list(missing))
                if isinstance(got, dict):
                    values = {k: got[k] for k in missing if k in got}
                    errors = {k: f"enrich_cached: fn's dict has no value for key {k!r}"
                              for k in missing if k not in got}
                else:
                    got = list(got)
                    if len(got) != len(missing):
                        raise ValueError(f"enrich_cached: fn returned {len(got)} values for "
                                         f"{len(missing)} keys")
                    values = dict(zip(missing, got))
            except Exception as exc:  # noqa: BLE001 - user code
                errors = {k: describe_exception(exc) for k in missing}
            return values, errors
        for k in missing:
            self.lookups += 1
            try:
                values[k] = fn(k)
            except Exception as exc:  # noqa: BLE001 - user code
                errors[k] = describe_exception(exc)
        return values, errors

    def process(self, items, event_times):
        expired = self._evict()
        key_fn, cache, dead = self.spec.key_fn, self.cache, []
        keyed = []
        for i, rec in enumerate(rows(items)):
            try:
                key = key_fn(rec)
                hash(key)  # (a key that cannot be one, a list..., is the record's error)
                keyed.append((i, key, rec))
            except Exception as exc:  # noqa: BLE001 - user key function
                dead.append(self.dead(describe_exception(exc), rec))
        missing = list(dict.fromkeys(k for _, k, _ in keyed if k not in cache))
        values, errors = self._lookup(missing)
        now = self.now()
        for k, v in values.items():
            cache[k] = (v, now)
            self.expiry.push(now + self.spec.ttl_s, k, now)
        out, keep = [], []
        for i, key, rec in keyed:
            if key in errors:
                dead.append(self.dead(errors[key], rec, "lookup"))
                continue
            out.append((key, rec, cache[key][0]))
            keep.append(i)
        times = None if event_times is None or num_rows(items) == 0 else \
            np.asarray(event_times, np.float64)[keep]
        return Output(out, times, dead, expired=expired)

    def on_tick(self, now):
        n = self._evict()
        return Output([], None, expired=n) if n else None
