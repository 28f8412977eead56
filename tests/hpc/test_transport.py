"""Direct channels without Ray: rings, segments, TCP, ordering, overflow, abort (threads as ranks)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rayflow.hpc.backends import channels, links, shm, wire
from rayflow.hpc.backends.channels import Endpoint, Mailbox, StageAborted, node_info
from rayflow.hpc.comm import Communicator

pytestmark = pytest.mark.skipif(not shm.available(), reason="shared-memory rings need x86-64 Linux")


def test_ring_records_wrap_around_and_a_full_ring_refuses():
    ring = shm.Ring.create(4096)
    peer = shm.Ring.attach(ring.address)  # the consumer's own mapping of the same memory
    rng = np.random.default_rng(0)
    sent, got = [], []
    for _ in range(200):  # ~70 KiB through 4 KiB: the records wrap many times
        rec = rng.bytes(int(rng.integers(1, 700)))
        while not ring.try_write([rec], len(rec)):
            got.append(bytes(peer.read()))
        sent.append(rec)
    while (r := peer.read()) is not None:
        got.append(bytes(r))
    assert got == sent
    assert not peer.readable() and ring.free() == 4096
    assert ring.try_write([b"x" * 4000], 4000) and not ring.try_write([b"y" * 100], 100)
    assert bytes(peer.read()) == b"x" * 4000
    with pytest.raises(ValueError, match="power of two"):
        shm.Ring.create(5000)
    peer.close()
    ring.close()


def _group(size, mode="auto", ring_bytes=shm.RING_BYTES):
    infos = [node_info("node-a", "127.0.0.1") for _ in range(size)]
    eps = [Endpoint(r, infos, mode=mode, ring_bytes=ring_bytes) for r in range(size)]
    addrs = [e.address for e in eps]
    boxes = [Mailbox() for _ in range(size)]
    ts = [e.connect(addrs, boxes[r], stage="s1", timeout_s=20) for r, e in enumerate(eps)]
    for t in ts:
        t.release_fds()
    return ts, boxes


def _run(ts, fn):
    with ThreadPoolExecutor(len(ts)) as ex:
        futs = [ex.submit(fn, Communicator(t)) for t in ts]
        return [f.result(timeout=60) for f in futs]


@pytest.fixture(params=["auto", "tcp"])
def group4(request):
    if request.param == "tcp":
        pytest.importorskip("zmq")
    ts, boxes = _group(4, request.param)
    assert ts[0].kinds == [None] + [("shm" if request.param == "auto" else "tcp")] * 3
    yield ts, boxes
    for t in ts:
        t.close()


def test_collectives_match_numpy(group4):
    ts, boxes = group4
    data = [np.linspace(-1, 1, 7) * (r + 1) for r in range(4)]

    def fn(comm):
        r = comm.rank
        big = np.arange(300_000, dtype=np.float64) * (r + 1)  # segments and reduce-scatter
        return {
            "sum": comm.allreduce(data[r]), "max": comm.allreduce(data[r], "max"),
            "scalar": comm.allreduce(r + 1), "big": comm.allreduce(big),
            "bcast": comm.bcast({"v": [1, 2]} if r == 1 else None, root=1),
            "gather": comm.allgather(np.arange(r + 1)), "a2a": comm.alltoall([(r, d) for d in range(4)]),
            "barrier": comm.barrier(),
        }

    stack = np.stack(data)
    big_sum = np.arange(300_000, dtype=np.float64) * 10
    for r, o in enumerate(_run(ts, fn)):
        np.testing.assert_array_equal(o["sum"], stack[0] + stack[1] + stack[2] + stack[3])
        np.testing.assert_array_equal(o["max"], stack.max(0))
        assert o["scalar"] == 10
        np.testing.assert_array_equal(o["big"], big_sum)
        assert o["bcast"] == {"v": [1, 2]}
        assert [g.tolist() for g in o["gather"]] == [list(range(k + 1)) for k in range(4)]
        assert o["a2a"] == [(k, r) for k in range(4)]
    assert all(b.pending("s1") == 0 for b in boxes)  # nothing left unread


@pytest.mark.parametrize("mode", ["auto", "tcp"])
def test_order_per_source_and_tag_survives_a_full_ring_and_large_arrays(mode):
    """Rank 0 sends 400 messages on two tags before rank 1 reads any: the 4 KiB ring fills,
    the rest waits in the sender's queue, and 1 MiB arrays go through segments."""
    if mode == "tcp":
        pytest.importorskip("zmq")
    ts, _ = _group(2, mode, ring_bytes=4096)
    big = np.arange(131_072, dtype=np.float64)  # 1 MiB

    def fn(comm):
        if comm.rank == 0:
            for k in range(200):
                comm.send((k, "a" * (k % 50)), 1, tag=3)
                payload = big + k if k % 40 == 0 else np.full(k % 9, k)
                comm.send(payload, 1, tag=4)
                big[0] = -1.0  # a send snapshots: the change must not reach the receiver
                big[0] = 0.0
            return comm.recv(1, tag=9)
        time.sleep(0.3)  # let the sender run far ahead
        tag4 = [comm.recv(0, tag=4) for _ in range(200)]  # one tag first, then the other
        tag3 = [comm.recv(0, tag=3) for _ in range(200)]
        comm.send("done", 0, tag=9)
        return tag3, tag4

    done, (tag3, tag4) = _run(ts, fn)
    assert done == "done"
    assert tag3 == [(k, "a" * (k % 50)) for k in range(200)]
    for k, got in enumerate(tag4):
        want = np.arange(131_072.0) + k if k % 40 == 0 else np.full(k % 9, k)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
    for t in ts:
        t.close()


