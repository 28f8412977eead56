"""Push channels with byte credits: how an instance sends batches downstream.

Each (downstream step, target instance) pair is a channel holding a window of in-flight
``push`` calls. A send first waits, oldest call first, until the channel has room for the
batch under both limits (bytes and calls): that wait is backpressure, and it is counted.
Because an instance's own ``push`` does not return while it waits, a slow step stalls its
producers all the way back to the sources, and memory stays bounded by the windows.
A batch larger than the whole byte window still goes out alone, so nothing deadlocks.

Batches follow the receiver's pace. A receiver answers each ``push`` with the seconds it
took, and the channel fits the cost of a call, ``fixed_s + per_record_s * rows``, to the last
few (:class:`~rayflow.runtime.pace.CallPace`; the first call, a warm-up, is left out; the
pacing logic is pure, in :mod:`rayflow.runtime.pace`). Only a rebalance edge to more
than one instance is paced: there a batch that would cost a receiver more than
``CallPace.ENGAGE`` times ``batch_target_s`` divided by the instances goes in parts
(:func:`deal`) of about ``batch_target_s`` each, its last part too, each part to the
instance with the fewest records in flight (round-robin among equals), so a slow step
spreads evenly (Flink spreads records, not batches), and a source polls no more than its
channels take in ``ENGAGE`` rounds. Other edges, and receivers faster than
``CallPace.SLOW_RECORD_S`` a record, keep whole batches.

A channel to an instance chained into the same actor is a plain call instead: the receiver
handles the message in the sender's thread before ``emit`` returns, so it needs no window.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from rayflow.core.messages import Barrier, EndOfStream
from rayflow.core.records import Batch, nbytes, partition_indices, take
from rayflow.runtime.pace import CallPace, deal, least_loaded, window_calls
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

    def _rows_for(self, chan: _Channel, left: int = 0, whole: int | None = None,
                  spread: int = 1) -> int | None:
        """Records for the next part to ``chan``, ``left`` records still to go of a batch of
        ``whole`` (default ``left``; ``left`` 0: a look, not a part that goes) that could be
        spread over ``spread`` instances; calls that finished are retired first, so their
        durations count. A chained step takes any size: it runs in this thread.

        A batch whose whole would cost the receiver no more than ``ENGAGE`` targets over
        ``spread`` goes whole; a larger one goes in parts at the pace to its end. (With
        ``ENGAGE`` targets whatever the instances, the last batch of W3's stream at
        parallelism 2, 560 records of 1.1 ms, went whole to one instance: 0.5 s of work for
        it alone at the end, 0.93 of twice one instance's rate.) (Sending the rest of a
        large batch whole, once it cost less than ``ENGAGE`` targets, gave one instance up
        to a second of work while the others idled at the end of a stream: W3 at parallelism
        8 ran at 0.59 of eight times one instance's rate on 16 cores, 0.78 on 2.) A rest of
        at most one and a half parts goes as one, rather than leaving a sliver.

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
        if pace.per_record_s is not None and pace.fixed_s + pace.per_record_s * \
                (left if whole is None else whole) <= pace.ENGAGE * pace.target_s / spread:
            return None  # not worth parts: the batch costs the receiver little
        if pace.per_record_s is None and not pace.blind and left > pace.FIRST_ROWS:
            t0 = time.perf_counter()
            while pace.per_record_s is None and not pace.blind and \
                    any(w[2] for w in chan.window):
                self._complete_oldest(chan, block=True)
            self.backpressure_s += time.perf_counter() - t0
        n = pace.next_part()
        return None if n is not None and 2 * left <= 3 * n else n

    def _send_parts(self, chans: list[_Channel], batch: Batch, size: int,
                    edge: int | None = None) -> None:
        """Send ``batch`` in parts the receivers' pace allows: to ``chans[0]``, or, for
        rebalance edge number ``edge``, each part to the channel with the fewest records in
        flight (Flink's rebalance spreads records; this spreads parts to where they are
        taken soonest, and a channel holding a large part counts as busier than one holding
        a small one)."""
        n = len(batch)

        def choose() -> int:
            if edge is None:
                return 0
            self._retire(chans)
            i = least_loaded([sum(w[2] for w in c.window) for c in chans], self._rr[edge])
            self._rr[edge] = i + 1
            return i

        for ch, lo, hi in deal(n, lambda c, left: self._rows_for(chans[c], left, n, len(chans)),
                               choose):
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
