"""The send side of direct channels: a link per peer (a shared-memory ring on the same node,
a ZeroMQ socket across nodes), reusable shared-memory segments for large payloads, and the
flusher thread that feeds a full ring as its receiver frees space (MPI's buffered send).
No Ray is imported by this module.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from rayflow.hpc.backends import shm
from rayflow.hpc.backends.wire import _II, _SEG_FLAG, _record, _snapshot

#: Payloads above this travel in a shared-memory segment rather than through the ring.
SEGMENT_BYTES = 256 * 1024
#: Segments are reused: a sender keeps up to this many free ones, of this many bytes in all
#: (a larger one is closed once read). Measured on a 2-core VM, 1 MiB: a fresh segment cost
#: 1.7 ms to create and fill (the kernel allocates and zeroes its pages) and 0.24 ms to map,
#: against ~0.1 ms to refill a reused one and copy it out.
POOL_SEGMENTS = 4
POOL_BYTES = 256 * 1024 * 1024


class _Segment:
    """A filled segment and how many receivers have yet to read it (then it is free)."""

    def __init__(self, seg: shm.Segment, address: tuple, readers: int, pool: _SegmentPool):
        self.seg, self.address = seg, address
        self.fd = seg.fd
        self._readers = readers
        self._pool = pool
        self._lock = threading.Lock()

    def read_by_one(self) -> None:
        with self._lock:
            self._readers -= 1
            last = self._readers == 0
        if last:
            self._pool.give_back(self.seg)


class _SegmentPool:
    """A sender's segments: a free one that is large enough is refilled, else a new one is
    made; a read one comes back (at most :data:`POOL_SEGMENTS` are kept free, of
    :data:`POOL_BYTES` in all; the oldest go first)."""

    def __init__(self) -> None:
        self._free: list[shm.Segment] = []
        self._lock = threading.Lock()
        self._closed = False
        self.sweep: Callable[[], None] = lambda: None  # find the segments read meanwhile
        self.created = 0  # segments made (a test counts them)

    def fill(self, parts: Sequence[memoryview], name: str, readers: int) -> _Segment:
        need = shm.Segment.need(parts)
        self.sweep()
        with self._lock:
            fits = [s for s in self._free if s.capacity >= need]
            seg = min(fits, key=lambda s: s.capacity) if fits else None
            if seg is not None:
                self._free.remove(seg)
        if seg is None:
            # a power of two from 64 KiB up to 1 MiB, then whole MiBs: a message a little
            # larger than the last one reuses its segment
            size = max(1 << 16, 1 << (need - 1).bit_length()) if need <= 1 << 20 else \
                -(-need // (1 << 20)) << 20
            seg = shm.Segment.create(size, name)
            self.created += 1
        try:
            return _Segment(seg, seg.fill(parts), readers, self)
        except BaseException:
            seg.close()
            raise

    def give_back(self, seg: shm.Segment) -> None:
        with self._lock:
            if self._closed or seg.capacity > POOL_BYTES:
                drop = [seg]
            else:
                self._free.append(seg)
                drop = []
                while (len(self._free) > POOL_SEGMENTS
                       or sum(f.capacity for f in self._free) > POOL_BYTES):
                    drop.append(self._free.pop(0))  # the oldest free one
        for s in drop:
            s.close()

    @property
    def free(self) -> int:
        return len(self._free)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for s in free:
            s.close()


class _ShmLink:
    """This rank's ring to one same-node peer, the peer's doorbell and the overflow queue."""

    kind = "shm"

    def __init__(self, ring: shm.Ring, bell_fd: int, seg_name: str, pool: _SegmentPool):
        self.ring, self.bell_fd, self.seg_name = ring, bell_fd, seg_name
        self.pool = pool
        self.lock = threading.Lock()
        self.pending: deque[tuple[list, int, _Segment | None]] = deque()
        self.segments: deque[tuple[int, _Segment]] = deque()  # (ring position read past, seg)

    def send(self, hdr: bytes, bufs: list[memoryview], nbytes: int, flusher: _Flusher,
             seg: _Segment | None = None) -> None:
        """Send one message; ``seg``: its payload already in a segment (shared by receivers)."""
        if self.segments:
            self._release_read_segments()
        # a record must fit the ring: anything larger (arrays, or a big pickle stream) goes
        # into a segment, header included
        limit = min(SEGMENT_BYTES, self.ring.capacity - 1024)
        if seg is None and len(hdr) + nbytes + 16 * (len(bufs) + 1) > limit:
            seg = self.pool.fill([memoryview(hdr), *bufs], self.seg_name, 1)
        if seg is None and not bufs:
            payload = _II.pack(len(hdr), 0) + hdr
            # only this thread adds to ``pending``, and the flusher writes only while it is
            # non-empty: with it empty, this thread is the ring's one producer
            if not self.pending and self.ring.try_write1(payload):
                shm.ring_fd(self.bell_fd)
                return
            parts, n = [payload], len(payload)
            with self.lock:
                if self.pending or not self.ring.try_write(parts, n):
                    self.pending.append((parts, n, None))
                    flusher.kick()
            shm.ring_fd(self.bell_fd)
            return
        if seg is not None:
            parts, n = _record(pickle.dumps(seg.address, protocol=5), (), _SEG_FLAG)
        else:
            parts, n = _record(hdr, bufs)
        with self.lock:
            if self.pending or not self.ring.try_write(parts, n):
                self.pending.append((_snapshot(parts), n, seg))
                flusher.kick()
            elif seg is not None:
                self.segments.append((self.ring.tail, seg))
        shm.ring_fd(self.bell_fd)

    def flush(self) -> bool:
        """Move queued records into the ring; True while some remain."""
        with self.lock:
            wrote = False
            while self.pending:
                parts, n, seg = self.pending[0]
                if not self.ring.try_write(parts, n):
                    break
                self.pending.popleft()
                wrote = True
                if seg is not None:
                    self.segments.append((self.ring.tail, seg))
            left = bool(self.pending)
        if wrote:
            shm.ring_fd(self.bell_fd)
        return left

    def _release_read_segments(self) -> None:
        # a segment is free once the receiver has read past its record (it copied the
        # message out before moving its head)
        if not self.segments:
            return
        with self.lock:
            read = self.ring.consumed()
            while self.segments and self.segments[0][0] <= read:
                self.segments.popleft()[1].read_by_one()

    def close(self) -> None:
        with self.lock:
            for _, _, seg in self.pending:
                if seg is not None:
                    seg.read_by_one()
            self.pending.clear()
            while self.segments:
                self.segments.popleft()[1].read_by_one()
        self.ring.close()
        try:
            os.close(self.bell_fd)
        except OSError:
            pass


class _TcpLink:
    """A ZeroMQ PUSH socket to a peer on another node (ZeroMQ queues while it is busy)."""

    kind = "tcp"

    def __init__(self, sock: Any, rank: int):
        self.sock = sock
        self._src = rank.to_bytes(4, "little")
        self.lock = threading.Lock()

    def send(self, hdr: bytes, bufs: list[memoryview], nbytes: int, flusher: _Flusher) -> None:
        # copy=True: ZeroMQ copies every frame before returning (the buffered send's snapshot)
        with self.lock:
            self.sock.send_multipart([self._src, hdr, *bufs], copy=True)

    def flush(self) -> bool:
        return False

    def close(self) -> None:
        self.sock.close(linger=0)


class _Flusher:
    """A background thread that feeds queued records into full rings as space frees up."""

    def __init__(self, links: Sequence[Any]):
        self._links = [lk for lk in links if lk is not None and lk.kind == "shm"]
        self._cond = threading.Condition()
        self._wanted = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def kick(self) -> None:
        with self._cond:
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rayflow-flush",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        pause = 20e-6
        while True:
            with self._cond:
                while not self._wanted and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._wanted = False
            left = False
            for lk in self._links:
                left |= lk.flush()
            if left:
                with self._cond:
                    self._wanted = True
                time.sleep(pause)  # the receiver frees space at its own pace
                pause = min(pause * 2, 1e-3)
            else:
                pause = 20e-6

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
