"""Same-node channels in shared memory: one ring per sender and receiver, a pipe to wake one.

Usage: ``ring = Ring.create(1 << 20); peer = Ring.attach(ring.address)``

Every piece is an anonymous file (``memfd_create``) or a pipe. A peer opens it through
``/proc/<pid>/fd/<fd>`` of its owner while the owner lives, so nothing is ever named in
``/dev/shm``: the kernel frees the memory when the last process that maps it closes it or
dies, and a killed gang cannot leak shared memory.

A :class:`Ring` has one producer and one consumer. Positions are byte counters that only
grow; the producer writes a record, then publishes the new tail, the consumer reads it,
then publishes the new head. Each counter is one aligned 8-byte word written by one side,
and x86-64 keeps stores in order and loads in order (TSO), so the reader of a tail always
sees the bytes written before it. Other architectures need fences that Python cannot
issue: :func:`available` says whether this machine qualifies, and the transport uses TCP
where it does not.

A record that does not fit in the ring (a large array) travels in a :class:`Segment`, a
shared-memory file that the sender fills and reuses once the receiver has copied the
message out; the ring carries its address.
"""

from __future__ import annotations

import mmap
import os
import platform
import secrets
from collections.abc import Sequence

#: Default bytes of one ring (memory is only touched as messages pass through it).
RING_BYTES = 1 << 20
_HEADER = 128  # tail at byte 0, head at byte 64: separate cache lines
_LEN = 8  # record length prefix
_TOKEN = 16  # segment identity check


def available() -> bool:
    """Whether rings are safe here: Linux, memfd, and x86-64's store ordering."""
    return (
        hasattr(os, "memfd_create")
        and platform.machine().lower() in ("x86_64", "amd64")
        and os.path.isdir("/proc/self/fd")
    )


def _pad(n: int) -> int:
    return (n + 7) & ~7


def _open_peer_fd(pid: int, fd: int, flags: int) -> int:
    """Open a file that process ``pid`` holds as ``fd`` (a memfd or a pipe end)."""
    return os.open(f"/proc/{pid}/fd/{fd}", flags | os.O_CLOEXEC)