def test_arrays_keep_dtype_shape_and_layout():
    ts, _ = _group(2)
    objs = [np.arange(12, dtype=np.int32).reshape(3, 4), np.asfortranarray(np.ones((300, 200))),
            np.arange(10.0)[::2], np.array(3.5), np.zeros((0, 3)), np.arange(70_000, dtype=np.uint8),
            {"nested": [np.arange(4_000.0)], "s": "x"}, None, 7, 2.5,
            # small arrays alone travel as dtype, shape and bytes
            np.array([1 + 2j], dtype=np.complex64), np.array(["2026-12-05"], dtype="M8[D]"),
            np.array([True, False]), np.array(["ab"]), (1, 2, 3, 4, 5)]

    def fn(comm):
        if comm.rank == 0:
            for o in objs:
                comm.send(o, 1)
            return None
        return [comm.recv(0) for _ in objs]

    _, got = _run(ts, fn)
    for o, g in zip(objs, got):
        if isinstance(o, np.ndarray):
            assert g.dtype == o.dtype and g.shape == o.shape and g.flags.writeable
            np.testing.assert_array_equal(g, o)
        elif isinstance(o, dict):
            np.testing.assert_array_equal(g["nested"][0], o["nested"][0])
            assert g["s"] == "x"
        else:
            assert g == o
    for t in ts:
        t.close()


def test_abort_wakes_a_rank_sleeping_on_a_silent_peer():
    ts, boxes = _group(2)
    woke = []

    def waiter():
        try:
            Communicator(ts[0]).recv(1)
        except StageAborted as err:
            woke.append((time.monotonic(), str(err)))

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)  # well past the spin: the rank sleeps in poll
    aborted_at = time.monotonic()
    boxes[0].abort("s1")
    th.join(timeout=10)
    assert not th.is_alive() and woke and "s1 was aborted" in woke[0][1]
    assert woke[0][0] >= aborted_at
    for t in ts:
        t.close()


def test_a_silent_peer_times_out_and_bad_ranks_are_named():
    ts, _ = _group(2)
    t0 = ts[0].for_stage("s2")
    t0.timeout_s = 0.2
    with pytest.raises(TimeoutError, match="no message from rank 1"):
        t0.recv(1, ("k",))
    with pytest.raises(ValueError, match="destination rank 5 out of range"):
        ts[0].send(5, ("k",), 1)
    with pytest.raises(ValueError, match="source rank -1 out of range"):
        ts[0].recv(-1, ("k",))
    with pytest.raises(ValueError, match="unknown channel mode 'udp'"):
        Endpoint(0, [node_info("n")], mode="udp")
    for t in ts:
        t.close()
    with pytest.raises(RuntimeError, match="channels are closed"):
        ts[1].send(0, ("k",), 1)


