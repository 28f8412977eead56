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


@dataclass
class _Channel:
    handle: Any
    target: tuple[str, int]
    local: Any = None  # the receiving StepTask when it is chained into this actor
    window: deque = field(default_factory=deque)  # (ref, nbytes)
    bytes: int = 0
    seq: int = 0  # messages sent: the receiver restores their order (see StepHost.push)


class Emitter:
    """Sends one instance's output to its downstream steps."""

    def __init__(self, source: tuple[str, int], edges: list[OutEdge],
                 handles: dict[str, list[Any]], max_bytes: int, max_calls: int,
                 local: dict | None = None):
        self.source = source
        self.max_bytes, self.max_calls = max_bytes, max_calls
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
        if chan.window and (len(chan.window) >= self.max_calls
                            or chan.bytes + size > self.max_bytes):
            t0 = time.perf_counter()
            while chan.window and (len(chan.window) >= self.max_calls
                                   or chan.bytes + size > self.max_bytes):
                self._complete_oldest(chan, block=True)
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
