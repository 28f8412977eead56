"""Push channels with byte credits: how an instance sends batches downstream.

Each (downstream step, target instance) pair is a channel holding a window of in-flight
``push`` calls. A send first waits, oldest call first, until the channel has room for the
batch under both limits (bytes and calls): that wait is backpressure, and it is counted.
Because an instance's own ``push`` does not return while it waits, a slow step stalls its
producers all the way back to the sources, and memory stays bounded by the windows.
A batch larger than the whole byte window still goes out alone, so nothing deadlocks.

Batches follow the receiver's pace. A receiver answers each ``push`` with the seconds it
took, and the channel fits the cost of a call, ``fixed_s + per_record_s * rows``, to the last
few (:class:`CallPace`; the first call, a warm-up, is left out). Only a rebalance edge to more
than one instance is paced: there a batch goes in parts (:func:`deal`) while what is left
would cost a receiver more than ``CallPace.ENGAGE`` times ``batch_target_s``, each part to
the instance with the fewest calls in flight (round-robin among equals), so a slow step
spreads evenly (Flink spreads records, not batches), and a source polls no more than its
channels take in ``ENGAGE`` rounds. Other edges, and receivers faster than
``CallPace.SLOW_RECORD_S`` a record, keep whole batches.

A channel to an instance chained into the same actor is a plain call instead: the receiver
handles the message in the sender's thread before ``emit`` returns, so it needs no window.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from rayflow.batches import Barrier, Batch, EndOfStream, nbytes, partition_indices, take
from rayflow.runtime.plan import OutEdge


def unwrap(exc: BaseException) -> BaseException:
    """The root cause inside a RayTaskError chain (a StepError, usually), so an error is
    reported once and without the chain of Ray tracebacks around it."""
    for _ in range(20):
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException) or cause is exc:
            break
        exc = cause
    return exc


def window_calls(max_calls: int, target_s: float, service_s: float) -> int:
    """How many calls a channel may have in flight: ``max_calls``, fewer when the receiver
    takes long per call, so that at most about ``target_s`` of work waits there (and a
    barrier behind it waits no longer); at least 2, so the receiver never idles between
    calls.

        >>> window_calls(16, 0.25, 0.001), window_calls(16, 0.25, 0.05), window_calls(16, 0.25, 1.0)
        (16, 5, 2)
        >>> window_calls(16, 0.0, 1.0)  # debloating off
        16
    """
    if target_s <= 0 or service_s <= 0:
        return max_calls
    return max(2, min(max_calls, int(target_s / service_s)))


class BatchSizer:
    """How many records a source puts in one batch: at most ``batch_size``, and at most what
    the job moves in about half of ``target_s`` (its rate over the last half second), so
    that one batch costs each step a fraction of the channel target, and a barrier behind a
    few batches still passes quickly. Pure: the source loop feeds it what it sent.

        >>> s = BatchSizer(16384, 0.25, now=0.0)
        >>> s.limit
        16384
        >>> s.sent(16384, now=0.2), s.sent(16384, now=1.0)   # 32768 records in 1 s
        (16384, 4096)
        >>> BatchSizer(16384, 0.0, now=0.0).sent(10, now=5.0)  # no target: fixed
        16384
    """

    WINDOW_S = 0.5

    def __init__(self, batch_size: int, target_s: float, now: float):
        self.batch_size, self.target_s = batch_size, target_s
        self.limit = batch_size
        self._t0, self._rows = now, 0

    def sent(self, rows: int, now: float) -> int:
        """``rows`` left in one batch at ``now``; returns the limit for the next one."""
        self._rows += rows
        if self.target_s > 0 and now - self._t0 >= self.WINDOW_S:
            rate = self._rows / (now - self._t0)
            self.limit = max(1, min(self.batch_size, int(rate * self.target_s / 2)))
            self._t0, self._rows = now, 0
        return self.limit


class CallPace:
    """How many records one call to a receiver may carry, from how long its calls took.

    The cost of a call is modelled as ``fixed_s + per_record_s * rows``, fitted (least
    squares) to the last :attr:`SAMPLES` completed calls, and a part carries what costs about
    ``target_s``, or twice the fixed cost when that is more, so that the fixed cost never
    takes more than half a call: a receiver that pays a lot per call (a flush, a request)
    keeps large batches. Every :attr:`PROBE`-th part is twice as large, so that the sizes
    differ enough to tell the two costs apart. The first call is left out (warm-up), so until
    a second one completed, a part carries :attr:`FIRST_ROWS`. Pure: the channel feeds it the
    durations the receiver reports.

        >>> p = CallPace(0.1)
        >>> p.rows()                       # nothing measured yet
        512
        >>> p.observe(512, 5.0)            # the first call: warm-up, not counted
        >>> p.rows()
        512
        >>> p.observe(64, 0.064)           # 1 ms a record
        >>> [p.next_part() for _ in range(4)]   # the fourth is a probe
        [100, 100, 100, 200]
        >>> p.observe(100, 0.1); p.observe(200, 0.2)
        >>> round(p.per_record_s, 6), round(p.fixed_s, 6), p.rows()
        (0.001, 0.0, 100)
        >>> f = CallPace(0.1)              # 0.2 s a call, whatever its size
        >>> f.observe(512, 5.0); f.observe(64, 0.2); f.observe(32, 0.2)
        >>> f.fixed_s, f.rows()            # splitting cannot help: no limit
        (0.2, None)
        >>> CallPace(0.0).rows() is None   # off: batches go whole
        True
    """

    SAMPLES = 8
    FIRST_ROWS = 512
    # a batch goes in parts only when it would cost the receiver more than this many targets
    # (a second at the default 0.1 s): smaller calls cost every step a fixed share (a Ray call,
    # per-key work), and on a busy machine a call's measured time also holds the time its
    # process waited for a core, so cutting finer than that costs more than it spreads
    ENGAGE = 10
    # and only for a receiver slower than this a record (a sleep, a request, a model call):
    # a fast one's parts would only cut the batches of the keyed steps after it, whose cost
    # per call grows with the keys it holds, not with its records (the W4 word count: 2.3x
    # slower at parallelism 2 with parts)
    SLOW_RECORD_S = 1e-4
    PROBE = 4
    SPREAD = 1.5  # sizes this far apart (max / min) let the fit tell fixed from per-record

    def __init__(self, target_s: float):
        self.target_s = target_s
        self.fixed_s = 0.0
        self.per_record_s: float | None = None  # None: no call measured yet
        self._calls: deque = deque(maxlen=self.SAMPLES)  # (rows, seconds)
        self._parts = 0
        self._warm = False  # the first call was seen (and left out)
        self.blind = False  # the receiver does not report its time: no pace to wait for

    def observe(self, rows: int, seconds: float) -> None:
        """A call of ``rows`` records took the receiver ``seconds``. The first call is not
        counted: it pays the receiver's warm-up (imports, first connections downstream),
        which made fast steps look slow."""
        if rows <= 0 or seconds < 0:
            return
        if not self._warm:
            self._warm = True
            return
        self._calls.append((rows, seconds))
        ns = [float(n) for n, _ in self._calls]
        ds = [d for _, d in self._calls]
        k = len(ns)
        if max(ns) >= self.SPREAD * min(ns):
            mn, md = sum(ns) / k, sum(ds) / k
            slope = sum((n - mn) * (d - md) for n, d in zip(ns, ds)) / \
                sum((n - mn) ** 2 for n in ns)
            fixed = md - slope * mn
            if slope <= 0:  # all fixed cost (within the noise)
                self.fixed_s, self.per_record_s = md, 0.0
            elif fixed < 0:  # all per-record cost
                self.fixed_s, self.per_record_s = 0.0, sum(ds) / sum(ns)
            else:
                self.fixed_s, self.per_record_s = fixed, slope
        else:  # one size: the fixed cost as last fitted, the rest per record
            self.per_record_s = max(0.0, (sum(ds) - k * self.fixed_s) / sum(ns))

    def rows(self) -> int | None:
        """Records one call should carry; None: no limit."""
        if self.target_s <= 0:
            return None
        if self.per_record_s is None:
            return self.FIRST_ROWS
        if self.per_record_s <= 0:
            return None
        budget = max(self.target_s - self.fixed_s, self.fixed_s)
        return max(1, int(budget / self.per_record_s * (1 + 1e-9)))  # (not 99.99999 -> 99)

    def next_part(self) -> int | None:
        """Records for the part that goes next: :meth:`rows`, or twice that for a probe."""
        n = self.rows()
        if n is None or self.per_record_s is None:
            return n
        self._parts += 1
        return 2 * n if self._parts % self.PROBE == 0 else n


def deal(n: int, rows_for: Callable[[int, int], int | None],
         choose: Callable[[], int] = lambda: 0) -> Iterator[tuple[int, int, int]]:
    """The parts of a batch of ``n`` records: ``(channel, lo, hi)``, consecutive records,
    each to the channel ``choose()`` names and at most what ``rows_for(channel, left)`` says
    for the ``left`` records still to go (None: no limit), both asked just before the part
    goes, so they see the latest calls. Records keep their order within each channel.

        >>> rr = iter([1, 0, 1])
        >>> list(deal(10, lambda c, left: {0: 4, 1: 3}[c], lambda: next(rr)))
        [(1, 0, 3), (0, 3, 7), (1, 7, 10)]
        >>> list(deal(10, lambda c, left: None))   # no limit: one part
        [(0, 0, 10)]
    """
    lo = 0
    while lo < n:
        ch = choose()
        most = rows_for(ch, n - lo)
        hi = n if most is None else min(n, lo + max(1, most))
        yield ch, lo, hi
        lo = hi


def least_loaded(loads: list[int], start: int) -> int:
    """The channel with the fewest calls in flight; among equals, the first from ``start`` on
    (round-robin order), so equal receivers take turns and a slower one gets fewer parts.

        >>> least_loaded([2, 1, 1], 0), least_loaded([2, 1, 1], 2), least_loaded([0, 0], 1)
        (1, 2, 1)
    """
    k = len(loads)
    return min(range(start, start + k), key=lambda i: loads[i % k]) % k


def _part(batch: Batch, lo: int, hi: int) -> Batch:
    """Records ``lo:hi`` of ``batch`` (Arrow: a zero-copy slice)."""
    if lo == 0 and hi == len(batch):
        return batch
    items = batch.items
    part = items[lo:hi] if isinstance(items, (list, np.ndarray)) else items.slice(lo, hi - lo)
    times = None if batch.event_times is None else batch.event_times[lo:hi]
    return Batch(part, times, batch.in_time)


@dataclass
class _Channel:
    handle: Any
    target: tuple[str, int]
    local: Any = None  # the receiving StepTask when it is chained into this actor
    window: deque = field(default_factory=deque)  # (ref, nbytes, rows, seq, batch or None)
    bytes: int = 0
    seq: int = 0  # messages sent: the receiver restores their order (see StepHost.push)
    service_s: float = 0.0  # seconds the receiver takes per call of this channel (EWMA)
    pace: CallPace = field(default_factory=lambda: CallPace(0.0))


class Emitter:
    """Sends one instance's output to its downstream steps."""

    def __init__(self, source: tuple[str, int], edges: list[OutEdge],
                 handles: dict[str, list[Any]], max_bytes: int, max_calls: int,
                 local: dict | None = None, target_s: float = 0.0,
                 batch_target_s: float = 0.0, unaligned: bool = False):
        self.source = source
        # unaligned checkpoints: barriers go out of band, and the batches of calls not yet
        # finished are kept (they become the checkpoint's channel state)
        self.unaligned = unaligned
        self.max_bytes, self.max_calls = max_bytes, max_calls
        self.target_s = target_s
        local = local or {}
        self.edges = [
            (e, [_Channel(handles[e.downstream][t], (e.downstream, t),
                          local.get((e.downstream, t)),
                          # parts pay only where they spread: on a rebalance edge. Elsewhere a
                          # part goes where its whole batch would (by key, or to the one
                          # instance), and smaller calls only repeat each call's per-key cost
                          pace=CallPace(batch_target_s if e.partitioning == "rebalance"
                                        and len(e.target_instances) > 1 else 0.0))
                 for t in e.target_instances])
            for e in edges
        ]
        self._rr = [0] * len(self.edges)
        self._ports = {e.port for e in edges}  # outputs that have consumers
        self.backpressure_s = 0.0
        self.chained_s = 0.0  # spent inside chained steps (their work, not this step's)
        self.batches_out = 0
        self.bytes_out = 0

    def ports(self) -> set[str]:
        return self._ports

    def emit(self, batch: Batch, port: str = "main") -> None:
        """Send ``batch`` to every downstream step of ``port``, partitioned as each edge
        says."""
        if not len(batch):
            return
        size = None
        for k, (edge, chans) in enumerate(self.edges):
            if edge.port != port:
                continue
            kind = edge.partitioning
            if kind == "hash" and len(chans) > 1:
                assert edge.key_fn is not None, "key_by() makes a hash edge with its key"
                groups = partition_indices(batch.items, edge.key_fn, len(chans))
                for chan, idx in zip(chans, groups):
                    if len(idx):
                        times = None if batch.event_times is None else batch.event_times[idx]
                        part = Batch(take(batch.items, idx), times, batch.in_time)
                        self._send_parts([chan], part, nbytes(part.items))
                continue
            if size is None:
                size = nbytes(batch.items)
            if kind == "broadcast":
                for chan in chans:
                    self._send_parts([chan], batch, size)
            elif kind == "rebalance" and len(chans) > 1:
                self._send_parts(chans, batch, size, k)
            else:
                self._send_parts([chans[0]], batch, size)

    def waited_s(self) -> float:
        """Seconds this emitter and those of the steps chained after it have waited for
        downstream credit: time a call spent that was not its own work."""
        return self.backpressure_s + sum(c.local.emitter.waited_s() for _, chans in self.edges
                                         for c in chans if c.local is not None)

    def batch_rows(self) -> int | None:
        """The most records one batch from here should hold: what every paced edge (a
        rebalance to several instances) takes in ``CallPace.ENGAGE`` rounds of parts at its
        receivers' pace, the least over the edges; a chained step answers for its own
        outputs. None: no limit (no paced edge, or fast receivers)."""
        most: int | None = None
        for edge, chans in self.edges:
            caps = [c.local.emitter.batch_rows() if c.local is not None
                    else self._rows_for(c) for c in chans]
            limited = [c for c in caps if c is not None]
            if edge.partitioning in ("rebalance", "hash"):
                if len(limited) < len(caps):  # a channel without limit takes any batch
                    continue
                cap = sum(limited)
            elif limited:  # forward, broadcast: each channel gets the whole batch
                cap = min(limited)
            else:
                continue
            most = cap if most is None else min(most, cap)
        return most

    def emit_eos(self, drain: bool = True) -> None:
        """Tell every connected downstream instance that this instance is done."""
        self.emit_control(EndOfStream(*self.source, drain))

    def emit_control(self, msg: Any) -> None:
        """Send a marker (end of stream, barrier, tick) on every channel, in order with the
        batches before it."""
        for _, chans in self.edges:
            for chan in chans:
                self._send(chan, msg, 0)

    def emit_barrier(self, barrier: Barrier) -> dict[tuple[str, int], tuple]:
        """Pass ``barrier`` on to every downstream instance. Aligned (and for savepoints), in
        order with the batches; unaligned, out of band: it reaches a remote receiver on its
        barrier thread, ahead of the batches queued there, and the batches sent on that
        channel and not yet seen handled are returned, ``{receiver: ((seq, batch), ...)}``,
        to be stored with the checkpoint (see :mod:`rayflow.runtime.inflight`). A chained
        receiver gets it in order: it handled everything sent to it already."""
        held: dict[tuple[str, int], tuple] = {}
        for _, chans in self.edges:
            for chan in chans:
                if chan.local is not None or not self.unaligned or barrier.stop_after:
                    self._send(chan, barrier, 0)
                    continue
                while chan.window and self._complete_oldest(chan, block=False):
                    pass
                msgs = tuple((seq, b) for _, _, _, seq, b in chan.window if b is not None)
                if msgs:
                    held[chan.target] = msgs
                chan.handle.barrier.remote(barrier.checkpoint_id, self.source, chan.seq,
                                           chan.target)
                # and in the channel: the receiver must not handle what follows it before it
                # has the barrier (the out-of-band call may come late); a marker goes without
                # waiting for a free call
                self._send(chan, barrier, 0, wait=False)
        return held

    def wait_for_room(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Wait until every full channel (and those of the steps chained after this one) has
        a call finished, changing nothing: the next batch then goes out without waiting
        inside its handling. Unaligned checkpoints wait here, outside the host's data lock,
        so that an overtaking barrier can snapshot while the instance is held back by a slow
        receiver. Returns early when ``stop()`` (checked every 50 ms)."""
        t0 = time.perf_counter()
        while not stop():
            refs = self._full_heads()
            if not refs:
                break
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.05, fetch_local=False)
            if len(ready) == len(refs):
                break
        self.backpressure_s += time.perf_counter() - t0

    def _full_heads(self) -> list:
        """The oldest call of every channel that has no room for one more."""
        refs = []
        for _, chans in self.edges:
            for chan in chans:
                if chan.local is not None:
                    if chan.local.emitter is not None:
                        refs += chan.local.emitter._full_heads()
                    continue
                window = chan.window
                calls = window_calls(self.max_calls, self.target_s, chan.service_s)
                if len(window) >= calls or chan.bytes > self.max_bytes:
                    try:
                        refs.append(window[0][0])
                    except IndexError:  # retired meanwhile
                        pass
        return refs

    def drain(self) -> None:
        """Wait for every in-flight call to finish; raise the first downstream error."""
        for _, chans in self.edges:
            for chan in chans:
                while chan.window:
                    self._complete_oldest(chan, block=True)

    def idle(self) -> bool:
        """True when no call is in flight on any channel (finished ones are retired first):
        then a partial batch may go at once without hurting throughput."""
        for _, chans in self.edges:
            for chan in chans:
                if chan.local is not None:  # chained: idle when its own outputs are
                    if not chan.local.emitter.idle():
                        return False
                    continue
                while chan.window and self._complete_oldest(chan, block=False):
                    pass
                if chan.window:
                    return False
        return True

    def inflight_bytes(self) -> int:
        return sum(c.bytes for _, chans in self.edges for c in chans)

    def _rows_for(self, chan: _Channel, left: int = 0) -> int | None:
        """Records for the next part to ``chan``, ``left`` records still to go (0: a look,
        not a part that goes); calls that finished are retired first, so their durations
        count. A chained step takes any size: it runs in this thread.

        Slow start: a channel whose receiver has not been measured yet gets one first part;
        a second part waits for that call to finish and show the pace, so that neither a
        slow receiver gets a window of guesses nor a fast one a run of small calls."""
        pace = chan.pace
        if chan.local is not None or pace.target_s <= 0:
            return None
        while chan.window and self._complete_oldest(chan, block=False):
            pass
        if pace.per_record_s is not None and pace.per_record_s < pace.SLOW_RECORD_S:
            return None  # a fast receiver: whole batches
        if not left:
            n = pace.rows()  # a source polls what takes about ENGAGE targets
            return None if n is None else n * pace.ENGAGE
        if pace.per_record_s is not None and \
                pace.fixed_s + pace.per_record_s * left <= pace.ENGAGE * pace.target_s:
            return None  # not worth parts: what is left costs the receiver little
        if pace.per_record_s is None and not pace.blind and left > pace.FIRST_ROWS:
            t0 = time.perf_counter()
            while pace.per_record_s is None and not pace.blind and \
                    any(w[2] for w in chan.window):
                self._complete_oldest(chan, block=True)
            self.backpressure_s += time.perf_counter() - t0
        return pace.next_part()

    def _send_parts(self, chans: list[_Channel], batch: Batch, size: int,
                    edge: int | None = None) -> None:
        """Send ``batch`` in parts the receivers' pace allows: to ``chans[0]``, or, for
        rebalance edge number ``edge``, each part to the channel with the fewest calls in
        flight (Flink's rebalance spreads records; this spreads parts to where they are
        taken soonest)."""
        n = len(batch)

        def choose() -> int:
            if edge is None:
                return 0
            self._retire(chans)
            i = least_loaded([len(c.window) for c in chans], self._rr[edge])
            self._rr[edge] = i + 1
            return i

        for ch, lo, hi in deal(n, lambda c, left: self._rows_for(chans[c], left), choose):
            self._send(chans[ch], _part(batch, lo, hi), size if hi - lo == n
                       else size * (hi - lo) // n)

    def _retire(self, chans: list[_Channel]) -> None:
        """Retire the finished calls of ``chans``, one ``ray.wait`` a round for all."""
        while True:
            heads = {c.window[0][0]: c for c in chans if c.window}
            if not heads:
                return
            ready, _ = ray.wait(list(heads), num_returns=len(heads), timeout=0,
                                fetch_local=False)
            if not ready:
                return
            for ref in ready:
                self._complete_oldest(heads[ref], block=True)  # done: does not wait

    def _send(self, chan: _Channel, msg: Any, size: int, wait: bool = True) -> None:
        if chan.local is not None:  # chained: a plain call, in this thread
            t0 = time.perf_counter()
            chan.local.push(msg, self.source, chan.seq)
            self.chained_s += time.perf_counter() - t0
            chan.seq += 1
            if size:
                self.batches_out += 1
                self.bytes_out += size
            return
        # retire finished calls first: cheap, and surfaces downstream errors early
        while chan.window and self._complete_oldest(chan, block=False):
            pass
        calls = window_calls(self.max_calls, self.target_s, chan.service_s)
        if wait and chan.window and (len(chan.window) >= calls
                                     or chan.bytes + size > self.max_bytes):
            t0 = t = time.perf_counter()
            while chan.window and (len(chan.window) >= calls
                                   or chan.bytes + size > self.max_bytes):
                self._complete_oldest(chan, block=True)
                # waiting on a full window, each completion shows the receiver's pace
                now = time.perf_counter()
                chan.service_s = now - t if not chan.service_s else \
                    0.7 * chan.service_s + 0.3 * (now - t)
                t = now
                calls = window_calls(self.max_calls, self.target_s, chan.service_s)
            self.backpressure_s += time.perf_counter() - t0
        ref = chan.handle.push.remote(msg, self.source, chan.seq, chan.target)
        kept = msg if self.unaligned and isinstance(msg, Batch) else None
        chan.window.append((ref, size, len(msg) if isinstance(msg, Batch) else 0, chan.seq,
                            kept))
        chan.seq += 1
        chan.bytes += size
        if size:
            self.batches_out += 1
            self.bytes_out += size

    def _complete_oldest(self, chan: _Channel, block: bool) -> bool:
        ref, size, rows, _, _ = chan.window[0]
        if not block:
            ready, _ = ray.wait([ref], timeout=0, fetch_local=False)
            if not ready:
                return False
        try:
            took = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - re-raised as the root cause
            raise unwrap(exc) from None
        chan.window.popleft()
        chan.bytes -= size
        if rows:
            if isinstance(took, float):  # the receiver's own seconds for this call
                chan.pace.observe(rows, took)
            else:
                chan.pace.blind = True
        return True