def test_messages_of_another_stage_wait_for_it():
    """A peer already in the next stage: its message is kept until that stage reads it."""
    ts, boxes = _group(2)
    ts[0].for_stage("s2").send(1, ("k",), "for s2")
    ts[0].send(1, ("k",), "for s1")
    assert ts[1].recv(0, ("k",)) == "for s1"
    boxes[1].forget_other_stages("s2")
    assert ts[1].for_stage("s2").recv(0, ("k",)) == "for s2"
    for t in ts:
        t.close()


def test_small_messages_skip_the_pickle_buffers_and_large_ones_use_segments(monkeypatch):
    """The three paths of a send: in the pickle stream, out-of-band in the ring, a segment."""
    ts, _ = _group(2)
    seen = []
    real = shm.Segment.fill
    monkeypatch.setattr(shm.Segment, "fill",
                        lambda self, parts: seen.append(sum(p.nbytes for p in parts))
                        or real(self, parts))
    for n in (10, wire.OOB_BYTES // 8 + 1, links.SEGMENT_BYTES // 8 + 1):
        x = np.arange(n, dtype=np.float64)
        ts[0].send(1, ("k", n), x)
        got = ts[1].recv(0, ("k", n))
        np.testing.assert_array_equal(got, x)
        got[0] = 1.0  # received arrays are private and writable
    big = (links.SEGMENT_BYTES // 8 + 1) * 8
    assert len(seen) == 1 and big < seen[0] < big + 1024  # the array and the pickle header
    for t in ts:
        t.close()


def test_segments_are_reused_and_what_was_received_stays_private():
    """A sender refills a segment once its receiver has read the message; the receiver's
    array is its own copy, so the refill never changes what it already received."""
    ts, _ = _group(2)
    pool = ts[0]._ch.pool
    n = links.SEGMENT_BYTES // 8 * 4  # 1 MiB
    kept = []
    for k in range(20):
        ts[0].send(1, ("k", k), np.full(n, float(k)))
        kept.append(ts[1].recv(0, ("k", k)))
    assert pool.created == 1  # one segment for all twenty messages
    for k, got in enumerate(kept):
        np.testing.assert_array_equal(got, np.full(n, float(k)))
    # two in flight at once (the first not read yet): a second segment, then both reused
    for k in range(3):
        ts[0].send(1, ("a", k), np.full(n, 1.0 + k))
        ts[0].send(1, ("b", k), np.full(n, -1.0 - k))
        np.testing.assert_array_equal(ts[1].recv(0, ("b", k)), np.full(n, -1.0 - k))
        np.testing.assert_array_equal(ts[1].recv(0, ("a", k)), np.full(n, 1.0 + k))
    assert pool.created == 2 and len(ts[1]._ch.maps) == 2
    for t in ts:
        t.close()
    assert pool.free == 0  # closed with the channels


def test_ranks_spin_only_when_their_node_has_a_core_each():
    """With a core each a rank spins; with more ranks than cores it yields its core."""
    cores = len(__import__("os").sched_getaffinity(0))
    crowded = [node_info("a") for _ in range(cores + 1)]
    mixed = [node_info("a")] + [node_info(f"other-{k}") for k in range(cores + 1)]
    for infos, spin, yields in ((crowded, 0.0, channels.YIELD_S),
                                (mixed, channels.SPIN_S, 0.0)):
        mode = "auto" if infos is crowded else "tcp"
        if mode == "tcp":
            pytest.importorskip("zmq")
        ep = Endpoint(0, infos, mode=mode)
        assert (ep.spin_s, ep.yield_s) == (spin, yields)
        ep._close_inbound()


def test_a_crowded_rank_yields_its_core_then_sleeps(monkeypatch):
    """A receive on a node with more ranks than cores calls sched_yield for YIELD_S, then
    sleeps on its doorbell; the message that comes meanwhile is received."""
    import os
    import threading

    ts, _ = _group(2)
    ch = ts[1]._ch
    ch.spin_s, ch.yield_s = 0.0, 0.05
    yields = []
    real_yield = os.sched_yield
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1) or real_yield())
    sleeps = []
    real_sleep = ts[1]._sleep
    monkeypatch.setattr(ts[1], "_sleep", lambda *a: sleeps.append(1) or real_sleep(*a))
    later = threading.Timer(0.2, lambda: ts[0].send(1, ("k",), "late"))
    later.start()
    assert ts[1].recv(0, ("k",)) == "late"
    later.join()
    assert yields and sleeps  # yielded first, then slept until the message came
    for t in ts:
        t.close()


