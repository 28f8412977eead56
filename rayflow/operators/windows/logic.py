"""The window operator: :class:`Windowed` and the logic of count, time and session windows,
with their state in the step's backend. Pure: no Ray."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from rayflow.core.operators import (
    Logic,
    OperatorSpec,
    Output,
    StepContext,
    describe_exception,
    owns,
)
from rayflow.core.records import Field, is_arrow, key_codes, rows, stable_order, take
from rayflow.operators.keyed import _GLOBAL, _is_ttl, _StatefulLogic, check_ttl
from rayflow.operators.queues import WindowKeys, WindowQueue
from rayflow.operators.windows.aggregators import Aggregator, Reduce
from rayflow.operators.windows.clocks import EventTime, ProcessingTime, _times, not_finite
from rayflow.operators.windows.columnar import ArrowWindows, is_cw, owned_rows
from rayflow.operators.windows.windowers import (
    CountWindow,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    WindowResult,
    result_times,
)
from rayflow.state.backends import PARTIAL

_MISSING = object()


class _KeyFailed:
    """The key function raised on a record: why, for its dead letter."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


_NO_KEY = _KeyFailed("not a key")  # (stands in for an unhashable key where keys are read)


def _keys(key_fn: Callable, recs: list) -> list:
    """``key_fn`` of every record, in one pass; where it raises, a :class:`_KeyFailed` with
    the reason in that record's place."""
    try:
        return list(map(key_fn, recs))
    except Exception:  # noqa: BLE001 - user key function: again record by record
        pass
    keys: list = []
    for rec in recs:
        try:
            keys.append(key_fn(rec))
        except Exception as exc:  # noqa: BLE001
            keys.append(_KeyFailed(describe_exception(exc)))
    return keys


def _wanted(keys: list, windows_of: list, wm: float) -> list:
    """The state keys ``("__w", key, window)`` of a batch's open windows, each once. The
    usual batch falls in one window (one list of windows, which its records share): its
    distinct keys are found first, and a state key is built per key, not per record. A key
    that cannot be one (a list...) is left out: the record loop makes it a dead letter."""
    try:
        return _open_state_keys(keys, windows_of, wm)
    except TypeError:
        return _open_state_keys([k if _hashable(k) else _NO_KEY for k in keys], windows_of, wm)


def _open_state_keys(keys: list, windows_of: list, wm: float) -> list:
    first = windows_of[0] if windows_of else None
    if first is not None and windows_of.count(first) == len(windows_of):
        # (list.count compares by identity first: a shared list costs a pointer test)
        open_ = [window for window in first if window[1] > wm]
        return [("__w", key, window) for key in dict.fromkeys(keys)
                if key.__class__ is not _KeyFailed for window in open_]
    return list(dict.fromkeys(
        ("__w", key, window) for key, windows in zip(keys, windows_of)
        if windows is not None and key.__class__ is not _KeyFailed
        for window in windows if window[1] > wm))


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _one_open_window(windows_of: list, wm: float) -> tuple | None:
    """The window of every record of a batch, where they all share one list of one open
    window (``list.count`` compares by identity first: a shared list costs a pointer test);
    None otherwise."""
    first = windows_of[0] if windows_of else None
    if first is not None and len(first) == 1 and first[0][1] > wm and \
            windows_of.count(first) == len(windows_of):
        return first[0]
    return None


def _result_fn(agg: Aggregator) -> Callable[[Any], Any] | None:
    """``agg.result``, or None when it is the accumulator itself (then not called: a call
    per window). The window paths build each ``WindowResult`` with ``tuple.__new__``, which
    skips the named tuple's Python-level ``__new__``, another call per window."""
    return None if type(agg).result is Aggregator.result else agg.result


_START = itemgetter(0)  # a session's start


@dataclass(frozen=True)
class Windowed(OperatorSpec):
    """A windowed aggregation per key.

    Args:
        windower: CountWindow, TumblingWindow or SlidingWindow.
        aggregator: how a window's records become its value.
        key_fn: record -> key (the stream's ``key_by`` function).
        clock: ProcessingTime() or EventTime(...); ignored by count windows.
        ttl_s: remove the state of a key that no record has touched for this many seconds
            (processing time), its open windows with it, unfired; None: keep it.
    """

    windower: CountWindow | TumblingWindow | SlidingWindow | SessionWindow
    aggregator: Aggregator
    key_fn: Callable[[Any], Any]
    clock: ProcessingTime | EventTime = ProcessingTime()
    ttl_s: float | None = None

    def __post_init__(self):
        check_ttl(self.ttl_s)
        if not isinstance(self.windower, (CountWindow, TumblingWindow, SlidingWindow,
                                          SessionWindow)):
            raise ValueError(f"window: the windower must be a CountWindow, TumblingWindow, "
                             f"SlidingWindow or SessionWindow, got {self.windower!r}")
        if not all(callable(getattr(self.aggregator, m, None))
                   for m in ("create", "add", "result")):
            raise ValueError(f"window: the aggregator must have create(), add(acc, record) and "
                             f"result(acc) (Count(), Sum(...), MinMax(...), Reduce(...), an "
                             f"Aggregator subclass or your own), got {self.aggregator!r}")

    @property
    def event_time(self) -> bool:
        """Whether the step fires on watermarks (count windows never do)."""
        return isinstance(self.clock, EventTime) and not isinstance(self.windower, CountWindow)

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        if isinstance(self.windower, CountWindow):
            return _CountLogic(self, ctx, resume_state)
        if isinstance(self.windower, SessionWindow):
            return _SessionLogic(self, ctx, resume_state)
        if not isinstance(self.windower, (TumblingWindow, SlidingWindow)):
            raise ValueError(f"step {ctx.step_id!r}: unknown windower {self.windower!r}")
        if _sliceable(self):
            return _SlicedLogic(self, ctx, resume_state)
        return _TimeLogic(self, ctx, resume_state)


