"""Keyed state for stateful operators: the step's backend, checkpointed and rescaled by
key, with optional expiry (``ttl_s``). Windows, joins, ``process``, ``stateful_map`` and
lookups build on :class:`_StatefulLogic`. Pure: no Ray."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from rayflow.core.operators import Logic, Output, Rescaled, StepContext, owns
from rayflow.operators.queues import WindowQueue
from rayflow.state.backends import MemoryBackend


def check_ttl(ttl_s: Any) -> None:
    """``ttl_s`` is None or a number of seconds > 0."""
    if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float))
                              or not ttl_s > 0 or not math.isfinite(ttl_s)):
        raise ValueError(f"ttl_s must be a number of seconds > 0 or None, got {ttl_s!r}")


TTL = "__ttl"


class _StatefulLogic(Logic):
    """Keyed state in the step's backend, checkpointed and rescaled by key, with optional
    state expiry: with ``spec.ttl_s`` set, the time each key was last touched is kept in the
    backend as ``("__ttl", key) -> t`` and a queue ordered by expiry time says which keys to
    look at, so expiry costs what expires. A subclass says what a key's state is in
    :meth:`drop_key`."""

    def __init__(self, spec: Any, ctx: StepContext, resume_state: Any):
        super().__init__(ctx)
        self.spec = spec
        backend = ctx.state_backend or MemoryBackend()
        if isinstance(resume_state, Rescaled):
            self.state = backend.open(ctx.step_id, ctx.instance, ctx.job_name)
            self._merge_rescaled(backend, resume_state)
        else:
            self.state = backend.open(ctx.step_id, ctx.instance, ctx.job_name, resume_state)
        self.ttl_s: float | None = getattr(spec, "ttl_s", None)
        self.now: Callable[[], float] = time.time  # the clock of ttl_s (tests replace it)
        self._expiry = WindowQueue()
        self._queued: set = set()  # keys with an entry in _expiry
        if self.ttl_s is not None:
            for k, t in self.state.items():
                if _is_ttl(k):
                    self._expiry.push(t + self.ttl_s, k[1], None)
                    self._queued.add(k[1])

    def batch_cache(self, unread: Any) -> tuple[dict | None, dict, Any]:
        """Where a batch keeps the state of its keys: ``(direct, cache, absent)``.

        A dict state (and no ``ttl_s``, whose touches need the batch's keys) is updated in
        place: ``direct`` and ``cache`` are the state's own dict, and a key it lacks has no
        state (``absent`` is None). Any other state goes through a fresh ``cache`` of the
        batch's keys, written back once (``direct`` is None), where a key it lacks is still
        to be read (``absent`` is ``unread``)."""
        direct = self.state.direct_dict() if self.ttl_s is None else None
        if direct is None:
            return None, {}, unread
        return direct, direct, None

    # -- time to live ----------------------------------------------------------------------
    def touch(self, keys: Any) -> None:
        """Records of ``keys`` arrived now: their state lives another ``ttl_s``."""
        if self.ttl_s is None:
            return
        now, state, queued = self.now(), self.state, self._queued
        for key in keys:
            state.put((TTL, key), now)
            if key not in queued:
                queued.add(key)
                self._expiry.push(now + self.ttl_s, key, None)

    def expire(self) -> int:
        """Remove the state of every key untouched for ``ttl_s``; how many keys went."""
        if self.ttl_s is None or self._expiry.peek() > (now := self.now()):
            return 0
        n, ttl, state = 0, self.ttl_s, self.state
        for _, key, _ in self._expiry.pop_until(now):
            last = state.get((TTL, key))
            if last is None:
                self._queued.discard(key)
            elif last + ttl > now:  # touched since it was queued: look again later
                self._expiry.push(last + ttl, key, None)
            else:
                self.drop_key(key)
                state.delete((TTL, key))
                self._queued.discard(key)
                n += 1
        return n

    def process_input(self, index: int, items: Any, event_times: Any) -> Output:
        """A batch, as the runtime hands it over. A key whose time to live has run out is
        removed before the batch reads it, not only after the batch or at the next tick, so
        an expired value is never seen (Flink's ``NeverReturnExpired``): its key starts
        afresh."""
        n = self.expire()
        out = self.process_side(index, items, event_times)
        if n:
            out.expired += n
        return out

    def process_side(self, index: int, items: Any, event_times: Any) -> Output:
        """The batch of input ``index`` (one-input steps: :meth:`process`)."""
        return self.process(items, event_times)

    def with_expiry(self, out: Output | None) -> Output | None:
        """``out`` with the keys expired now counted in it."""
        n = self.expire()
        if not n:
            return out
        if out is None:
            return Output([], None, expired=n)
        out.expired += n
        return out

    def drop_key(self, key: Any) -> None:
        """Delete every state entry of ``key`` (its time to live ran out)."""
        self.state.delete(key)

    def _merge_rescaled(self, backend, resumed: Rescaled) -> None:
        """Take the keys this instance owns from every old instance's snapshot; instance-wide
        values (watermarks) take the most advanced old value."""
        for old, handle in enumerate(resumed.handles):
            if handle is None:
                continue
            src = backend.open(self.ctx.step_id, old, self.ctx.job_name, handle)
            for k, v in src.items():
                part = self.owned_part(k, v)
                if part is not _WHOLE:  # an entry of many keys: the part of this instance's
                    if part is not None:
                        cur = self.state.get(k)
                        self.state.put(k, part if cur is None else self.join_parts(k, cur, part))
                    continue
                route = k[1] if _is_ttl(k) else self.routing_key(k)
                if route is _GLOBAL:
                    cur = self.state.get(k)
                    self.state.put(k, v if cur is None else max(cur, v))
                elif owns(route, self.ctx):
                    self.state.put(k, v)
            src.close()

    def routing_key(self, state_key: Any) -> Any:
        return state_key

    def owned_part(self, state_key: Any, value: Any) -> Any:
        """For a state entry that holds the values of many keys (a window kept as columns),
        the part of it that this instance owns after a rescale (None: no part); ``_WHOLE``
        (the default) for an entry of one key, which :meth:`routing_key` routes whole."""
        return _WHOLE

    def join_parts(self, state_key: Any, a: Any, b: Any) -> Any:
        """Two old instances' parts of the entry ``state_key`` (see :meth:`owned_part`)."""
        raise NotImplementedError(f"no way to join two parts of {state_key!r}")

    def snapshot(self) -> Any:
        # a fresh name per snapshot: a restored job must never overwrite the files of the
        # checkpoint it was restored from
        return self.state.snapshot(time.time_ns())

    def discard(self, handle: Any) -> None:
        self.state.discard(handle)

    def close(self) -> None:
        self.state.close()


_GLOBAL = object()
_WHOLE = object()  # (see _StatefulLogic.owned_part)


def _is_ttl(state_key: Any) -> bool:
    return isinstance(state_key, tuple) and len(state_key) == 2 and state_key[0] == TTL