def test_a_large_bcast_is_written_once_and_its_segment_is_free_once_all_have_read(monkeypatch):
    import os

    ts, _ = _group(4)
    writes = []
    real = shm.Segment.create
    monkeypatch.setattr(shm.Segment, "create", classmethod(
        lambda cls, size, name="rayflow-seg": writes.append(name) or real(size, name)))
    x = np.arange(100_000, dtype=np.float64)  # 800 kB: a segment
    links = [ts[0]._ch.links[d] for d in (1, 2, 3)]
    pool = ts[0]._ch.pool

    def fn(comm):
        got = comm.bcast(x if comm.rank == 0 else None, root=0)
        held = None
        if comm.rank == 0:  # no other send yet: the segment waits for its readers
            (seg,) = {lk.segments[0][1] for lk in links}
            held = (seg, os.fstat(seg.fd).st_size, pool.free)
        comm.barrier()
        comm.barrier()  # the first barrier's sends may come before every reader has read
        return got, held

    outs = _run(ts, fn)
    for got, _ in outs:
        np.testing.assert_array_equal(got, x)
    seg, size, free_while_read = outs[0][1]
    assert len(writes) == 1 and writes[0].endswith("-many") and size >= x.nbytes
    pool.sweep()  # what the next large send does first
    assert all(not lk.segments for lk in links)
    assert free_while_read == 0 and pool.free == 1  # read by all three: free for the next
    os.fstat(seg.fd)  # kept open for reuse
    for t in ts:
        t.close()
    with pytest.raises(OSError):  # closed with the channels
        os.fstat(seg.fd)


@pytest.mark.parametrize("ring_bytes", [4096, shm.RING_BYTES])
def test_a_pickle_stream_larger_than_the_ring_goes_whole_into_a_segment(ring_bytes):
    """Big objects that pickle in band (a long list, a strided array, a long string) would
    never fit the ring; they must arrive, not wait forever."""
    ts, _ = _group(3, ring_bytes=ring_bytes)
    objs = [list(range(100_000)), np.arange(400_000.0)[::2], "x" * 5000, {"k": list(range(3000))}]

    def fn(comm):
        if comm.rank == 0:
            for o in objs:
                comm.send(o, 1)
            return comm.bcast(objs[0], root=0)  # the same, to two receivers at once
        got = [comm.recv(0) for _ in objs] if comm.rank == 1 else None
        return got, comm.bcast(None, root=0)

    outs = _run(ts, fn)
    assert outs[0] == objs[0]
    got, b1 = outs[1]
    assert got[0] == objs[0] and got[2] == objs[2] and got[3] == objs[3]
    np.testing.assert_array_equal(got[1], objs[1])
    assert b1 == objs[0] and outs[2][1] == objs[0]
    for t in ts:
        t.close()


