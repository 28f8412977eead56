"""Keyed process functions with state and timers (Flink's ``KeyedProcessFunction``). Pure
logic, no Ray; the per-key value state and the timers live in the step's state backend, so
they are checkpointed, restored and rescaled with the keys, and a timer registered before a
failure fires after the restore.

``stream.key_by(...).process(step_id, fn)`` calls, per record, ``fn.process_element(value,
ctx)``, and per due timer ``fn.on_timer(key, ts, ctx)``. Both may ``yield`` (or return an
iterable of) output records; None emits nothing. ``fn`` is one of:

- an object with ``process_element`` and, if it registers timers, ``on_timer`` (subclass
  :class:`KeyedProcessFunction`; its ``open(step_context)`` and ``close()`` are called too);
- a pair ``(process_element, on_timer)`` of callables;
- a single callable, used as ``process_element`` (no timers).

The context (:class:`ProcessContext`) gives ``ctx.key``, ``ctx.timestamp`` (the record's
event time, or the timer's time), ``ctx.state`` (the key's :class:`ValueState`:
``value()``, ``update(v)``, ``clear()``) and ``ctx.timers`` (:class:`TimerService`:
``register(event_time=...)`` / ``register(processing_time=...)`` / ``delete(...)``,
``current_watermark()``, ``current_processing_time()``).

Event-time timers fire when the watermark reaches them (``ts <= watermark``), in time order,
and all of them at end of stream; processing-time timers fire on the wall clock, checked as
time passes (``on_tick``) and after each batch. A timer is kept once per (key, domain, time).
Outputs of ``process_element`` carry the record's event time, outputs of an event-time timer
its time (a processing-time timer's is the wall-clock time it was due at).

    >>> from rayflow.core.operators import StepContext
    >>> class Timeout(KeyedProcessFunction):
    ...     def process_element(self, value, ctx):
    ...         ctx.state.update((ctx.state.value() or 0) + 1)
    ...         ctx.timers.register(event_time=ctx.timestamp + 10)
    ...     def on_timer(self, key, ts, ctx):
    ...         yield (key, ts, ctx.state.value())
    ...         ctx.state.clear()
    >>> logic = Process(Timeout(), key_fn=lambda r: r[0]).build(StepContext("p", 0, 1))
    >>> _ = logic.process([("a", 1.0), ("a", 2.0)], np.array([1.0, 2.0]))
    >>> logic.on_watermark(11.5).items
    [('a', 11.0, 2)]
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayflow.core.operators import Output, StepContext, describe_exception
from rayflow.core.records import rows
from rayflow.operators.keyed import _GLOBAL, _StatefulLogic, check_ttl

EVENT_TIME, PROCESSING_TIME = "event_time", "processing_time"
_VALUE, _TIMERS = "__v", "__tm"
_UNREAD = object()  # a key's value not read from the state in this call yet


class KeyedProcessFunction:
    """Base class of a process function (all methods optional but ``process_element``)."""

    def open(self, ctx: StepContext) -> None:
        """Called once per instance before the first record."""

    def process_element(self, value: Any, ctx: ProcessContext) -> Iterable | None:
        raise NotImplementedError

    def on_timer(self, key: Any, ts: float, ctx: ProcessContext) -> Iterable | None:
        """A timer of ``key`` at ``ts`` fired (``ctx.time_domain`` says which clock)."""
        return None

    def close(self) -> None:
        """Called when the instance ends."""


class TimerQueue:
    """Timers of one time domain: each (key, time) once, popped in time order (ties by key
    text, for a deterministic order). Deleting is O(1): a deleted timer's heap entry is
    skipped when it comes up.

        >>> q = TimerQueue()
        >>> for key, ts in [("b", 5.0), ("a", 5.0), ("a", 2.0)]:
        ...     _ = q.register(key, ts)
        >>> q.register("a", 2.0)  # already there
        False
        >>> q.delete("b", 5.0)
        True
        >>> list(q.pop_until(5.0)), len(q)
        ([(2.0, 'a'), (5.0, 'a')], 0)
    """

    def __init__(self) -> None:
        self._heap: list = []
        self._live: set = set()  # (ts, key)
        self._n = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, timer: tuple[float, Any]) -> bool:
        return timer in self._live

    def register(self, key: Any, ts: float) -> bool:
        """Add the timer; False if it was there already."""
        timer = (ts, key)
        if timer in self._live:
            return False
        self._live.add(timer)
        heapq.heappush(self._heap, (ts, str(key), self._n, key))
        self._n += 1
        return True

    def due(self, t: float) -> bool:
        """Whether a timer (live or deleted) is at or before ``t``: if not, none is due."""
        return bool(self._heap) and self._heap[0][0] <= t

    def delete(self, key: Any, ts: float) -> bool:
        """Remove the timer; False if there was none."""
        if (ts, key) not in self._live:
            return False
        self._live.discard((ts, key))
        return True

    def peek(self) -> float:
        """Time of the next live timer (inf if none)."""
        heap = self._heap
        while heap and (heap[0][0], heap[0][3]) not in self._live:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def pop_until(self, t: float):
        """``(ts, key)`` of every live timer with ``ts <= t``, in order, each removed as it is
        yielded; timers registered meanwhile at or before ``t`` come out too."""
        heap, live, pop = self._heap, self._live, heapq.heappop
        while heap and heap[0][0] <= t:
            ts, _, _, key = pop(heap)
            timer = (ts, key)
            if timer in live:  # else deleted: its entry is dropped here
                live.discard(timer)
                yield timer


class ValueState:
    """The value state of the current key (Flink's ``ValueState``): it follows the key of the
    call it was handed to, as Flink's does."""

    __slots__ = ("_logic", "_key", "_values")

    def __init__(self, logic: _ProcessLogic, key: Any = None):
        self._logic, self._key = logic, key
        self._values = logic._values  # the instance's values of this call (one dict)

    def value(self, default: Any = None) -> Any:
        """The key's value, or ``default`` if it has none."""
        key = self._key
        v = self._values.get(key, _UNREAD)
        if v is _UNREAD:
            v = self._logic._value(key)
        return default if v is None else v

    def update(self, value: Any) -> None:
        """Set the key's value (None clears it)."""
        self._values[self._key] = value

    def clear(self) -> None:
        self._values[self._key] = None


class TimerService:
    """The current key's timers (Flink's ``TimerService``)."""

    __slots__ = ("_logic", "_key")

    def __init__(self, logic: _ProcessLogic, key: Any = None):
        self._logic, self._key = logic, key

    def register(self, *, event_time: float | None = None,
                 processing_time: float | None = None) -> None:
        """Fire ``on_timer`` when the watermark reaches ``event_time``, or the wall clock
        reaches ``processing_time`` (seconds since the epoch). Exactly one of the two."""
        if processing_time is None and event_time.__class__ is float \
                and event_time == event_time:  # the usual call (a float, not NaN)
            self._logic._register_event(self._key, event_time)
            return
        domain, ts = _which(event_time, processing_time, "register")
        self._logic._register(self._key, domain, ts)

    def delete(self, *, event_time: float | None = None,
               processing_time: float | None = None) -> None:
        """Remove a timer registered with the same time (no error if there is none)."""
        domain, ts = _which(event_time, processing_time, "delete")
        self._logic._delete(self._key, domain, ts)

    def current_watermark(self) -> float:
        return self._logic.watermark

    def current_processing_time(self) -> float:
        return self._logic.now()


def _which(event_time: Any, processing_time: Any, what: str) -> tuple[str, float]:
    if (event_time is None) == (processing_time is None):
        raise ValueError(f"timers.{what}() takes exactly one of event_time= or "
                         f"processing_time=")
    domain, ts = (EVENT_TIME, event_time) if event_time is not None else (PROCESSING_TIME,
                                                                          processing_time)
    if isinstance(ts, bool) or not isinstance(ts, (int, float, np.floating, np.integer)) \
            or math.isnan(ts):
        raise ValueError(f"timers.{what}(): {domain} must be a number of seconds, got {ts!r}")
    return domain, float(ts)


@dataclass(slots=True)
class ProcessContext:
    """What ``process_element`` and ``on_timer`` see of the current key. As Flink's, it is
    valid for the call it is handed to: an instance keeps one, set to each record's key and
    time in turn, and so do its ``state`` and ``timers``."""

    key: Any
    timestamp: float | None
    state: ValueState
    timers: TimerService
    time_domain: str | None = None  # in on_timer: "event_time" or "processing_time"


@dataclass(frozen=True)
class Process:
    """A keyed process function as a step (see the module docstring).

    Args:
        fn: an object with ``process_element`` (and ``on_timer``), a pair of callables, or
            one callable.
        key_fn: record -> key (the stream's ``key_by`` function).
        ttl_s: remove a key's value state and timers after this many seconds without a
            record of it (processing time); None: keep them.
    """

    fn: Any
    key_fn: Callable[[Any], Any]
    ttl_s: float | None = None

    def __post_init__(self):
        check_ttl(self.ttl_s)
        _callables(self.fn)

    def build(self, ctx: StepContext, resume_state: Any = None) -> _ProcessLogic:
        return _ProcessLogic(self, ctx, resume_state)


def _callables(fn: Any) -> tuple[Callable, Callable | None, Any]:
    """(process_element, on_timer, the object with open/close or None)."""
    if hasattr(fn, "process_element"):
        on_timer = getattr(fn, "on_timer", None)
        return fn.process_element, on_timer, fn
    if isinstance(fn, tuple):
        if len(fn) != 2 or not all(callable(f) for f in fn):
            raise ValueError(f"process: a tuple fn must be (process_element, on_timer), two "
                             f"callables; got {fn!r}")
        return fn[0], fn[1], None
    if callable(fn):
        return fn, None, None
    raise ValueError(f"process: fn must have process_element(value, ctx), or be a pair of "
                     f"callables or one callable; got {fn!r}")


class _ProcessLogic(_StatefulLogic):
    """State: ``("__v", key) -> value``, ``("__tm", key) -> ((domain, ts), ...)`` and the
    watermark. The timer queues are built from the state at start (restore, rescale); the
    queues are the timers' truth while the instance runs, and the state gets them at each
    snapshot."""

    WM = "__watermark__"

    def routing_key(self, state_key):
        if isinstance(state_key, tuple) and len(state_key) == 2 and state_key[0] in (
                _VALUE, _TIMERS):
            return state_key[1]
        return _GLOBAL

    def __init__(self, spec: Process, ctx: StepContext, resume_state: Any):
        super().__init__(spec, ctx, resume_state)
        self._element, self._on_timer, self._obj = _callables(spec.fn)
        self.watermark = self.state.get(self.WM, -math.inf)
        self.queues = {EVENT_TIME: TimerQueue(), PROCESSING_TIME: TimerQueue()}
        self._event_queue = self.queues[EVENT_TIME]
        self._by_key: dict = {}  # key -> {(domain, ts)}: the live timers
        for k, v in self.state.items():
            if isinstance(k, tuple) and len(k) == 2 and k[0] == _TIMERS:
                for domain, ts in v:
                    self.queues[domain].register(k[1], ts)
                self._by_key[k[1]] = set(v)
        self._values: dict = {}  # written back to the backend after each call from the host
        self._context = ProcessContext(None, None, ValueState(self), TimerService(self))
        self._timers_dirty: set = set()
        self._touched: dict = {}

    def open(self):
        if self._obj is not None and hasattr(self._obj, "open"):
            self._obj.open(self.ctx)

    def close(self):
        if self._obj is not None and hasattr(self._obj, "close"):
            self._obj.close()
        super().close()

    # -- state behind the context ---------------------------------------------------------
    def _value(self, key):
        v = self._values.get(key, _UNREAD)
        if v is _UNREAD:
            v = self._values[key] = self.state.get((_VALUE, key))
        return v

    def _register(self, key, domain, ts):
        if self._on_timer is None:
            raise ValueError("a timer was registered, but the process function has no "
                             "on_timer")
        if self.queues[domain].register(key, ts):
            self._by_key.setdefault(key, set()).add((domain, ts))
            self._timers_dirty.add(key)

    def _register_event(self, key, ts):
        """:meth:`_register` of an event-time timer (the usual call), with fewer calls."""
        if self._on_timer is None:
            self._register(key, EVENT_TIME, ts)  # (raises: the error is said there once)
        if not self._event_queue.register(key, ts):
            return  # there already
        timers = self._by_key.get(key)
        if timers is None:
            self._by_key[key] = {(EVENT_TIME, ts)}
        else:
            timers.add((EVENT_TIME, ts))
        self._timers_dirty.add(key)

    def _delete(self, key, domain, ts):
        if self.queues[domain].delete(key, ts):
            self._forget(key, domain, ts)

    def _forget(self, key, domain, ts):
        timers = self._by_key.get(key)
        if timers is not None:
            timers.discard((domain, ts))
            if not timers:
                del self._by_key[key]
        self._timers_dirty.add(key)

    def _flush(self) -> None:
        """The values this call set, into the backend: one ``put_many`` (a dict update, or a
        write batch on RocksDB), a delete per cleared key."""
        if not self._values:
            return
        state, puts = self.state, {}
        for key, v in self._values.items():
            if v is None:
                state.delete((_VALUE, key))
            else:
                puts[(_VALUE, key)] = v
        state.put_many(puts)
        self._values.clear()

    def _write_timers(self) -> None:
        """The timers of the keys whose timers changed since the last snapshot, into the
        backend. Only a restore (or a rescale) reads them there, from a snapshot: a timer
        registered and fired between two snapshots never reaches it."""
        state = self.state
        for key in self._timers_dirty:
            timers = self._by_key.get(key)
            if timers:
                state.put((_TIMERS, key), tuple(sorted(timers)))
            else:
                state.delete((_TIMERS, key))
        self._timers_dirty.clear()

    def drop_key(self, key):
        for domain, ts in self._by_key.pop(key, ()):
            self.queues[domain].delete(key, ts)
        self._values.pop(key, None)
        self.state.delete((_VALUE, key))
        self.state.delete((_TIMERS, key))

    # -- the hot path ---------------------------------------------------------------------
    def process(self, items, event_times):
        key_fn, element, ctx = self.spec.key_fn, self._element, self._context
        state, timers = ctx.state, ctx.timers
        recs = rows(items)
        times = None if event_times is None else np.asarray(event_times, dtype=np.float64)
        t_list = [None] * len(recs) if times is None else times.tolist()
        touched = self._touched if self.ttl_s is not None else None
        out, out_t, dead = [], [], []
        ctx.time_domain = None
        for rec, t in zip(recs, t_list):
            try:
                key = key_fn(rec)
                if touched is not None:  # (raises for a key that cannot be one: a list...)
                    touched[key] = None
                ctx.key = state._key = timers._key = key
                ctx.timestamp = t
                got = element(rec, ctx)
                if got is not None and got.__class__ is not list:
                    got = list(got)  # (a generator runs here, inside the try)
            except Exception as exc:  # noqa: BLE001 - user code
                dead.append(self.dead(describe_exception(exc), rec))
                continue
            if got:
                out += got
                out_t += [t] * len(got)
        self._flush()
        if touched is not None:
            self.touch(touched)
            touched.clear()
        # processing-time timers are due by the clock, busy or not (ticks come only when a
        # source has nothing to read)
        timers_out = self._fire(PROCESSING_TIME, self.now())
        out += timers_out.items
        dead += timers_out.dead
        res = Output(out, None if times is None else np.asarray(
            out_t + timers_out.event_times.tolist() if timers_out.items else out_t,
            np.float64), dead)
        return self.with_expiry(res)

    def _fire(self, domain: str, until: float) -> Output:
        out: list = []
        out_t: list = []
        dead: list = []
        on_timer = self._on_timer
        if on_timer is None or not self.queues[domain].due(until):  # no timer is due
            return Output(out, None)
        ctx, forget = self._context, self._forget
        state, timers = ctx.state, ctx.timers
        ctx.time_domain = domain
        for ts, key in self.queues[domain].pop_until(until):
            forget(key, domain, ts)
            ctx.key = state._key = timers._key = key  # the context, set to the timer's key
            ctx.timestamp = ts
            try:
                got = on_timer(key, ts, ctx)
                if got is not None and got.__class__ is not list:
                    got = list(got)  # (a generator runs here, inside the try)
            except Exception as exc:  # noqa: BLE001 - user code
                dead.append(self.dead(describe_exception(exc), (key, ts), f"on_timer {domain}"))
                continue
            if got:
                out += got
                out_t += [ts] * len(got)
        self._flush()
        return Output(out, np.asarray(out_t, dtype=np.float64) if out else None, dead)

    def on_watermark(self, watermark):
        if watermark <= self.watermark:
            return self.with_expiry(None)
        self.watermark = watermark
        return self.with_expiry(self._fire(EVENT_TIME, watermark))

    def on_tick(self, now):
        out = self._fire(PROCESSING_TIME, self.now())
        return self.with_expiry(out if out.items or out.dead else None)

    def on_end(self):
        # the end of a bounded input is the final watermark: every event-time timer fires;
        # processing-time timers stay in the state (a savepoint keeps them for a resume)
        self.watermark = math.inf
        return self._fire(EVENT_TIME, math.inf)

    def snapshot(self):
        self._write_timers()
        self.state.put(self.WM, self.watermark)
        return super().snapshot()