class Ring:
    """A single-producer, single-consumer byte ring of length-prefixed records.

    Args:
        mm: the mapping (header plus ``capacity`` data bytes).
        capacity: data bytes, a power of two.
        fd: the owner's memfd, kept open so that peers can attach; ``None`` in a peer.
    """

    def __init__(self, mm: mmap.mmap, capacity: int, fd: int | None = None):
        self._mm = mm
        self.capacity = capacity
        self._mask = capacity - 1
        self._fd = fd
        self._ctl = memoryview(mm)[:_HEADER].cast("Q")
        self._data = memoryview(mm)[_HEADER : _HEADER + capacity]
        # cached counters: this side's own counter is never changed by the other side
        self._tail = self._ctl[0]
        self._head = self._ctl[8]
        self._next = self._head

    @classmethod
    def create(cls, capacity: int = RING_BYTES, name: str = "rayflow-ring") -> Ring:
        """A new ring in a fresh memfd, owned (and kept open) by this process."""
        if capacity < 4096 or capacity & (capacity - 1):
            raise ValueError(f"ring capacity must be a power of two >= 4096, got {capacity}")
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, _HEADER + capacity)
        return cls(mmap.mmap(fd, _HEADER + capacity), capacity, fd)

    @property
    def address(self) -> tuple[int, int, int]:
        """``(pid, fd, capacity)``: what a peer passes to :meth:`attach`."""
        if self._fd is None:
            raise RuntimeError("only the process that created a ring can hand out its address")
        return os.getpid(), self._fd, self.capacity

    @classmethod
    def attach(cls, address: Sequence[int]) -> Ring:
        """Map the ring created by another process of this node."""
        pid, fd, capacity = (int(x) for x in address)
        f = _open_peer_fd(pid, fd, os.O_RDWR)
        try:
            mm = mmap.mmap(f, _HEADER + capacity)
        finally:
            os.close(f)
        return cls(mm, capacity)

    def release_fd(self) -> None:
        """Close the owner's file descriptor (once every peer has attached)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -------------------------------------------------------------- producer
    def free(self) -> int:
        """Bytes a producer may write now."""
        return self.capacity - (self._tail - self._ctl[8])

    def try_write(self, parts: Sequence[memoryview | bytes], nbytes: int) -> bool:
        """Append one record made of ``parts`` (``nbytes`` in all); False if it does not fit.

        Each part is ``bytes`` or a flat byte view (``memoryview.cast("B")``).
        """
        need = _LEN + _pad(nbytes)
        if need > self.capacity - (self._tail - self._ctl[8]):
            return False
        pos = self._tail
        self._put(pos, nbytes.to_bytes(8, "little"))
        pos += _LEN
        for p in parts:
            self._put(pos, p)
            pos += len(p)
        self._tail += need
        self._ctl[0] = self._tail  # publish: one aligned 8-byte store
        return True

    def _put(self, pos: int, b: memoryview | bytes) -> None:
        # parts are bytes or flat byte views (PickleBuffer.raw())
        n = len(b)
        i = pos & self._mask
        if i + n <= self.capacity:
            self._data[i : i + n] = b
        else:
            first = self.capacity - i
            mv = memoryview(b)
            self._data[i:] = mv[:first]
            self._data[: n - first] = mv[first:]

    def try_write1(self, payload: bytes) -> bool:
        """:meth:`try_write` of a record of one ``bytes`` part (the small-message path)."""
        n = len(payload)
        need = _LEN + _pad(n)
        tail = self._tail
        if need > self.capacity - (tail - self._ctl[8]):
            return False
        self._put(tail, n.to_bytes(8, "little") + payload)
        self._tail = tail + need
        self._ctl[0] = self._tail
        return True

    # -------------------------------------------------------------- consumer
    def readable(self) -> bool:
        """Whether a record is waiting."""
        return self._ctl[0] != self._head

    def peek(self) -> memoryview | None:
        """The next record without consuming it (``None`` when the ring is empty).

        The view points into the ring, except for a record that wraps around its end (a
        private copy); it is valid until :meth:`commit`, which hands the space back.
        """
        head = self._head
        if self._ctl[0] == head:
            return None
        i = head & self._mask
        if i + _LEN <= self.capacity:
            n = int.from_bytes(self._data[i : i + _LEN], "little")
        else:
            n = int.from_bytes(self._get(head, _LEN), "little")
        self._next = head + _LEN + _pad(n)
        j = (head + _LEN) & self._mask
        if j + n <= self.capacity:
            return self._data[j : j + n]
        return memoryview(self._get(head + _LEN, n))

    def commit(self) -> None:
        """Consume the record returned by the last :meth:`peek`."""
        self._head = self._next
        self._ctl[8] = self._head  # hand the space back

    def read(self) -> bytearray | None:
        """Pop the next record (a private copy), or ``None`` when the ring is empty."""
        view = self.peek()
        if view is None:
            return None
        out = bytearray(view)
        self.commit()
        return out

    def _get(self, pos: int, n: int) -> bytearray:
        i = pos & self._mask
        first = min(n, self.capacity - i)
        if first == n:
            return bytearray(self._data[i : i + n])
        out = bytearray(n)
        out[:first] = self._data[i:]
        out[first:] = self._data[: n - first]
        return out

    def consumed(self) -> int:
        """The consumer's head as the producer sees it (bytes read so far)."""
        return self._ctl[8]

    @property
    def tail(self) -> int:
        return self._tail

    def close(self) -> None:
        """Unmap (and close the owner's descriptor); the ring must not be used afterwards."""
        self.release_fd()
        for view in (self._ctl, self._data):
            view.release()
        try:
            self._mm.close()
        except BufferError:  # a view still exported: the mapping goes with its last user
            pass


class Segment:
    r"""A shared-memory file for payloads too large for a ring, reused message after message.

    The sender :meth:`create`\ s one, :meth:`fill`\ s it with a message's parts and sends the
    returned address through the ring; the receiver maps it (:class:`SegmentMaps` keeps the
    mapping for the next message) and copies the parts out before it consumes the ring
    record, so once the ring's head has passed that record the sender may fill the segment
    again. The descriptor stays open while the sender keeps the segment (peers open it
    through ``/proc``).
    """

    def __init__(self, fd: int, size: int, mm: mmap.mmap, token: bytes):
        self.fd, self.size = fd, size
        self._mm = mm
        self.token = token

    @classmethod
    def create(cls, size: int, name: str = "rayflow-seg") -> Segment:
        """A new segment of at least ``size`` data bytes."""
        size = _TOKEN + max(int(size), 0)
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
        except BaseException:
            os.close(fd)
            raise
        token = secrets.token_bytes(_TOKEN)
        mm[:_TOKEN] = token
        return cls(fd, size, mm, token)

    @property
    def capacity(self) -> int:
        """Data bytes the segment holds (parts are cache-line aligned: see :meth:`need`)."""
        return self.size - _TOKEN

    @staticmethod
    def need(parts: Sequence[memoryview]) -> int:
        """Data bytes that :meth:`fill` needs for ``parts``."""
        pos = _TOKEN
        for p in parts:
            pos = ((pos + 63) & ~63) + p.nbytes
        return pos - _TOKEN

    def fill(self, parts: Sequence[memoryview]) -> tuple:
        """Copy ``parts`` (flat byte views) in; returns the address :meth:`open` takes."""
        offsets, pos = [], _TOKEN
        for p in parts:
            pos = (pos + 63) & ~63  # cache-line aligned arrays
            offsets.append((pos, p.nbytes))
            pos += p.nbytes
        if pos > self.size:
            raise ValueError(f"{pos - _TOKEN} bytes do not fit a segment of {self.capacity}")
        for (off, n), p in zip(offsets, parts):
            self._mm[off : off + n] = p
        return os.getpid(), self.fd, self.size, self.token, tuple(offsets)

    @classmethod
    def write(cls, parts: Sequence[memoryview], name: str = "rayflow-seg") -> tuple[Segment, tuple]:
        """A new segment holding ``parts``: ``(segment, address)``."""
        seg = cls.create(cls.need(parts), name)
        return seg, seg.fill(parts)

    def close(self) -> None:
        """Unmap and close the descriptor (receivers that mapped it keep their mapping)."""
        try:
            self._mm.close()
        except BufferError:  # pragma: no cover - no views of it are handed out
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass

    @property
    def mapping(self) -> mmap.mmap:
        """The whole segment, mapped (its first :data:`DATA` bytes are the token)."""
        return self._mm

    #: the first byte of a segment that is not its token, cache-line aligned
    DATA = 64

    @staticmethod
    def map(address: Sequence) -> mmap.mmap:
        """Map a segment another process made, whole (its address as :meth:`fill` returns
        it): what a window that ranks share is."""
        pid, fd, size, token, _ = address
        return _map_peer(pid, fd, size, token)

    @staticmethod
    def open(address: Sequence) -> list[memoryview]:
        """Map a segment another process wrote; returns views of its parts (no copy)."""
        pid, fd, size, token, offsets = address
        view = memoryview(_map_peer(pid, fd, size, token))
        return [view[off : off + n] for off, n in offsets]