def _merges(agg: Aggregator) -> bool:
    """Whether ``agg`` can merge two accumulators."""
    if isinstance(agg, Reduce):
        return agg.merge_fn is not None
    return type(agg).merge is not Aggregator.merge


def _sliceable(spec: Windowed) -> bool:
    """Whether sliding windows can be kept as slices (see :class:`_SlicedLogic`): the window
    is a whole number of slides, the aggregator merges, and no key expires (``ttl_s``)."""
    w = spec.windower
    if not isinstance(w, SlidingWindow) or spec.ttl_s is not None or not _merges(spec.aggregator):
        return False
    n = w.length_s / w.slide_s
    return n >= 2 and n == round(n) and round(n) * w.slide_s == w.length_s



class _CountLogic(_StatefulLogic):
    def process(self, items, event_times):
        coded = key_codes(items, self.spec.key_fn) if len(items) else None
        if coded is not None:
            out = self._process_columnar(items, *coded)
            if out is not None:
                return out
        spec, state = self.spec, self.state
        size, agg, key_fn = spec.windower.size, spec.aggregator, spec.key_fn
        out, dead = [], []
        # a batch's keys are read from the backend once and written back once, whatever the
        # backend: per-record state calls dominate the cost otherwise (RocksDB above all)
        cache: dict = {}
        for rec in rows(items):
            try:
                key = key_fn(rec)
                e = cache.get(key)
                if e is None:
                    st = state.get(key)
                    e = cache[key] = list(st) if st else [0, None, 0]
                    if e[1] is None:  # no open window (a key's closed one keeps no acc)
                        e[1] = agg.create()
                e[1] = agg.add(e[1], rec)
            except Exception as exc:  # noqa: BLE001 - user code
                dead.append(self.dead(describe_exception(exc), rec))
                continue
            e[0] += 1
            if e[0] >= size:
                out.append(WindowResult(key, e[2], e[2] + 1, agg.result(e[1])))
                e[0], e[1], e[2] = 0, agg.create(), e[2] + 1
        for key, e in cache.items():
            state.put(key, tuple(e))  # keeps the key's window sequence
        self.touch(cache)
        return self.with_expiry(Output(out, None, dead))

    def _process_columnar(self, items, codes: np.ndarray, keys: list) -> Output | None:
        """Arrow batch keyed by a field, aggregator with ``reduce_segments``: the rows are
        grouped by key (a stable sort), each key's run is cut where its windows close, and
        all segments are reduced in one vectorized call. Where the cuts fall, which segments
        close a window and each window's sequence number are array arithmetic; Python work is
        per key (its state) and per closed window, not per record or segment. Same windows,
        same order as record by record. None: fall back to the record path (an aggregator
        without a vectorized form, or one that failed, e.g. on a null, so that the bad
        records become dead letters one by one)."""
        size, agg, state = self.spec.windower.size, self.spec.aggregator, self.state
        order = stable_order(codes, len(keys))
        counts = np.bincount(codes, minlength=len(keys))
        present = np.flatnonzero(counts)
        m = counts[present]
        run0 = np.cumsum(m) - m  # where each present key's rows begin in sorted order
        pkeys = [keys[j] for j in present.tolist()]
        prevs = state.get_many(pkeys)  # per key (n, acc, seq) of its open window, or None
        n_prev = np.fromiter((p[0] if p else 0 for p in prevs), np.int64, len(prevs))
        seq_prev = np.fromiter((p[2] if p else 0 for p in prevs), np.int64, len(prevs))
        # a key's first segment fills its open window; the rest are cut every ``size`` rows
        first = np.minimum(m, size - n_prev)
        nseg = 1 + (m - first + size - 1) // size
        owner = np.repeat(np.arange(len(pkeys)), nseg)
        seg0 = np.cumsum(nseg) - nseg  # each key's first segment
        t = np.arange(len(owner)) - seg0[owner]  # a segment's ordinal within its key
        bounds = run0[owner] + np.where(t == 0, 0, first[owner] + (t - 1) * size)
        try:
            accs = agg.reduce_segments(items.take(order), bounds)
        except Exception:  # noqa: BLE001 - record path: per-record dead letters
            return None
        if accs is None:
            return None
        ends = np.append(bounds[1:], len(order))
        filled = ends - bounds + np.where(t == 0, n_prev[owner], 0)  # the window's count
        merge = agg.merge
        for i, k in zip(np.flatnonzero(n_prev).tolist(), seg0[n_prev > 0].tolist()):
            acc = prevs[i][1]  # the key's open window goes on with this batch
            if acc is not None:
                accs[k] = merge(acc, accs[k])
        closed = np.flatnonzero(filled >= size)
        closed = closed[np.argsort(order[ends[closed] - 1], kind="stable")]  # input order
        c_own, c_seq = owner[closed].tolist(), (seq_prev[owner[closed]] + t[closed]).tolist()
        result, new = _result_fn(agg), tuple.__new__  # (new: see _result_fn)
        out = [new(WindowResult, (pkeys[o], s, s + 1,
                                  accs[k] if result is None else result(accs[k])))
               for o, s, k in zip(c_own, c_seq, closed.tolist())]
        last = seg0 + nseg - 1
        ended = (filled[last] >= size).tolist()
        n_last, seq_last = filled[last].tolist(), (seq_prev + nseg - 1).tolist()
        # a key whose window closed keeps its sequence, and no accumulator until its next
        # record (one made now for every closed window cost a call and a list each)
        state.put_many([(key, (0, None, s + 1) if done else (n, accs[k], s))
                        for key, done, n, s, k in zip(pkeys, ended, n_last, seq_last,
                                                      last.tolist())])
        self.touch(pkeys)
        return self.with_expiry(Output(out, None))

    def on_end(self):
        # partial count windows are emitted at end of stream, as Flink does for a final
        # watermark: nothing is dropped when a bounded input ends mid-window
        agg = self.spec.aggregator
        out = [WindowResult(k, seq, seq + 1, agg.result(acc)) for k, (n, acc, seq) in
               ((k, v) for k, v in self.state.items() if not _is_ttl(k)) if n]
        return Output(out, None)

    def on_tick(self, now):
        return self.with_expiry(None)


