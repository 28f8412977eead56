"""One-sided communication (MPI's RMA windows) under :mod:`rayflow.hpc.MPI`: the server that
holds a process's windows, and the calls an origin makes to it. No Ray is imported here.

A process that creates a window starts one server thread (a ZeroMQ ROUTER socket), which
serves every window of that process: it applies the puts, gets and accumulates of origins
in the order they arrive, grants locks, and keeps the counts of MPI's post-start-complete-
wait epochs. An origin sends one request per operation (a socket per target server and
thread); it waits for the reply of a get, a lock or an epoch's step, and reads those of its
puts and accumulates at the next flush or synchronization, as MPI completes them there. A
target needs to make no MPI call for any of it to progress: it may compute, wait in a
collective, or have finished its program (MPI's passive target). One server
applies one request at a time, so accumulates to the same place are atomic, as MPI has
them, and an exclusive lock excludes every other origin's lock, the target's own included.

The pure parts (:class:`LockQueue`, :class:`Exposure`, :func:`apply`) are tested without
sockets.
"""

from __future__ import annotations

import pickle
import threading
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from rayflow.hpc.backends.channels import _local_ip

#: How long an origin waits for a server's reply before it reports the target as gone: a
#: lock or a start epoch may wait that long for another rank's unlock or post.
REPLY_TIMEOUT_S = 600.0


class RMAError(Exception):
    """An operation the target refused (out of the window, a type that does not match);
    ``error_class`` is MPI's (``MPI.ERR_RMA_RANGE`` ...)."""

    def __init__(self, message: str, error_class: int):
        super().__init__(message)
        self.error_class = error_class


ERR_ARG, ERR_RMA_SYNC, ERR_RMA_RANGE, ERR_WIN = 12, 50, 55, 45  # MPI's error classes


# ------------------------------------------------------------------------------ pure logic
class LockQueue:
    """The locks on one window of one target: any number of shared holders or one exclusive
    holder; requests that cannot be granted wait in order of arrival (a shared request
    behind a waiting exclusive one waits too, so an exclusive lock is not starved).

        >>> q = LockQueue()
        >>> q.request("a", exclusive=False), q.request("b", exclusive=True)
        (True, False)
        >>> q.request("c", exclusive=False)  # behind b
        False
        >>> q.release("a")
        ['b']
        >>> q.release("b")
        ['c']
    """

    def __init__(self) -> None:
        self.holders: dict[Any, bool] = {}  # origin -> exclusive
        self.waiting: deque[tuple[Any, bool]] = deque()

    def _fits(self, exclusive: bool) -> bool:
        if not self.holders:
            return True
        return not exclusive and not any(self.holders.values())

    def request(self, origin: Any, exclusive: bool) -> bool:
        """Whether ``origin`` holds the lock now; if not it waits (see :meth:`release`)."""
        if origin in self.holders or any(o == origin for o, _ in self.waiting):
            raise RMAError(f"rank {origin} locks a window it has locked already", ERR_RMA_SYNC)
        if not self.waiting and self._fits(exclusive):
            self.holders[origin] = exclusive
            return True
        self.waiting.append((origin, exclusive))
        return False

    def release(self, origin: Any) -> list:
        """``origin`` unlocks: the waiting origins that hold the lock now, in order."""
        if origin not in self.holders:
            raise RMAError(f"rank {origin} unlocks a window it has not locked", ERR_RMA_SYNC)
        del self.holders[origin]
        granted = []
        while self.waiting and self._fits(self.waiting[0][1]):
            o, exclusive = self.waiting.popleft()
            self.holders[o] = exclusive
            granted.append(o)
        return granted