@pytest.mark.parametrize("mode", ["auto", "tcp"])
def test_try_recv_looks_without_blocking_and_wait_any_wakes_on_a_send(mode):
    """What ANY_SOURCE needs from the transport: a look that returns at once, keeping the
    other messages it reads for their receives, and a sleep that a peer's send ends."""
    from rayflow.hpc.backends.transport import NO_MESSAGE

    if mode == "tcp":
        pytest.importorskip("zmq")
    ts, _ = _group(3, mode)
    try:
        assert ts[0].try_recv(1, ("a",)) is NO_MESSAGE
        ts[1].send(0, ("b",), "second")
        ts[1].send(0, ("a",), np.arange(3))
        got = NO_MESSAGE
        deadline = time.monotonic() + 10
        while got is NO_MESSAGE and time.monotonic() < deadline:
            got = ts[0].try_recv(1, ("a",))
        assert np.array_equal(got, np.arange(3))
        assert ts[0].try_recv(1, ("b",)) == "second"  # read past, kept
        assert ts[0].try_recv(2, ("a",)) is NO_MESSAGE
        t0 = time.monotonic()
        ts[0].wait_any(0.05)  # nothing sent: sleeps out its timeout
        assert time.monotonic() - t0 >= 0.04
        threading.Timer(0.05, lambda: ts[2].send(0, ("c",), "late")).start()
        t0 = time.monotonic()
        ts[0].wait_any(30.0)  # at most 1 s per call; a send ends it early
        assert time.monotonic() - t0 < 1.0
        deadline = time.monotonic() + 10
        while (got := ts[0].try_recv(2, ("c",))) is NO_MESSAGE and time.monotonic() < deadline:
            ts[0].wait_any(0.01)
        assert got == "late"
    finally:
        for t in ts:
            t.close()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_allreduces_are_the_rank_order_fold_bit_for_bit_on_every_rank(size):
    """Large arrays are combined straight from the peers' rings and segments into the
    output (a given ``out``, or the array sent itself); every rank still gets exactly
    numpy's left fold in rank order, for arrays through the ring (40 kB), through segments
    all-to-all (1.1 MB) and as reduce-scatter + allgather above 2 ranks (4.8 MB)."""
    rng = np.random.default_rng(size)
    data = {n: [rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n) for _ in range(size)]
            for n in (5_000, 140_000, 600_000)}
    ufuncs = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
    ts, boxes = _group(size)

    def fn(comm):
        r, out = comm.rank, {}
        for n, vals in data.items():
            for op in ufuncs:
                out[(n, op)] = comm.allreduce(vals[r], op)
            buf = np.full(n, np.nan)
            out[(n, "out is buf")] = comm.allreduce(vals[r], "sum", out=buf) is buf
            out[(n, "out")] = buf
            mine = vals[r].copy()
            comm.allreduce(mine, "sum", out=mine)  # in place, as MPI.IN_PLACE
            out[(n, "in place")] = mine
        return out

    outs = _run(ts, fn)
    for n, vals in data.items():
        for op, uf in ufuncs.items():
            want = vals[0]
            for v in vals[1:]:
                want = uf(want, v)
            for o in outs:
                assert o[(n, op)].tobytes() == want.tobytes(), (n, op)
                if op == "sum":
                    assert o[(n, "out is buf")]
                    assert o[(n, "out")].tobytes() == want.tobytes()
                    assert o[(n, "in place")].tobytes() == want.tobytes()
        if size > 2:  # the order matters for these sums: the test would see another order
            rev = vals[-1]
            for v in vals[-2::-1]:
                rev = rev + v
            assert rev.tobytes() != outs[0][(n, "sum")].tobytes()
    assert all(b.pending("s1") == 0 for b in boxes)
    for t in ts:
        t.close()


def test_a_large_allreduce_of_mismatched_arrays_raises_on_both_ranks():
    ts, boxes = _group(2)
    n = 140_000

    def fn(comm):
        try:
            comm.allreduce(np.ones(n + 8 * comm.rank))
        except ValueError as err:
            return str(err)
        return None

    for msg in _run(ts, fn):
        assert f"rank 0: an array of float64 ({n},), rank 1: an array of float64 ({n + 8},)" \
            in msg
    assert all(b.pending("s1") == 0 for b in boxes)
    with pytest.raises(ValueError, match="out must be a writable array like the one sent"):
        Communicator(ts[0]).allreduce(np.ones(3), out=np.ones(4))
    for t in ts:
        t.close()