class _TimeLogic(_StatefulLogic):
    """Tumbling and sliding windows. State: ``("__w", key, (start, end)) -> acc`` plus the
    watermark. Open windows also sit in a queue ordered by their end, with the keys that
    have each open (:class:`WindowKeys`; their state keys where the state holds its keys in
    memory), so a batch costs what it adds and what fires, not a walk over every open
    window.

    On a state that keeps partials (RocksDB), with an aggregator that merges, a window is
    a namespace of partials instead (see ``KeyValueState.add_partials``): a batch adds
    each key's accumulator of the batch to its window without reading the state, and a
    firing takes the window's namespace whole. The queue then holds the windows alone.

    Tumbling windows kept as partials, keyed by a field, with an aggregator that has a
    columnar form, take Arrow batches as columns (:mod:`~rayflow.operators.windows.columnar`): their windows'
    partials are Arrow tables, written to the state as ``("__cw", window, part)`` at
    snapshots. A window may hold both (a batch whose columns do not fit takes the record
    path): its firing merges them per key."""

    WM = "__watermark__"
    #: whether this logic may keep its windows as partials (sliced windows do not)
    uses_partials = True
    #: the windows kept as Arrow columns (None: none are)
    _arrow: ArrowWindows | None = None

    def routing_key(self, state_key):
        if isinstance(state_key, tuple) and len(state_key) == 3 and state_key[0] == "__w":
            return state_key[1]
        if isinstance(state_key, tuple) and len(state_key) == 4 and state_key[0] == PARTIAL:
            return state_key[2]
        return _GLOBAL

    def __init__(self, spec, ctx, resume_state):
        super().__init__(spec, ctx, resume_state)
        self.event_time = isinstance(spec.clock, EventTime)
        self.watermark = self.state.get(self.WM, -math.inf)
        # per window, its keys in the order they opened it; on a state that holds its
        # keys in memory (a dict), their state keys ("__w", key, window) themselves, which a
        # firing pops as they are (building them again cost a third of a firing at 1 M
        # keys); RocksDB keeps them on disk, so there the queue keeps the keys alone
        self._skeys = self.state.holds_keys
        self.fired = WindowKeys()
        agg = spec.aggregator
        self._partials = (self.uses_partials and self.state.supports_partials
                          and _merges(agg))
        self._merge = agg.merge
        # with ttl_s: each key's open windows, so an expired key's windows can be deleted
        self._open: dict | None = {} if self.ttl_s is not None else None
        parts = agg.arrow_partials() if hasattr(agg, "arrow_partials") else None
        if (parts is not None and self._partials and type(spec.windower) is TumblingWindow
                and isinstance(spec.key_fn, Field) and self.ttl_s is None):
            self._arrow = ArrowWindows(spec.key_fn.name, parts, self.state,
                                       spill=not self.state.holds_keys)
        points: list = []  # window entries to keep as partials (see below)
        columns: list = []  # windows kept as Arrow tables, which a snapshot wrote
        for k, v in self.state.items():
            if is_cw(k):
                columns.append((k, v))
            elif isinstance(k, tuple) and len(k) == 3 and k[0] == "__w":
                if self._partials:
                    points.append((k, v))
                    continue
                self.fired.add(k if self._skeys else k[1], k[2])
                if self._open is not None:
                    self._open.setdefault(k[1], set()).add(k[2])
            elif isinstance(k, tuple) and len(k) == 4 and k[0] == PARTIAL:
                self._queue_window(k[1])
                if self._open is not None:
                    self._open.setdefault(k[2], set()).add(k[1])
        # a window kept as one entry per key (by a version that kept this step's windows
        # so) becomes partials, which the firing reads: its state is not left unread
        by_window: dict = {}
        for (_, key, window), acc in points:
            by_window.setdefault(window, {})[key] = acc
            self.state.delete(("__w", key, window))
            if self._open is not None:
                self._open.setdefault(key, set()).add(window)
        for window, accs in by_window.items():  # (one write per window)
            self.state.add_partials(window, accs, self._merge)
            self._queue_window(window)
        if self._arrow is not None:
            for k, table in columns:
                if self._arrow.restore(k, table):
                    self._queue_window(k[1])
        elif columns:  # resumed by a step that does not keep columns: the records' way
            decode = ArrowWindows(columns[0][1].column_names[0], agg.arrow_partials(),
                                  self.state, spill=True)
            for k, table in columns:
                decode.restore(k, table)
            for window in list(decode.stored):
                self._columns_to_records(window, decode)

    def _columns_to_records(self, window: tuple, decode: ArrowWindows) -> None:
        """A window kept as columns (by a step resumed with another key or aggregator
        form, or with ``ttl_s``) becomes state of the record path."""
        agg = self.spec.aggregator
        keys, cols = decode.take(window)  # type: ignore[misc]  # (restored: there)
        accs = agg.from_arrow_partials(cols)
        # (columns were written by a step whose windows were partials: so are these)
        self.state.add_partials(window, dict(zip(keys, accs)), self._merge)
        self._queue_window(window)
        if self._open is not None:
            for key in keys:
                self._open.setdefault(key, set()).add(window)

    def owned_part(self, state_key, value):
        if is_cw(state_key):  # a window's table: the rows of this instance's keys
            return owned_rows(value, lambda key: owns(key, self.ctx))
        return super().owned_part(state_key, value)

    def join_parts(self, state_key, a, b):
        if is_cw(state_key):
            import pyarrow as pa

            return pa.concat_tables([a, b])
        return super().join_parts(state_key, a, b)

    def _queue_window(self, window: tuple) -> None:
        """With partials: ``window`` is open (for some key); queued once, keys apart."""
        self.fired.add_many(window, [])

    def drop_key(self, key):
        for window in (self._open or {}).pop(key, ()):
            if self._partials:
                self.state.drop_partials(window, key)
            else:
                self.state.delete(("__w", key, window))

    def snapshot(self):
        if self._arrow is not None:
            self._arrow.snapshot()
        self.state.put(self.WM, self.watermark)
        return super().snapshot()

    def _process_arrow(self, items: Any, event_times: Any) -> Output | None:
        """An Arrow batch into windows kept as columns (see the class docstring); None:
        the batch takes the record path (its fields do not fit, or Arrow could not
        aggregate them), nothing changed."""
        arrow, spec = self._arrow, self.spec
        assert arrow is not None
        if not arrow.reads(items):
            return None
        try:
            times = _times(spec.clock, items, event_times)
        except Exception:  # noqa: BLE001 - the record path says why
            return None
        w = spec.windower
        finite = np.isfinite(times)
        # as TumblingWindow.windows_of_many computes them, so both paths name a window alike
        slots = np.floor((np.where(finite, times, 0.0) - w.align_s) / w.length_s)
        ends = w.align_s + slots * w.length_s + w.length_s
        live = finite & (ends > self.watermark)
        adds = []
        try:
            slots_live = slots[live]
            # (the usual batch falls in one window: no sort to find it)
            one = len(slots_live) and slots_live.min() == slots_live.max()
            for slot in (slots_live[:1] if one else np.unique(slots_live)).tolist():
                start = (w.align_s + np.float64(slot) * w.length_s).item()
                window = (start, start + w.length_s)
                rows_of = live & (slots == slot)
                part = arrow.partials(items if rows_of.all() else take(
                    items, np.flatnonzero(rows_of)))
                if not arrow.fits(window, part):
                    return None
                adds.append((window, part))
        except Exception:  # noqa: BLE001 - e.g. a key type Arrow cannot group by
            return None
        for window, part in adds:
            if arrow.add(window, part):
                self._queue_window(window)
        dead: list = []
        if not finite.all():
            bad = np.flatnonzero(~finite)
            dead = [self.dead(not_finite(t), rec) for rec, t in
                    zip(rows(take(items, bad)), times[bad].tolist())]
        late: list = []
        late_t: list = []
        if not (live | ~finite).all():
            gone = np.flatnonzero(finite & ~live)
            late, late_t = rows(take(items, gone)), times[gone].tolist()
        return self._batch_output(dead, late, late_t)

    def process(self, items, event_times):
        if self._arrow is not None and is_arrow(items) and len(items):
            out = self._process_arrow(items, event_times)
            if out is not None:
                return out
        spec, state, agg = self.spec, self.state, self.spec.aggregator
        dead, late, late_t = [], [], []
        try:
            times = _times(spec.clock, items, event_times)
        except Exception as exc:  # noqa: BLE001 - user timestamp function
            return Output([], None, [self.dead(describe_exception(exc), items, "batch")])
        wm = self.watermark
        if self._partials:
            # a window's state is its partials: the batch's accumulators start afresh in a
            # dict of the batch's own, none read (absent is None: created, as for a key a
            # dict state lacks)
            direct, cache, unread = None, {}, None
        else:
            # one backend read and write per window and batch (a dict state: none, in
            # place, each key touched once)
            direct, cache, unread = self.batch_cache(_MISSING)
        # the hot loop's lookups, hoisted
        key_fn, add, get = spec.key_fn, agg.add, cache.get
        read, create = state.get, agg.create
        opened: list = []  # the windows this batch opens, pushed on the queue in one go
        t_list = times.tolist()
        finite = np.isfinite(times)
        if finite.all():
            windows_of: list = spec.windower.windows_of_many(times)
        else:  # a time that is NaN or infinite has no window: its record is a dead letter
            windows_of = [w if ok else None for w, ok in zip(
                spec.windower.windows_of_many(np.where(finite, times, 0.0)), finite.tolist())]
        recs = rows(items)
        keys = _keys(key_fn, recs)
        if self._partials:
            window = _one_open_window(windows_of, wm)
            if window is not None:  # the usual batch: no window loop per record
                self._add_in_one_window(recs, keys, window, dead)
                return self._batch_output(dead, late, late_t)
        elif direct is None and state.batch_reads:  # one multi-get of the batch's windows
            wanted = _wanted(keys, windows_of, wm)  # (None where absent)
            cache.update(zip(wanted, state.get_many(wanted)))
        for rec, t, windows, key in zip(recs, t_list, windows_of, keys):
            if windows is None:
                dead.append(self.dead(not_finite(t), rec))
                continue
            if key.__class__ is _KeyFailed:
                dead.append(self.dead(key.reason, rec))
                continue
            placed = False
            for window in windows:
                if window[1] <= wm:
                    continue  # that window has closed
                skey = ("__w", key, window)
                try:
                    acc = get(skey, unread)
                except TypeError as exc:  # a key that cannot be one (a list...)
                    dead.append(self.dead(describe_exception(exc), rec))
                    placed = True
                    break
                if acc is _MISSING:
                    acc = read(skey)
                if acc is None:  # (a read of the batch found none either)
                    acc = create()
                    opened.append(skey)
                try:
                    cache[skey] = add(acc, rec)
                except Exception as exc:  # noqa: BLE001 - user aggregator
                    if get(skey, _MISSING) is None:  # read up front as absent: nothing to write
                        del cache[skey]
                    dead.append(self.dead(describe_exception(exc), rec))
                    placed = True  # a dead letter, not also late
                    break
                placed = True
            if not placed:
                late.append(rec)
                late_t.append(t)
        self._opened(opened)
        if self._partials:
            by_window: dict = {}
            for (_, key, window), acc in cache.items():
                by_window.setdefault(window, {})[key] = acc
            for window, accs in by_window.items():
                state.add_partials(window, accs, self._merge)
        elif direct is None:
            state.put_many(cache)  # one call: a write batch on RocksDB
        if self.ttl_s is not None:
            self.touch({skey[1]: None for skey in cache})
        return self._batch_output(dead, late, late_t)

    def _add_in_one_window(self, recs: list, keys: list, window: tuple, dead: list) -> None:
        """With partials, a batch whose records all fall in one open ``window``: each key's
        records become one accumulator, added to the window unread."""
        agg = self.spec.aggregator
        add, create = agg.add, agg.create
        # a dict state's window is a dict of its own: the records go into it in place, no
        # accumulator of the batch merged after (without ttl_s, which touches the batch's
        # keys alone)
        live = self.state.live_partials(window) if self.ttl_s is None else None
        accs: dict = {} if live is None else live
        get = accs.get
        for rec, key in zip(recs, keys):
            if key.__class__ is _KeyFailed:
                dead.append(self.dead(key.reason, rec))
                continue
            try:
                acc = get(key, _MISSING)  # (raises for a key that cannot be one: a list...)
                accs[key] = add(create() if acc is _MISSING else acc, rec)
            except Exception as exc:  # noqa: BLE001 - user aggregator
                dead.append(self.dead(describe_exception(exc), rec))
        if live is not None:
            if live:
                self._queue_window(window)
            else:  # every record a dead letter: no window opened
                self.state.take_partials(window, self._merge)
            return
        if accs:
            self._queue_window(window)
            self.state.add_partials(window, accs, self._merge)
            if self._open is not None:
                for key in accs:
                    self._open.setdefault(key, set()).add(window)
            self.touch(accs)

    def _batch_output(self, dead: list, late: list, late_t: list) -> Output | None:
        """A batch's output: its dead letters and late records, and on processing time the
        windows that the clock closed."""
        side: dict = {"late": (late, np.asarray(late_t, dtype=np.float64))} if late else {}
        if self.event_time:
            return self.with_expiry(Output([], None, dead, side))
        out = self._fire(time.time())  # processing time: the clock is the watermark
        return self.with_expiry(Output(out.items, out.event_times, dead, side))

    def on_watermark(self, watermark):
        if not self.event_time or watermark <= self.watermark:
            return self.with_expiry(None)
        return self.with_expiry(self._fire(watermark))

    def on_tick(self, now):
        if self.event_time:
            return self.with_expiry(None)
        out = self._fire(now)
        return self.with_expiry(out if out.items else None)

    def on_end(self):
        return self._fire(math.inf)

    def _opened(self, opened: list) -> None:
        """Queue the windows a batch opened (their state keys ``("__w", key, window)``),
        in order."""
        if not opened:
            return
        window = opened[0][2]
        skeys = self._skeys
        if self._partials:  # the queue holds the windows alone
            for w in {skey[2] for skey in opened}:
                self._queue_window(w)
        elif all(skey[2] == window for skey in opened):  # the usual batch: one window
            self.fired.add_many(window, opened if skeys else [skey[1] for skey in opened])
        else:
            add = self.fired.add
            for skey in opened:
                add(skey if skeys else skey[1], skey[2])
        if self._open is not None:
            for _, key, window in opened:
                self._open.setdefault(key, set()).add(window)

    def _state_keys(self, window: tuple, entries: list) -> list:
        """The state keys of a window's queued ``entries`` (keys, or state keys already)."""
        return entries if self._skeys else [("__w", key, window) for key in entries]

    def _fire(self, watermark: float) -> Output:
        if watermark > self.watermark:
            self.watermark = watermark
        due = self.fired.drain(watermark)
        if not due:
            return Output([], None)
        result, new = _result_fn(self.spec.aggregator), tuple.__new__  # (see _result_fn)
        out: list = []
        if self._partials:
            for window, _ in due:
                pairs = self._with_columns(window, self.state.take_partials(window,
                                                                            self._merge))
                start, end = window
                out += [new(WindowResult, (key, start, end,
                                           acc if result is None else result(acc)))
                        for key, acc in pairs]
                if self._open is not None:
                    self._close_open([key for key, _ in pairs], window)
            return Output(out, result_times(out))
        for window, entries in due:
            skeys = self._state_keys(window, entries)
            accs = self.state.pop_many(skeys)
            start, end = window
            out += [new(WindowResult, (skey[1], start, end,
                                       acc if result is None else result(acc)))
                    for skey, acc in zip(skeys, accs) if acc is not None]
            if self._open is not None:
                self._close_open([skey[1] for skey in skeys], window)
        return Output(out, result_times(out))

    def _with_columns(self, window: tuple, pairs: list) -> Any:
        """``(key, acc)`` of ``window``, to iterate once: ``pairs`` (its state on the record
        path) and its columns, if it has any (they leave the state), a key's two merged.
        (The order of a window's keys is not promised; with columns it is that of Arrow's
        grouping.)"""
        arrow = self._arrow
        taken = arrow.take(window) if arrow is not None else None
        if taken is None:
            return pairs
        keys, cols = taken
        accs = self.spec.aggregator.from_arrow_partials(cols)
        if not pairs:
            return zip(keys, accs)
        merged, merge = dict(pairs), self._merge
        for key, acc in zip(keys, accs):
            cur = merged.get(key, _MISSING)
            merged[key] = acc if cur is _MISSING else merge(cur, acc)
        return merged.items()

    def _close_open(self, keys: list, window: tuple) -> None:
        """``window`` fired for ``keys``: it is no longer open for them (ttl_s)."""
        open_ = self._open
        assert open_ is not None
        for key in keys:
            windows = open_.get(key)
            if windows is not None:
                windows.discard(window)
                if not windows:
                    del open_[key]