class Exposure:
    """A target's post-start-complete-wait epochs: ``post(group)`` exposes the window to
    the origins of ``group``; each origin's ``start`` takes one post of it (waiting for it
    where the target has not posted yet), its ``complete`` ends its access; the target's
    ``wait`` returns once every origin of its post completed.

        >>> e = Exposure()
        >>> e.start(1)  # rank 1 starts before the target posted
        False
        >>> e.post([1, 2])
        [1]
        >>> e.start(2), e.done()
        (True, False)
        >>> e.complete(1), e.complete(2), e.done()
        (None, None, True)
    """

    def __init__(self) -> None:
        self.posts: Counter = Counter()  # origin -> posts it has not started on
        self.starting: list = []  # origins that wait for a post, in order
        self.open: Counter = Counter()  # origins of the current post yet to complete

    def post(self, group: list) -> list:
        """Expose to ``group``; the waiting origins that may start now."""
        if +self.open:
            raise RMAError("Win.Post while the window's last post still waits for its "
                           "origins (call Win.Wait first)", ERR_RMA_SYNC)
        self.open = Counter(group)
        self.posts.update(group)
        started, still = [], []
        for origin in self.starting:
            if self.posts[origin] > 0:
                self.posts[origin] -= 1
                started.append(origin)
            else:
                still.append(origin)
        self.starting = still
        return started

    def start(self, origin: Any) -> bool:
        """Whether ``origin`` may access now (else it waits for a post)."""
        if self.posts[origin] > 0:
            self.posts[origin] -= 1
            return True
        self.starting.append(origin)
        return False

    def complete(self, origin: Any) -> None:
        if self.open[origin] <= 0:
            raise RMAError(f"rank {origin} completes an access epoch the target did not "
                           f"post to it", ERR_RMA_SYNC)
        self.open[origin] -= 1

    def done(self) -> bool:
        """Whether every origin of the last post completed."""
        return not +self.open


def check_range(size: int, disp_unit: int, disp: int, dtype: np.dtype, count: int,
                where: str) -> tuple[int, int]:
    """The bytes ``(start, end)`` of ``count`` items of ``dtype`` at displacement ``disp``
    (in ``disp_unit`` bytes) of a window of ``size`` bytes; a range error past it."""
    start = int(disp) * disp_unit
    end = start + count * dtype.itemsize
    if disp < 0 or end > size:
        raise RMAError(f"{where}: {count} items of {dtype} at displacement {disp} (byte "
                       f"{start}) end past the window's {size} bytes", ERR_RMA_RANGE)
    return start, end


def _region(memory: np.ndarray, disp_unit: int, disp: int, dtype: np.dtype, count: int,
            where: str) -> np.ndarray:
    """The ``count`` items of ``dtype`` at displacement ``disp`` of a window's ``memory``
    (bytes), as a view."""
    start, end = check_range(memory.size, disp_unit, disp, dtype, count, where)
    return memory[start:end].view(dtype)


def apply(memory: np.ndarray, disp_unit: int, request: tuple,
          ops: Callable[[str], Callable]) -> Any:
    """Carry out a data request on a window's ``memory`` (a writable uint8 array) and
    return the reply: ``("put", disp, dtype, count, data)``, ``("get", disp, dtype,
    count)``, ``("acc", disp, dtype, count, data, op)``, ``("get_acc", disp, dtype, count,
    data, op)`` (the items before the op), ``("cas", disp, dtype, new, compare)`` (the item
    before). ``ops(name)`` is the element-wise function of an MPI operation's name.

        >>> mem = np.zeros(16, np.uint8)
        >>> apply(mem, 8, ("put", 1, np.dtype("f8"), 1, np.array([2.5])), None)
        >>> apply(mem, 8, ("get_acc", 1, np.dtype("f8"), 1, np.array([1.0]), "SUM"),
        ...       lambda name: np.add).tolist()
        [2.5]
        >>> mem.view("f8").tolist()
        [0.0, 3.5]
    """
    kind, disp, dtype = request[0], request[1], request[2]
    if kind == "cas":
        new, compare = request[3], request[4]
        region = _region(memory, disp_unit, disp, dtype, 1, "Compare_and_swap")
        old = region.copy()
        if old[0] == compare:
            region[0] = new
        return old
    count = request[3]
    region = _region(memory, disp_unit, disp, dtype, count, kind)
    if kind == "get":
        return region.copy()
    data = request[4]
    if kind == "put":
        region[:] = data
        return None
    old = region.copy() if kind == "get_acc" else None
    op = request[5]
    if op == "REPLACE":
        region[:] = data
    elif op != "NO_OP":
        region[:] = ops(op)(region, data)
    return old


