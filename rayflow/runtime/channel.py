"""Push channels with byte credits: how an instance sends batches downstream.

Each (downstream step, target instance) pair is a channel holding a window of in-flight
``push`` calls. A send first waits, oldest call first, until the channel has room for the
batch under both limits (bytes and calls): that wait is backpressure, and it is counted.
Because an instance's own ``push`` does not return while it waits, a slow step stalls its
producers all the way back to the sources, and memory stays bounded by the windows.
A batch larger than the whole byte window still goes out alone, so nothing deadlocks.

A channel to an instance chained into the same actor is a plain call instead: the receiver
handles the message in the sender's thread before ``emit`` returns, so it needs no window.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray

from rayflow.batches import Batch, EndOfStream, nbytes, partition_indices, take
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


@dataclass
class _Channel:
    handle: Any
    target: tuple[str, int]
    local: Any = None  # the receiving StepTask when it is chained into this actor
    window: deque = field(default_factory=deque)  # (ref, nbytes)
    bytes: int = 0
    seq: int = 0  # messages sent: the receiver restores their order (see StepHost.push)
    service_s: float = 0.0  # seconds the receiver takes per call of this channel (EWMA)


class Emitter:
    """Sends one instance's output to its downstream steps."""

    def __init__(self, source: tuple[str, int], edges: list[OutEdge],
                 handles: dict[str, list[Any]], max_bytes: int, max_calls: int,
                 local: dict | None = None, target_s: float = 0.0):
        self.source = source
        self.max_bytes, self.max_calls = max_bytes, max_calls
        self.target_s = target_s
        local = local or {}
        self.edges = [
            (e, [_Channel(handles[e.downstream][t], (e.downstream, t),
                          local.get((e.downstream, t))) for t in e.target_instances])
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
                        self._send(chan, part, nbytes(part.items))
                continue
            if size is None:
                size = nbytes(batch.items)
            if kind == "broadcast":
                for chan in chans:
                    self._send(chan, batch, size)
            elif kind == "rebalance" and len(chans) > 1:
                self._send(chans[self._rr[k] % len(chans)], batch, size)
                self._rr[k] += 1
            else:
                self._send(chans[0], batch, size)

    def emit_eos(self, drain: bool = True) -> None:
        """Tell every connected downstream instance that this instance is done."""
        self.emit_control(EndOfStream(*self.source, drain))

    def emit_control(self, msg: Any) -> None:
        """Send a marker (end of stream, barrier, tick) on every channel, in order with the
        batches before it."""
        for _, chans in self.edges:
            for chan in chans:
                self._send(chan, msg, 0)

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

    def _send(self, chan: _Channel, msg: Any, size: int) -> None:
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
        if chan.window and (len(chan.window) >= calls or chan.bytes + size > self.max_bytes):
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
        chan.seq += 1
        chan.window.append((ref, size))
        chan.bytes += size
        if size:
            self.batches_out += 1
            self.bytes_out += size

    def _complete_oldest(self, chan: _Channel, block: bool) -> bool:
        ref, size = chan.window[0]
        if not block:
            ready, _ = ray.wait([ref], timeout=0, fetch_local=False)
            if not ready:
                return False
        try:
            ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - re-raised as the root cause
            raise unwrap(exc) from None
        chan.window.popleft()
        chan.bytes -= size
        return True
