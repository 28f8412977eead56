"""Keyed state per record: ``stateful_map`` (Bytewax's), and per key and batch:
``stateful_map_batches``. Pure logic, no Ray; the state lives in the step's state backend,
so it is checkpointed, restored and rescaled with the keys.

``fn(state, value) -> (state, output)``: ``state`` is None the first time a key is seen;
returning a state of None drops the key's state. Each record emits ``(key, output)``.

    >>> from rayflow.core.operators import StepContext
    >>> def running_sum(total, x):
    ...     total = (total or 0) + x
    ...     return (None if total >= 5 else total), total
    >>> logic = StatefulMap(running_sum, key_fn=lambda x: "k").build(StepContext("s", 0, 1))
    >>> logic.process([2, 2, 3, 1], None).items
    [('k', 2), ('k', 4), ('k', 7), ('k', 1)]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayflow.core.operators import (
    OperatorSpec,
    Output,
    StepContext,
    describe_exception,
    drop_positions,
)
from rayflow.core.records import rows
from rayflow.operators.keyed import TTL, _StatefulLogic, check_ttl

_DROPPED = object()  # a key whose state this batch dropped (in a cache)
_UNREAD = object()  # a key the batch's cache has not read from the state


@dataclass(frozen=True)
class StatefulMap(OperatorSpec):
    """``fn(state, value) -> (state, output)`` per record, with one state per key."""

    fn: Callable[[Any, Any], tuple[Any, Any]]
    key_fn: Callable[[Any], Any]
    ttl_s: float | None = None  # drop a key's state after this many seconds untouched

    def __post_init__(self):
        check_ttl(self.ttl_s)

    def build(self, ctx: StepContext, resume_state: Any = None):
        return _StatefulMapLogic(self, ctx, resume_state)


class _StatefulMapLogic(_StatefulLogic):
    """State: ``key -> state`` (the key itself is the state key)."""

    def process(self, items, event_times):
        fn, key_fn, state = self.spec.fn, self.spec.key_fn, self.state
        out, dead = [], []
        failed: list[int] = []  # positions of the records that went to dead letters
        # one backend read and write per key and batch (a dict state: none, in place)
        direct, cache, unread = self.batch_cache(_UNREAD)
        get, read = cache.get, state.get
        for i, rec in enumerate(rows(items)):
            try:
                key = key_fn(rec)
                cur = get(key, unread)
                if cur is _UNREAD:
                    cur = read(key)
                elif cur is _DROPPED:
                    cur = None
                result = fn(cur, rec)
                if not isinstance(result, tuple) or len(result) != 2:
                    raise TypeError(f"stateful_map's function must return (state, output), "
                                    f"got {result!r}")
                new, value = result
            except Exception as exc:  # noqa: BLE001 - user code
                dead.append(self.dead(describe_exception(exc), rec))
                failed.append(i)
                continue
            if new is not None:
                cache[key] = new
            elif direct is None:
                cache[key] = _DROPPED
            else:
                direct.pop(key, None)
            out.append((key, value))
        if direct is None:
            for key in [k for k, v in cache.items() if v is _DROPPED]:
                del cache[key]
                state.delete(key)
                if self.ttl_s is not None:
                    state.delete((TTL, key))
            state.put_many(cache)  # one call: a write batch on RocksDB
            self.touch(cache)
        times = None if event_times is None else np.asarray(event_times)
        return self.with_expiry(Output(out, drop_positions(times, failed), dead))

    def on_tick(self, now):
        return self.with_expiry(None)


@dataclass(frozen=True)
class StatefulMapBatches(StatefulMap):
    """``fn(state, values) -> (state, outputs)`` once per key and batch: ``values`` are the
    key's records of the batch, in order; each of ``outputs`` is emitted as ``(key, output)``
    (the fields are :class:`StatefulMap`'s, and so is the state).

        >>> from rayflow.core.operators import StepContext
        >>> def total(acc, xs):  # one running total per key, emitted once per batch
        ...     acc = (acc or 0) + sum(x for _, x in xs)
        ...     return acc, [acc]
        >>> spec = StatefulMapBatches(total, key_fn=lambda r: r[0])
        >>> logic = spec.build(StepContext("s", 0, 1))
        >>> logic.process([("a", 1), ("b", 5), ("a", 2)], None).items
        [('a', 3), ('b', 5)]
        >>> logic.process([("a", 4)], None).items
        [('a', 7)]
    """

    def build(self, ctx: StepContext, resume_state: Any = None):
        return _StatefulMapBatchesLogic(self, ctx, resume_state)


class _StatefulMapBatchesLogic(_StatefulLogic):
    """State: ``key -> state``, as ``stateful_map``'s (a step can change from one to the
    other and resume from the same savepoint). A batch groups its records by key, reads
    each key's state once, calls ``fn`` once per key and writes the state back once."""

    def process(self, items, event_times):
        fn, state = self.spec.fn, self.state
        groups, latest, dead = self._group(items, event_times)
        keys = list(groups)
        direct, _, _ = self.batch_cache(None)  # a dict state, written in place
        current = ([direct.get(k) for k in keys] if direct is not None
                   else state.get_many(keys))  # (every key is read: one call)
        out: list = []
        out_t: list = []
        writes: dict = {}
        dropped: list = []
        for key, cur in zip(keys, current):
            values = groups[key]
            try:
                result = fn(cur, values)
                if not isinstance(result, tuple) or len(result) != 2:
                    raise TypeError(f"stateful_map_batches's function must return (state, "
                                    f"outputs), got {result!r}")
                new, outputs = result
                outputs = () if outputs is None else list(outputs)
            except Exception as exc:  # noqa: BLE001 - user code
                reason = describe_exception(exc)
                dead += [self.dead(reason, rec) for rec in values]
                continue
            if direct is not None:
                if new is None:
                    direct.pop(key, None)
                else:
                    direct[key] = new
            elif new is not None:
                writes[key] = new
            elif cur is not None:
                dropped.append(key)
            if outputs:
                out += [(key, o) for o in outputs]
                if latest is not None:
                    out_t += [latest[key]] * len(outputs)
        for key in dropped:
            state.delete(key)
            if self.ttl_s is not None:
                state.delete((TTL, key))
        if writes:
            state.put_many(writes)  # one call: a write batch on RocksDB
            self.touch(writes)
        times = None if latest is None else np.asarray(out_t, dtype=np.float64)
        return self.with_expiry(Output(out, times, dead))

    def on_tick(self, now):
        return self.with_expiry(None)

    def _group(self, items: Any, event_times: Any) -> tuple[dict, dict | None, list]:
        """A batch's records by key: ``(groups, latest, dead)``, where ``groups`` maps each
        key to its records in order (keys in the order of their first record), ``latest``
        each key to the latest event time of its records (None without times), and
        ``dead`` holds a dead letter per record whose key could not be made."""
        key_fn, dead = self.spec.key_fn, []
        groups: dict = {}
        if event_times is None:
            for rec in rows(items):
                try:
                    key = key_fn(rec)
                    group = groups.get(key)
                except Exception as exc:  # noqa: BLE001 - user code (or an unhashable key)
                    dead.append(self.dead(describe_exception(exc), rec))
                    continue
                if group is None:
                    groups[key] = [rec]
                else:
                    group.append(rec)
            return groups, None, dead
        latest: dict = {}
        for rec, t in zip(rows(items), np.asarray(event_times, np.float64).tolist()):
            try:
                key = key_fn(rec)
                group = groups.get(key)
            except Exception as exc:  # noqa: BLE001
                dead.append(self.dead(describe_exception(exc), rec))
                continue
            if group is None:
                groups[key] = [rec]
                latest[key] = t
            else:
                group.append(rec)
                if t > latest[key]:
                    latest[key] = t
        return groups, latest, dead
