"""Direct rank-to-rank channels: shared-memory rings on one node, TCP (ZeroMQ) across nodes.

Usage: ``ep = Endpoint(rank, infos); t = ep.connect(addresses, Mailbox(), stage="s")``

A gang's ranks meet once through Ray (:func:`rayflow.hpc.backends.ray_backend.join_group` exchanges
each rank's :class:`Endpoint` address); after that a message never goes through Ray:

- **same node**: the sender pickles ``(stage, key, obj)`` with protocol 5, writes the header
  and the arrays' raw bytes into its ring to the receiver (:mod:`rayflow.hpc.backends.shm`), and
  rings the receiver's doorbell. A payload of more than ``SEGMENT_BYTES`` goes into a
  shared-memory segment of its own, which the receiver maps and reads without a copy.
- **other nodes**: a ZeroMQ PUSH socket to the receiver's PULL socket, one frame per array.

The receiving rank's own thread reads its channels inside ``recv`` (no delivery thread, no
thread hand-off): it spins for ``SPIN_S`` (on a node with more ranks than cores it yields
the core for ``YIELD_S`` instead), then sleeps in ``poll`` on its doorbell (and its TCP
socket). Messages for other keys are kept in the :class:`Mailbox` until asked for, so
matching is by key, never by arrival order. A full ring never blocks a sender: the message
waits in a queue that a background thread feeds to the ring as the receiver frees space
(MPI's buffered send). ``Mailbox.abort`` wakes a rank sleeping on a dead peer with
:class:`StageAborted`.

No Ray is imported by this module.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rayflow.hpc.backends import links as _links
from rayflow.hpc.backends import shm
from rayflow.hpc.backends.links import _Flusher, _SegmentPool, _ShmLink, _TcpLink
from rayflow.hpc.backends.wire import _decode_record, _encode, _message

#: Spin this long on an empty channel before sleeping in ``poll``. Measured on a 2-core VM
#: (2 ranks, scalar allreduce): 50 us of spinning gave ~130 us per allreduce, since the wake-up
#: from ``poll`` cost more than the wait; 2 ms gave 12-29 us. MPICH spins without limit.
#: Ranks do not spin when their node has more ranks than cores: they yield the core instead.
SPIN_S = 2e-3
#: Where a node has more ranks than cores, a waiting rank calls ``sched_yield`` for this long
#: before it sleeps: the rank it waits for gets the core at once, without a wake-up from
#: ``poll``. 4 ranks on 2 cores, medians of 4 runs each (sleeping at once / 2 ms of yields):
#: scalar allreduce 252-307 / 160-174 us, barrier 224-294 / 111-152 us, 1 MiB allreduce
#: 1,326-1,972 / 1,054-1,679 us.
YIELD_S = 2e-3
_MISSING = object()


class StageAborted(RuntimeError):
    """Raised in a surviving rank blocked on a dead peer, so that the rank can be reused."""


class Mailbox:
    """Messages read from the channels but not asked for yet, by stage and (source, key).

    Also the stage's abort flag: :meth:`abort` may be called from another thread (the rank
    actor's control methods) and wakes every transport that registered a waker.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._boxes: dict[str, dict[tuple[int, Any], Any]] = {}
        self._aborted: set[str] = set()
        self._wakers: list[Callable[[], None]] = []

    def put(self, stage: str, src: int, key: Any, obj: Any) -> None:
        with self._lock:
            self._boxes.setdefault(stage, {})[(src, key)] = obj

    def pop(self, stage: str, src: int, key: Any) -> Any:
        """The message, removed; the module's ``_MISSING`` sentinel when it has not arrived."""
        box = self._boxes.get(stage)
        if not box:
            return _MISSING
        with self._lock:
            return box.pop((src, key), _MISSING)

    def pending(self, stage: str) -> int:
        """How many messages of ``stage`` wait unread."""
        return len(self._boxes.get(stage, ()))

    def aborted(self, stage: str) -> bool:
        return stage in self._aborted

    def forget_other_stages(self, stage: str) -> None:
        """Drop messages left over from earlier stages on this (reused) gang."""
        with self._lock:
            for s in [s for s in self._boxes if s != stage]:
                del self._boxes[s]
            self._aborted.intersection_update({stage})

    def abort(self, stage: str) -> None:
        """Make every ``recv`` of ``stage`` (waiting now or later) raise :class:`StageAborted`."""
        with self._lock:
            self._aborted.add(stage)
            wakers = list(self._wakers)
        for wake in wakers:
            wake()

    def add_waker(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wakers.append(wake)

    def remove_waker(self, wake: Callable[[], None]) -> None:
        with self._lock:
            if wake in self._wakers:
                self._wakers.remove(wake)


# ------------------------------------------------------------------ endpoint and transport
def node_info(node_id: str, ip: str | None = None) -> dict:
    """What a rank tells its peers before they build channels: its node, address and pid."""
    return {"node": node_id, "ip": ip or _local_ip(), "pid": os.getpid()}


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Endpoint:
    """The receiving half of a rank's channels, built before the peers connect.

    Args:
        rank: this rank.
        infos: every rank's :func:`node_info`, index = rank.
        mode: ``"auto"`` (shared memory with same-node peers, TCP with the others), or
            ``"tcp"`` (TCP with everyone, e.g. to test the cross-node path on one node).
        ring_bytes: bytes of each inbound ring.
        name: a label for the shared-memory files (shown in ``/proc/<pid>/maps``).
    """

    def __init__(self, rank: int, infos: Sequence[dict], mode: str = "auto",
                 ring_bytes: int = shm.RING_BYTES, name: str = "rayflow"):
        if mode not in ("auto", "tcp"):
            raise ValueError(f"unknown channel mode {mode!r}; use 'auto' or 'tcp'")
        self.rank, self.size = rank, len(infos)
        self.name = name
        me = infos[rank]
        local = mode == "auto" and shm.available()
        self.kinds = [
            None if r == rank else ("shm" if local and info["node"] == me["node"] else "tcp")
            for r, info in enumerate(infos)
        ]
        # more ranks on this node than cores: a spinning rank would hold the core that the
        # rank it waits for needs, so it yields the core, then sleeps
        here = sum(info["node"] == me["node"] for info in infos)
        self.spin_s = SPIN_S if here <= _cores() else 0.0
        self.yield_s = 0.0 if here <= _cores() else YIELD_S
        self.bell = shm.Doorbell()
        self.rings: dict[int, shm.Ring] = {}
        self.pull: Any = None
        self._tcp_address = None
        try:
            for r, kind in enumerate(self.kinds):
                if kind == "shm":
                    self.rings[r] = shm.Ring.create(ring_bytes, f"{name}-from{r}-to{rank}")
            if "tcp" in self.kinds:
                import zmq

                self.pull = zmq.Context.instance().socket(zmq.PULL)
                self.pull.setsockopt(zmq.RCVHWM, 0)
                self.pull.setsockopt(zmq.LINGER, 0)
                port = self.pull.bind_to_random_port(f"tcp://{me['ip']}")
                self._tcp_address = f"tcp://{me['ip']}:{port}"
        except BaseException:
            self._close_inbound()
            raise

    @property
    def address(self) -> dict:
        """What the peers need to connect: rings by source, doorbell, TCP address."""
        return {
            "rings": {r: ring.address for r, ring in self.rings.items()},
            "bell": self.bell.address,
            "tcp": self._tcp_address,
        }

    def connect(self, addresses: Sequence[dict], mailbox: Mailbox, stage: str = "",
                timeout_s: float = 600.0) -> DirectTransport:
        """Open the sending half to every peer (``addresses`` index = rank)."""
        links: list[Any] = [None] * self.size
        pool = _SegmentPool()
        try:
            for d, kind in enumerate(self.kinds):
                if kind == "shm":
                    ring = shm.Ring.attach(addresses[d]["rings"][self.rank])
                    links[d] = _ShmLink(ring, shm.Doorbell.attach(addresses[d]["bell"]),
                                        f"{self.name}-seg{self.rank}-to{d}", pool)
                elif kind == "tcp":
                    import zmq

                    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
                    sock.setsockopt(zmq.SNDHWM, 0)  # never block a buffered send
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.connect(addresses[d]["tcp"])
                    links[d] = _TcpLink(sock, self.rank)
        except BaseException:
            for lk in links:
                if lk is not None:
                    lk.close()
            pool.close()
            self._close_inbound()
            raise
        return DirectTransport(_Channels(self, links, pool), mailbox, stage, timeout_s)

    def _close_inbound(self) -> None:
        for ring in self.rings.values():
            ring.close()
        self.rings = {}
        self.bell.close()
        if self.pull is not None:
            self.pull.close(linger=0)
            self.pull = None


class _Channels:
    """A rank's open channels to one group (shared by the per-stage transport views)."""

    def __init__(self, ep: Endpoint, links: list[Any], pool: _SegmentPool):
        self.rank, self.size = ep.rank, ep.size
        self.kinds = ep.kinds
        self.spin_s = ep.spin_s
        self.yield_s = ep.yield_s
        self.rings = ep.rings
        self.bell = ep.bell
        self.pull = ep.pull
        self.links = links
        self.pool = pool
        shm_links = [lk for lk in links if lk is not None and lk.kind == "shm"]

        def sweep() -> None:
            for lk in shm_links:
                lk._release_read_segments()

        pool.sweep = sweep
        self.maps = shm.SegmentMaps()  # the peers' segments this rank has mapped
        self.flusher = _Flusher(links)
        self.closed = False
        if self.pull is not None:
            import zmq

            self._zmq = zmq
            self.poller: Any = zmq.Poller()
            self.poller.register(self.bell.fileno(), zmq.POLLIN)
            self.poller.register(self.pull, zmq.POLLIN)
        else:
            self.poller = select.poll()
            self.poller.register(self.bell.fileno(), select.POLLIN)

    def release_fds(self) -> None:
        """Close the descriptors the peers opened through ``/proc`` (all have connected)."""
        for ring in self.rings.values():
            ring.release_fd()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.flusher.close()
        for lk in self.links:
            if lk is not None:
                lk.close()
        self.pool.close()
        self.maps.close()
        for ring in self.rings.values():
            ring.close()
        self.bell.close()
        if self.pull is not None:
            self.pull.close(linger=0)


class DirectTransport:
    """The transport of :mod:`rayflow.hpc.comm` over direct channels; see the module doc."""

    backend = "ray"

    def __init__(self, channels: _Channels, mailbox: Mailbox, stage: str, timeout_s: float):
        self._ch = channels
        self._box = mailbox
        self.rank, self.size = channels.rank, channels.size
        self.stage = stage
        self.timeout_s = timeout_s
        self._wake = channels.bell.ring
        mailbox.add_waker(self._wake)

    @property
    def kinds(self) -> list[str | None]:
        """The channel to each rank: ``"shm"``, ``"tcp"``, or ``None`` for this rank."""
        return list(self._ch.kinds)

    def release_fds(self) -> None:
        """Close the descriptors the peers opened through ``/proc`` (call once all connected)."""
        self._ch.release_fds()

    def for_stage(self, stage: str) -> DirectTransport:
        """The same channels, with messages scoped to ``stage``."""
        view = DirectTransport.__new__(DirectTransport)
        view.__dict__.update(self.__dict__)
        view.stage = stage
        return view

    # ------------------------------------------------------------------ sending
    def send(self, dest: int, key: Any, obj: Any) -> None:
        if dest == self.rank:
            snap = obj.copy() if isinstance(obj, np.ndarray) else obj  # a send snapshots
            self._box.put(self.stage, self.rank, key, snap)
            return
        self._check_open()
        hdr, bufs = _encode(self.stage, key, obj)
        self._link(dest).send(hdr, bufs, sum(b.nbytes for b in bufs), self._ch.flusher)

    def send_many(self, dests: Sequence[int], key: Any, obj: Any) -> None:
        others = [d for d in dests if d != self.rank]
        if len(others) < len(dests):
            self.send(self.rank, key, obj)
        if not others:
            return
        self._check_open()
        hdr, bufs = _encode(self.stage, key, obj)  # serialised once for all peers
        n = sum(b.nbytes for b in bufs)
        links = [self._link(d) for d in others]
        local = [lk for lk in links if lk.kind == "shm"]
        seg = None
        if len(local) > 1 and len(hdr) + n > min(_links.SEGMENT_BYTES, *(lk.ring.capacity - 1024 for lk in local)):
            # one copy, mapped by every local receiver
            seg = self._ch.pool.fill([memoryview(hdr), *bufs],
                                     f"{local[0].seg_name.rsplit('-to', 1)[0]}-many", len(local))
        for lk in links:
            if lk.kind == "shm":
                lk.send(hdr, bufs, n, self._ch.flusher, seg)
            else:
                lk.send(hdr, bufs, n, self._ch.flusher)

    def _link(self, dest: int) -> Any:
        if not 0 <= dest < self.size:
            raise ValueError(f"destination rank {dest} out of range for {self.size} ranks")
        return self._ch.links[dest]

    def _check_open(self) -> None:
        if self._ch.closed:
            raise RuntimeError("this group's channels are closed (the gang joined a new group)")

    # ---------------------------------------------------------------- receiving
    def recv(self, src: int, key: Any) -> Any:
        return self._recv(src, key, None)

    def recv_apply(self, src: int, key: Any, fn: Callable[[Any], Any]) -> Any:
        """``fn(message)`` of the message from ``src`` for ``key``, as :meth:`recv` would
        return it, except that its arrays may view the channel's memory (no copy): ``fn``
        must not keep them (reduce or copy them into an array of its own). What a large
        collective uses to combine a peer's array straight into its output."""
        return self._recv(src, key, fn)

    def _recv(self, src: int, key: Any, fn: Callable[[Any], Any] | None) -> Any:
        box, stage = self._box, self.stage
        got = box.pop(stage, src, key)
        if got is not _MISSING:
            return got if fn is None else fn(got)
        if not 0 <= src < self.size or src == self.rank:
            if src == self.rank:
                raise RuntimeError(f"rank {src} waits for a message {key} to itself never sent")
            raise ValueError(f"source rank {src} out of range for {self.size} ranks")
        self._check_open()
        ch = self._ch
        ring = ch.rings.get(src)
        spin_end = deadline = yield_end = 0.0
        while True:
            if box.aborted(stage):
                raise StageAborted(f"stage {stage} was aborted (a peer died)")
            if ring is not None:
                got = self._take(ring, src, key, fn)
            else:
                got = self._take_tcp(src, key)
                if got is not _MISSING and fn is not None:
                    got = fn(got)
            if got is not _MISSING:
                return got
            now = time.perf_counter()
            if not deadline:
                spin_end, deadline = now + ch.spin_s, now + self.timeout_s
                yield_end = spin_end + ch.yield_s
            elif now > deadline:
                raise TimeoutError(
                    f"no message from rank {src} with key {key} within {self.timeout_s:.0f}s "
                    "(a peer probably died; the stage will be retried)"
                )
            elif now > yield_end:
                self._sleep(ring, deadline - now)
            elif now > spin_end:
                os.sched_yield()

    def try_recv(self, src: int, key: Any) -> Any:
        """The message from ``src`` for ``key`` if it has arrived, else
        :data:`rayflow.hpc.backends.transport.NO_MESSAGE`, at once (what ``ANY_SOURCE`` and
        ``Request.Test`` need). Other messages read meanwhile are kept for their receives."""
        from rayflow.hpc.backends.transport import NO_MESSAGE

        if self._box.aborted(self.stage):
            raise StageAborted(f"stage {self.stage} was aborted (a peer died)")
        got = self._box.pop(self.stage, src, key)
        if got is _MISSING and 0 <= src < self.size and src != self.rank:
            self._check_open()
            ring = self._ch.rings.get(src)
            got = self._take(ring, src, key) if ring is not None else self._take_tcp(src, key)
        return NO_MESSAGE if got is _MISSING else got

    def wait_any(self, timeout_s: float) -> None:
        """Sleep until a message may have arrived from any peer (the doorbell rang, the TCP
        socket is readable, the mailbox got one) or ``timeout_s`` passed: what a receive from
        ``ANY_SOURCE`` does between looks, instead of polling on a timer."""
        ch = self._ch
        ch.bell.drain()
        # after the drain: a message written before it is visible now
        if any(r.readable() for r in ch.rings.values()):
            return
        if ch.pull is not None and ch.pull.poll(0):
            return
        if self._box.aborted(self.stage):
            return
        ch.poller.poll(max(1, min(int(timeout_s * 1000) + 1, 1000)))

    def _take(self, ring: shm.Ring, src: int, key: Any,
              fn: Callable[[Any], Any] | None = None) -> Any:
        """Read ``src``'s ring until the message for ``key`` shows up (``fn`` of it, applied
        before its record is consumed, when given); stash the others."""
        maps = self._ch.maps
        while True:
            view = ring.peek()
            if view is None:
                return _MISSING
            obj: Any = None
            try:
                stage, k, obj = _decode_record(view, maps, copy=fn is None)
                if k == key and stage == self.stage:
                    return obj if fn is None else fn(obj)
                if fn is not None:  # kept for a later receive: its own copy
                    obj = None
                    stage, k, obj = _decode_record(view, maps)
                self._box.put(stage, src, k, obj)
            finally:
                obj = None  # no view of the record outlives it
                view.release()
                ring.commit()

    def _take_tcp(self, src: int | None, key: Any) -> Any:
        """Read the TCP socket until the message from ``src`` for ``key`` shows up (``src``
        None: read everything into the mailbox)."""
        pull, zmq = self._ch.pull, self._ch._zmq
        while True:
            try:
                frames = pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return _MISSING
            sender = int.from_bytes(frames[0].bytes, "little")
            stage, k, obj = _message(pickle.loads(frames[1].buffer,
                                                  buffers=[f.buffer for f in frames[2:]]))
            if sender == src and k == key and stage == self.stage:
                return obj
            self._box.put(stage, sender, k, obj)

    def _sleep(self, ring: shm.Ring | None, left_s: float) -> None:
        ch = self._ch
        ch.bell.drain()
        # the last look after draining: a message written before the drain is visible now
        if ring is not None and ring.readable():
            return
        if ch.pull is not None:
            if ring is None:
                if ch.pull.poll(0):
                    return
            else:
                self._take_tcp(None, _MISSING)  # waiting on shared memory: stash TCP mail
        if self._box.aborted(self.stage):
            return
        ch.poller.poll(max(1, min(int(left_s * 1000) + 1, 1000)))

    def close(self) -> None:
        """Release the channels (rings, segments, sockets) of every view of this group."""
        self._box.remove_waker(self._wake)
        self._ch.close()