def _map_peer(pid: int, fd: int, size: int, token: bytes) -> mmap.mmap:
    f = _open_peer_fd(pid, fd, os.O_RDWR)
    try:
        mm = mmap.mmap(f, size, flags=mmap.MAP_SHARED | _POPULATE)
    finally:
        os.close(f)
    if mm[:_TOKEN] != token:
        mm.close()
        raise RuntimeError(
            f"shared-memory segment {fd} of process {pid} is not the one sent "
            "(its sender closed it before this rank read the message)"
        )
    return mm


class SegmentMaps:
    """A receiver's mappings of its peers' segments, kept for the next message (a sender
    reuses its segments), at most ``keep`` of them; the least recently used goes first."""

    def __init__(self, keep: int = 8):
        self._keep = keep
        self._maps: dict[tuple, tuple[mmap.mmap, memoryview]] = {}

    def __len__(self) -> int:
        return len(self._maps)

    def views(self, address: Sequence) -> list[memoryview]:
        """Views of the parts at ``address`` (valid until the sender fills the segment again)."""
        pid, fd, size, token, offsets = address
        key = (pid, fd, token)
        got = self._maps.pop(key, None)
        if got is None:
            mm = _map_peer(pid, fd, size, token)
            got = (mm, memoryview(mm))
            while len(self._maps) >= self._keep:
                self._drop(next(iter(self._maps)))
        self._maps[key] = got  # most recently used last
        view = got[1]
        return [view[off : off + n] for off, n in offsets]

    def _drop(self, key: tuple) -> None:
        mm, view = self._maps.pop(key)
        view.release()
        try:
            mm.close()
        except BufferError:  # a caller still holds a view: the mapping goes with it
            pass

    def close(self) -> None:
        for key in list(self._maps):
            self._drop(key)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in at once (Linux)


class Doorbell:
    """A pipe that wakes a receiver sleeping in ``poll``; senders write one byte per message.

    The owner reads ``fileno()``; peers :meth:`attach` to ``address`` and :meth:`ring`.
    A full pipe means the receiver has plenty of wake-ups pending, so a full write is dropped.
    """

    def __init__(self):
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        return self._r

    @property
    def address(self) -> tuple[int, int]:
        return os.getpid(), self._w

    def drain(self) -> None:
        """Forget the wake-ups so far (call before checking the rings one last time)."""
        try:
            while len(os.read(self._r, 65536)) == 65536:
                pass
        except BlockingIOError:
            pass

    def ring(self) -> None:
        """Wake the owner (from its own process, e.g. on abort)."""
        ring_fd(self._w)

    @staticmethod
    def attach(address: Sequence[int]) -> int:
        """A write descriptor for the doorbell of another process of this node."""
        pid, fd = (int(x) for x in address)
        return _open_peer_fd(pid, fd, os.O_WRONLY | os.O_NONBLOCK)

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


def ring_fd(fd: int) -> None:
    """Write one wake-up byte to a doorbell descriptor (dropped when the pipe is full)."""
    try:
        os.write(fd, b"\0")
    except (BlockingIOError, BrokenPipeError):
        pass
