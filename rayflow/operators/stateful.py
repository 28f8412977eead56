"""Keyed state per record: ``stateful_map`` (Bytewax's). Pure logic, no Ray; the state lives in
the step's state backend, so it is checkpointed, restored and rescaled with the keys.

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