# ------------------------------------------------------------------------------ the server
class _Target:
    """What the server keeps of one window of one rank."""

    def __init__(self, memory: np.ndarray, disp_unit: int):
        self.memory, self.disp_unit = memory, disp_unit
        self.locks = LockQueue()
        self.exposure = Exposure()
        self.lock_waiters: dict = {}  # origin -> the reply address its lock waits at
        self.start_waiters: dict = {}  # origin -> reply addresses
        self.wait_waiter: Any = None


class WindowServer:
    """The one server of this process (see the module docstring); :func:`server` starts it.
    Windows are registered under ``(window id, rank)``."""

    def __init__(self, ops: Callable[[str], Callable]):
        import zmq

        self._zmq = zmq
        self._ops = ops
        self._sock: Any = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # bound to this machine's address, as the ranks' channels are (not every interface)
        ip = _local_ip()
        port: int = self._sock.bind_to_random_port(f"tcp://{ip}")
        self.address = f"tcp://{ip}:{port}"
        self._windows: dict[tuple, _Target] = {}
        self._lock = threading.Lock()  # guards _windows (registered from other threads)
        self._thread = threading.Thread(target=self._serve, name="rayflow-mpi-rma",
                                        daemon=True)
        self._thread.start()

    def register(self, key: tuple, memory: np.ndarray, disp_unit: int) -> None:
        with self._lock:
            self._windows[key] = _Target(memory, disp_unit)

    def unregister(self, key: tuple) -> None:
        with self._lock:
            self._windows.pop(key, None)

    def windows(self) -> list[tuple]:
        with self._lock:
            return list(self._windows)

    def _reply(self, to: list, payload: Any) -> None:
        self._sock.send_multipart([*to, pickle.dumps(payload, protocol=5)])

    def _serve(self) -> None:
        sock = self._sock
        while True:
            try:
                frames = sock.recv_multipart()
            except self._zmq.ZMQError:  # the context was terminated: the process ends
                return
            to, body = frames[:-1], frames[-1]
            try:
                reply = self._handle(to, pickle.loads(body))
            except RMAError as exc:
                reply = ("error", str(exc), exc.error_class)
            except Exception as exc:  # noqa: BLE001 - reported to the origin, the server lives on
                reply = ("error", f"{type(exc).__name__}: {exc}", ERR_ARG)
            if reply is not _DEFERRED:
                self._reply(to, reply)

    def _target(self, key: tuple) -> _Target:
        with self._lock:
            t = self._windows.get(key)
        if t is None:
            raise RMAError(f"no window {key[0]} at rank {key[1]} (freed, or never created "
                           f"there)", ERR_WIN)
        return t

    def _handle(self, to: list, req: tuple) -> Any:
        kind, key, origin = req[0], req[1], req[2]
        t = self._target(key)
        if kind == "lock":
            if t.locks.request(origin, req[3]):
                return ("ok", None)
            t.lock_waiters[origin] = to
            return _DEFERRED
        if kind == "unlock":
            for o in t.locks.release(origin):
                self._reply(t.lock_waiters.pop(o), ("ok", None))
            return ("ok", None)
        if kind == "post":
            for o in t.exposure.post(req[3]):
                self._reply(t.start_waiters.pop(o).popleft(), ("ok", None))
            return ("ok", None)
        if kind == "start":
            if t.exposure.start(origin):
                return ("ok", None)
            t.start_waiters.setdefault(origin, deque()).append(to)
            return _DEFERRED
        if kind == "complete":
            t.exposure.complete(origin)
            if t.wait_waiter is not None and t.exposure.done():
                self._reply(t.wait_waiter, ("ok", True))
                t.wait_waiter = None
            return ("ok", None)
        if kind == "wait":
            if t.exposure.done():
                return ("ok", True)
            t.wait_waiter = to
            return _DEFERRED
        if kind == "test":
            return ("ok", t.exposure.done())
        return ("ok", apply(t.memory, t.disp_unit, req[3], self._ops))