class _SessionLogic(_TimeLogic):
    """Session windows. State: ``("__s", key) -> ((start, end, acc), ...)``, the key's open
    sessions in order; a key without open sessions has no state at all."""

    def routing_key(self, state_key):
        if isinstance(state_key, tuple) and len(state_key) == 2 and state_key[0] == "__s":
            return state_key[1]
        return _GLOBAL

    def __init__(self, spec, ctx, resume_state):
        agg = spec.aggregator
        if isinstance(agg, Reduce) and agg.merge_fn is None:
            raise ValueError(f"step {ctx.step_id!r}: session windows merge accumulators; "
                             f"give Reduce a merge_fn")
        _StatefulLogic.__init__(self, spec, ctx, resume_state)
        self.event_time = isinstance(spec.clock, EventTime)
        self.watermark = self.state.get(self.WM, -math.inf)
        self.fired = WindowQueue()
        for k, sessions in self.state.items():
            if isinstance(k, tuple) and len(k) == 2 and k[0] == "__s":
                for start, end, _ in sessions:
                    self.fired.push(end, k[1], (start, end))

    def process(self, items, event_times):
        spec, state, agg = self.spec, self.state, self.spec.aggregator
        gap = spec.windower.gap_s
        dead, late, late_t = [], [], []
        try:
            times = _times(spec.clock, items, event_times)
        except Exception as exc:  # noqa: BLE001 - user timestamp function
            return Output([], None, [self.dead(describe_exception(exc), items, "batch")])
        wm = self.watermark
        cache: dict = {}
        queued: dict = {}  # per key, the sessions that were queued before this batch
        key_fn, add, create, merge = spec.key_fn, agg.add, agg.create, agg.merge
        t_list = times.tolist()
        finite = bool(np.isfinite(times).all())
        for rec, t in zip(rows(items), t_list):
            if not finite and not math.isfinite(t):
                dead.append(self.dead(not_finite(t), rec))
                continue
            try:
                key = key_fn(rec)
                skey = ("__s", key)
                sessions = cache.get(skey)
                if sessions is None:
                    sessions = cache[skey] = list(state.get(skey) or ())
                    queued[skey] = {(s[0], s[1]) for s in sessions}
                start, end = t, t + gap
                # the sessions (in start order) that touch or overlap [t, t + gap) merge
                hit, more = -1, False
                if len(sessions) == 1:  # the usual case: one open session
                    s = sessions[0]
                    if s[0] <= end and s[1] >= start:
                        hit = 0
                else:
                    for i, s in enumerate(sessions):
                        if s[0] <= end and s[1] >= start:
                            if hit >= 0:
                                more = True
                                break
                            hit = i
                if hit < 0:  # a session of its own
                    new = (start, end, add(create(), rec))
                elif not more:  # one session grows: it keeps its place among the others
                    s = sessions[hit]
                    new = (start if start < s[0] else s[0], end if end > s[1] else s[1],
                           add(s[2], rec))
                else:  # it bridges sessions: they become one
                    acc, keep = add(create(), rec), []
                    for s in sessions:
                        if s[0] <= end and s[1] >= start:
                            start, end, acc = min(start, s[0]), max(end, s[1]), merge(s[2], acc)
                        else:
                            keep.append(s)
                    new = (start, end, acc)
            except Exception as exc:  # noqa: BLE001 - user code
                dead.append(self.dead(describe_exception(exc), rec))
                continue
            if new[1] <= wm:  # even merged, its session has closed
                late.append(rec)
                late_t.append(t)
                continue
            if hit < 0:
                sessions.append(new)
                if len(sessions) > 1 and sessions[-2][0] > new[0]:
                    sessions.sort(key=_START)
            elif not more:
                sessions[hit] = new
            else:
                keep.append(new)
                keep.sort(key=_START)
                cache[skey] = keep
        push = self.fired.push
        for skey, sessions in cache.items():
            if sessions:
                state.put(skey, tuple(sessions))
                # a session is queued once, as the batch leaves it (those it merged on the
                # way would be skipped when they fire)
                before = queued[skey]
                for start, end, _ in sessions:
                    if (start, end) not in before:
                        push(end, skey[1], (start, end))
        self.touch(skey[1] for skey in cache)
        side = {"late": (late, np.asarray(late_t, dtype=np.float64))} if late else {}
        if self.event_time:
            return self.with_expiry(Output([], None, dead, side))
        out = self._fire(time.time())
        return self.with_expiry(Output(out.items, out.event_times, dead, side))

    def drop_key(self, key):
        self.state.delete(("__s", key))

    def _fire(self, watermark: float) -> Output:
        if watermark > self.watermark:
            self.watermark = watermark
        agg, out = self.spec.aggregator, []
        for _, key, window in self.fired.pop_until(watermark):
            skey = ("__s", key)
            sessions = self.state.get(skey) or ()
            rest = [s for s in sessions if (s[0], s[1]) != window]
            if len(rest) == len(sessions):
                continue  # merged into a longer session since: its entry fires later
            acc = next(s[2] for s in sessions if (s[0], s[1]) == window)
            out.append(WindowResult(key, window[0], window[1], agg.result(acc)))
            if rest:
                self.state.put(skey, tuple(rest))
            else:
                self.state.delete(skey)
        return Output(out, result_times(out))