_DEFERRED = object()
_server: list[WindowServer] = []
_server_lock = threading.Lock()


def server(ops: Callable[[str], Callable]) -> WindowServer:
    """This process's window server, started at the first call."""
    with _server_lock:
        if not _server:
            _server.append(WindowServer(ops))
        return _server[0]


def forget_windows() -> None:
    """Drop the windows a program left without freeing them: a rank process runs one
    program after another, and the next one starts only when every rank has ended the
    last, so no origin reaches them any more."""
    with _server_lock:
        for srv in _server:
            for key in srv.windows():
                srv.unregister(key)


# ------------------------------------------------------------------------------ the origin
class _Link:
    """One origin thread's socket to one server (a DEALER: requests go out one after the
    other, replies come back in their order), and how many replies of requests sent
    without waiting (:meth:`Client.post`) it has yet to read."""

    def __init__(self, url: str):
        import zmq

        self.sock: Any = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)
        self.pending = 0


class Client:
    """An origin's requests to the servers of a window's ranks, one link per server and
    thread (a rank's program thread and, in tests, ranks that are threads). ``call`` waits
    for its reply; ``post`` does not (a put or an accumulate, which MPI completes at the
    next flush or synchronization): ``flush`` reads the replies still owed, and ``call``
    reads them first, in order, so a rank's operations on a target stay in their order."""

    _local = threading.local()

    def __init__(self, addresses: list[str], timeout_s: float | None = None):
        self._urls = addresses  # each rank's server's address (WindowServer.address)
        self.timeout_s = REPLY_TIMEOUT_S if timeout_s is None else timeout_s

    def _link(self, rank: int) -> _Link:
        links = getattr(self._local, "links", None)
        if links is None:
            links = self._local.links = {}
        url = self._urls[rank]
        link = links.get(url)
        if link is None:
            link = links[url] = _Link(url)
        return link

    def _read(self, link: _Link, rank: int, what: str) -> tuple:
        if not link.sock.poll(int(self.timeout_s * 1000)):
            # a socket that owes a reply cannot be reused: the next one starts afresh
            self._local.links.pop(self._urls[rank]).sock.close(linger=0)
            raise TimeoutError(f"no reply from rank {rank}'s window server within "
                               f"{self.timeout_s:.0f}s ({what}): it died, or a lock or post "
                               f"it waits for never came")
        return pickle.loads(link.sock.recv_multipart()[-1])

    def _drain(self, link: _Link, rank: int) -> None:
        """Read the replies owed on ``link``; the first refusal among them is raised."""
        first = None
        while link.pending:
            reply = self._read(link, rank, "an earlier put or accumulate")
            link.pending -= 1
            if reply[0] == "error" and first is None:
                first = RMAError(reply[1], reply[2])
        if first is not None:
            raise first

    def post(self, rank: int, request: tuple) -> None:
        """Send ``request`` to ``rank``'s server without waiting for its reply."""
        link = self._link(rank)
        link.sock.send_multipart([b"", pickle.dumps(request, protocol=5)])
        link.pending += 1

    def flush(self, rank: int | None = None) -> None:
        """Wait until every request posted to ``rank`` (None: to any rank) is done."""
        links = getattr(self._local, "links", None) or {}
        for r in range(len(self._urls)) if rank is None else (rank,):
            link = links.get(self._urls[r])
            if link is not None and link.pending:
                self._drain(link, r)

    def call(self, rank: int, request: tuple) -> Any:
        """Send ``request`` to ``rank``'s server and return its reply (raises
        :class:`RMAError` for a refusal, ``TimeoutError`` when no reply comes)."""
        link = self._link(rank)
        self._drain(link, rank)
        link.sock.send_multipart([b"", pickle.dumps(request, protocol=5)])
        reply = self._read(link, rank, request[0])
        if reply[0] == "error":
            raise RMAError(reply[1], reply[2])
        return reply[1]