class _SlicedWindows:
    """The windower of :class:`_SlicedLogic`: a time's one slice, named by the last of its
    windows (the one that starts where the slice starts)."""

    def __init__(self, sliding: SlidingWindow):
        self.sliding = sliding

    def windows_of_many(self, times: np.ndarray) -> list[list[tuple[float, float]]]:
        w = self.sliding
        if not len(times):
            return []
        lasts, index = np.unique(np.floor((times - w.align_s) / w.slide_s), return_inverse=True)
        labels = [[(s, s + w.length_s)] for s in (w.align_s + lasts * w.slide_s).tolist()]
        return [labels[i] for i in index.tolist()]


class _SlicedSpec:
    """A :class:`Windowed` spec seen through :class:`_SlicedWindows` (what the shared
    ``process`` of time windows reads)."""

    def __init__(self, spec: Windowed):
        self.windower = _SlicedWindows(spec.windower)  # type: ignore[arg-type]  # (sliding)
        self.aggregator, self.key_fn, self.clock = spec.aggregator, spec.key_fn, spec.clock
        self.ttl_s = None


class _SlicedLogic(_TimeLogic):
    """Sliding windows kept as slices, as Flink's window aggregation slices a hopping window
    (and as the Nexmark suite's q5 runs there): a record is added to the one slice of
    ``slide_s`` that holds it, not to each of the ``length_s / slide_s`` windows that do,
    and a window's value is merged from its slices when it fires. A record then costs one
    state update, not one per window. A slice is state ``("__w", key, (s, s + length_s))``
    (named by its last window, the one starting at ``s``), is late once that window has
    fired, and is deleted then. The results equal those of one accumulator per window.

    On a state that keeps partials (RocksDB), a slice is a namespace of partials, as a
    tumbling window is: a batch adds to it unread, a firing reads it whole, and the firing
    of its last window takes it."""

    def __init__(self, spec, ctx, resume_state):
        super().__init__(spec, ctx, resume_state)
        self.sliding: SlidingWindow = spec.windower
        self.spec = _SlicedSpec(spec)  # process() reads the slices
        self.merge, self.create = spec.aggregator.merge, spec.aggregator.create
        self.result = _result_fn(spec.aggregator)

    def _windows_of_slice(self, s: float) -> list[tuple[float, float]]:
        """The windows that hold the slice starting at ``s``, computed as
        ``SlidingWindow.windows_of`` computes them for a time in it."""
        w, out, start = self.sliding, [], s
        for _ in range(round(w.length_s / w.slide_s)):
            out.append((start, start + w.length_s))
            start -= w.slide_s
        return out

    def _fire(self, watermark: float) -> Output:
        fired_through = self.watermark
        if watermark > self.watermark:
            self.watermark = watermark
        slices = self.fired.windows()
        due: dict[tuple[float, float], list[tuple]] = {}  # window -> its open slices
        for label in slices:
            for window in self._windows_of_slice(label[0]):
                if fired_through < window[1] <= watermark:
                    due.setdefault(window, []).append(label)
        # each slice is read once per firing, however many of its windows fire: a jump of
        # the watermark (the end of the input, a source back from idle) fires them together.
        # A slice whose every window has now fired leaves the queue and the state in the
        # same read (a pop).
        state = self.state
        needed = {label for labels in due.values() for label in labels}
        kept = {label: slices[label] for label in needed}  # (draining removes them)
        read: dict[tuple, list] = {}  # slice -> its (key, accumulator) pairs, read once
        for label, entries in self.fired.drain(watermark):
            if self._partials:
                pairs = state.take_partials(label, self.merge)
                if self._open is not None:
                    self._close_open([key for key, _ in pairs], label)
                if label in needed:
                    read[label] = pairs
                continue
            skeys = self._state_keys(label, entries)
            popped = state.pop_many(skeys)
            if label in needed:
                read[label] = list(zip([skey[1] for skey in skeys], popped))
        for label, entries in kept.items():
            if label not in read:
                if self._partials:
                    read[label] = state.read_partials(label, self.merge)
                else:
                    skeys = self._state_keys(label, entries)
                    read[label] = list(zip([skey[1] for skey in skeys],
                                           state.get_many(skeys)))
        out: list = []
        if due:
            merge, create, result = self.merge, self.create, self.result
            new = tuple.__new__
            for window in sorted(due, key=lambda w: (w[1], w[0])):
                accs: dict = {}
                for label in sorted(due[window]):
                    for key, acc in read[label]:
                        if acc is not None:
                            # into a fresh accumulator: a merge may change its first argument
                            accs[key] = merge(accs[key] if key in accs else create(), acc)
                start, end = window
                out += [new(WindowResult, (key, start, end, acc if result is None
                                           else result(acc))) for key, acc in accs.items()]
        return Output(out, result_times(out)) if out else Output([], None)

