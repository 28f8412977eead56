"""``rayflow.hpc.MPI`` on ranks that are threads (no Ray), against numpy: the vector
collectives (``Gatherv``, ``Scatterv``, ``Allgatherv``, ``Alltoallv``, ``Reduce_scatter``),
``probe``/``iprobe``, buffer ``Scan``/``Exscan``, ``Split_type``, the non-blocking
collectives, and groups with the communicators made from them. The same calls on a Ray gang
are in ``test_mpi_api.py``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rayflow.hpc import MPI
from rayflow.hpc.comm import Communicator
from tests.hpc._threads import Hub, ThreadTransport


def run_ranks(size, fn, check_roots=False):
    hub = Hub(size)
    with ThreadPoolExecutor(size) as ex:
        futs = [ex.submit(fn, MPI.Intracomm(Communicator(ThreadTransport(hub, r),
                                                          check_roots=check_roots)))
                for r in range(size)]
        out = [f.result() for f in futs]
    assert not hub.box, f"undelivered messages: {list(hub.box)}"
    return out


def _counts(p):
    return [r + 1 for r in range(p)]  # rank r's block: r + 1 items


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_scatterv_and_gatherv_move_blocks_of_their_own_lengths(size):
    counts = _counts(size)
    data = np.arange(sum(counts), dtype="f8") * 1.5
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])

    def fn(c):
        r, p = c.rank, c.size
        out = {}
        got = np.full(r + 1, -1.0)
        c.Scatterv([data, counts, MPI.DOUBLE] if r == 0 else None, got, root=0)
        out["scatterv"] = got.tolist()
        # blocks in reverse order, with a gap of 2 before each: explicit displacements
        displs = [sum(counts[q + 1:]) + 2 * (p - q) for q in range(p)]
        rev = np.full(sum(counts) + 2 * p + 1, -7, dtype="i8")
        for q in range(p):
            rev[displs[q]:displs[q] + counts[q]] = 10 * q + np.arange(counts[q])
        got2 = np.zeros(r + 1, dtype="i8")
        c.Scatterv([rev, (counts, displs), MPI.INT64_T] if r == p - 1 else None, got2,
                   root=p - 1)
        out["scatterv_displs"] = got2.tolist()
        mine = np.full(r + 1, r, dtype="i4")
        g = np.full(sum(counts) + 2 * p + 1, -1, dtype="i4")
        c.Gatherv(mine, [g, counts, displs, MPI.INT] if r == 0 else None, root=0)
        out["gatherv"] = g.tolist()
        return out

    vals = run_ranks(size, fn)
    displs = [sum(counts[q + 1:]) + 2 * (size - q) for q in range(size)]
    want_g = np.full(sum(counts) + 2 * size + 1, -1)
    for q in range(size):
        want_g[displs[q]:displs[q] + counts[q]] = q
    for r, v in enumerate(vals):
        assert v["scatterv"] == data[starts[r]:starts[r] + counts[r]].tolist()
        assert v["scatterv_displs"] == (10 * r + np.arange(counts[r])).tolist()
        if r == 0:
            assert v["gatherv"] == want_g.tolist()


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_allgatherv_alltoallv_and_reduce_scatter_match_numpy(size):
    counts = _counts(size)

    def fn(c):
        r, p = c.rank, c.size
        out = {}
        ag = np.zeros(sum(counts))
        start = sum(counts[:r])
        ag[start:start + r + 1] = r + 0.25
        c.Allgatherv(MPI.IN_PLACE, [ag, counts])
        out["allgatherv_inplace"] = ag.tolist()
        ag2 = np.zeros(sum(counts))
        c.Allgatherv(np.full(r + 1, -r, dtype="f8"), [ag2, (counts, None), MPI.DOUBLE])
        out["allgatherv"] = ag2.tolist()
        # rank r sends q a block of r + q + 1 items, 100 r + q each
        scounts = [r + q + 1 for q in range(p)]
        send = np.concatenate([np.full(n, 100 * r + q) for q, n in enumerate(scounts)])
        rcounts = [q + r + 1 for q in range(p)]
        recv = np.zeros(sum(rcounts), dtype=send.dtype)
        c.Alltoallv([send, scounts], [recv, rcounts])
        out["alltoallv"] = recv.tolist()
        x = np.arange(float(sum(counts))) * (r + 1)
        rs = np.zeros(r + 1)
        c.Reduce_scatter(x, rs, counts, op=MPI.SUM)
        out["reduce_scatter"] = rs.tolist()
        rs2 = np.zeros(r + 1)
        c.Reduce_scatter(x, rs2, op=MPI.MAX)  # counts: each rank's buffer length
        out["reduce_scatter_max"] = rs2.tolist()
        ip = x.copy()
        c.Reduce_scatter(MPI.IN_PLACE, ip, counts, op=MPI.SUM)
        out["reduce_scatter_inplace"] = ip[:r + 1].tolist()
        return out

    vals = run_ranks(size, fn)
    total = sum(np.arange(float(sum(counts))) * (q + 1) for q in range(size))
    top = np.arange(float(sum(counts))) * size
    for r, v in enumerate(vals):
        assert v["allgatherv_inplace"] == [q + 0.25 for q in range(size) for _ in range(q + 1)]
        assert v["allgatherv"] == [-float(q) for q in range(size) for _ in range(q + 1)]
        assert v["alltoallv"] == [100 * q + r for q in range(size) for _ in range(q + r + 1)]
        start = sum(counts[:r])
        assert v["reduce_scatter"] == total[start:start + r + 1].tolist()
        assert v["reduce_scatter_max"] == top[start:start + r + 1].tolist()
        assert v["reduce_scatter_inplace"] == total[start:start + r + 1].tolist()


def test_vector_specs_that_do_not_fit_are_named():
    """With the roots checked (``hpc.check_collectives``), the root's error reaches every
    rank, as it does for ``Scatter``; without, the root raises and the run stops."""
    def fn(c):
        r = c.rank
        errors = []
        for call in (
            lambda: c.Scatterv([np.zeros(3), [1, 1, 1]] if r == 0 else None, np.zeros(1)),
            lambda: c.Scatterv([np.zeros(3), [2, 2]] if r == 0 else None, np.zeros(2)),
            lambda: c.Scatterv([np.zeros(3), ([1, 1], [0, -1])] if r == 0 else None,
                               np.zeros(1)),
        ):
            try:
                call()
            except ValueError as exc:
                errors.append(str(exc))
        # rank 1 sends 3 items where the root's counts give it 2: named at the root
        try:
            c.Gatherv(np.zeros(3 if r == 1 else 1), [np.zeros(3), [1, 2]] if r == 0 else None)
        except ValueError as exc:
            errors.append(str(exc))
        return errors

    root, other = run_ranks(2, fn, check_roots=True)
    assert "counts must be 2 ints >= 0" in root[0] and "counts must be 2" in other[0]
    assert "block 1 (displacement 2, count 2) ends past a buffer of 3 items" in root[1]
    assert "displs must be 2 ints >= 0" in root[2]
    assert root[3] == "Gatherv: rank 1 sent 3 items where this rank's counts give its block 2"
    assert len(other) == 3  # (the Gatherv mismatch is seen where the blocks are)


def test_probe_describes_the_next_message_without_receiving_it():
    def fn(c):
        r = c.rank
        out = {}
        if r == 0:
            c.send({"big": list(range(50))}, dest=1, tag=3)
            c.Send(np.arange(5.0), dest=1, tag=7)
            c.recv(source=1, tag=9)  # rank 1 is done probing before the last message
            c.Send(np.arange(2, dtype="i4"), dest=1, tag=8)
        elif r == 1:
            st = MPI.Status()
            out["iprobe_none"] = c.iprobe(source=0, tag=99)  # never sent
            assert c.Probe(source=0, tag=7, status=st) is True
            out["probe7"] = (st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE))
            buf = np.empty(st.Get_count(MPI.DOUBLE))
            c.Recv(buf, source=st.Get_source(), tag=st.Get_tag())
            out["recv7"] = buf.tolist()
            st2 = MPI.Status()
            c.probe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st2)
            out["probe_any"] = (st2.Get_source(), st2.Get_tag())
            out["iprobe3"] = c.iprobe(source=0, tag=3)
            out["recv3"] = c.recv(source=0, tag=3)["big"][-1]
            c.send("done", dest=0, tag=9)
            st3 = MPI.Status()
            c.Probe(source=0, tag=MPI.ANY_TAG, status=st3)
            out["probe8"] = (st3.Get_tag(), st3.Get_count(MPI.INT))
            got = np.zeros(2, dtype="i4")
            c.Recv(got, source=0, tag=8)
            out["recv8"] = got.tolist()
            st4 = MPI.Status()
            out["proc_null"] = (c.iprobe(source=MPI.PROC_NULL, status=st4),
                                st4.Get_source(), st4.Get_count())
        return out

    vals = run_ranks(2, fn)
    v = vals[1]
    assert v["iprobe_none"] is False
    assert v["probe7"] == (0, 7, 5) and v["recv7"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    # the tag-3 object came first and is still there, for a probe and then a receive
    assert v["probe_any"] == (0, 3) and v["iprobe3"] is True and v["recv3"] == 49
    assert v["probe8"] == (8, 2) and v["recv8"] == [0, 1]
    assert v["proc_null"] == (True, MPI.PROC_NULL, 0)


def test_a_probe_no_rank_can_answer_is_a_deadlock_error():
    def fn(c):
        assert c.iprobe() is False
        with pytest.raises(MPI.Exception, match="deadlock: probe on rank 0"):
            c.probe(source=MPI.ANY_SOURCE)
        c.send("me", dest=0, tag=4)  # a message to itself is found
        st = MPI.Status()
        return c.probe(source=0, tag=4, status=st), st.Get_tag(), c.recv(source=0, tag=4)

    assert run_ranks(1, fn) == [(True, 4, "me")]


@pytest.mark.parametrize("size", [1, 3, 4])
def test_buffer_scan_and_exscan_match_numpy_prefixes(size):
    xs = [np.array([r + 1.0, -2.0 * r, 3.0]) for r in range(size)]

    def fn(c):
        r = c.rank
        s = np.zeros(3)
        c.Scan(xs[r], s, op=MPI.SUM)
        e = np.full(3, -9.0)
        c.Exscan(xs[r], e, op=MPI.MAX)
        ip = xs[r].copy()
        c.Scan(MPI.IN_PLACE, ip, op=MPI.PROD)
        return s.tolist(), e.tolist(), ip.tolist()

    for r, (s, e, ip) in enumerate(run_ranks(size, fn)):
        assert s == np.sum(xs[:r + 1], axis=0).tolist()
        assert e == ([-9.0] * 3 if r == 0 else np.max(xs[:r], axis=0).tolist())
        assert ip == np.prod(xs[:r + 1], axis=0).tolist()


def test_split_type_shared_groups_the_ranks_of_one_machine():
    def fn(c):
        node = c.Split_type(MPI.COMM_TYPE_SHARED, key=-c.rank)  # (reversed by key)
        none = c.Split_type(MPI.UNDEFINED)
        node.Barrier()
        try:
            c.Split_type(5)
            bad = None
        except ValueError as exc:
            bad = str(exc)
        c.Set_errhandler(MPI.ERRORS_ARE_FATAL)
        return (node.Get_size(), node.Get_rank(), none == MPI.COMM_NULL, bad,
                c.Get_errhandler() is MPI.ERRORS_ARE_FATAL,
                MPI.COMM_SELF.Get_errhandler() is MPI.ERRORS_RETURN)

    # threads share the host: one communicator of all ranks, ordered by key
    assert run_ranks(3, fn) == [
        (3, 2 - r, True, "Split_type: split_type 5 is not MPI.COMM_TYPE_SHARED or MPI.UNDEFINED",
         True, True) for r in range(3)]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_nonblocking_collectives_match_numpy(size):
    xs = [np.arange(2.0 * size) * (r + 1) - r for r in range(size)]

    def fn(c):
        r, p = c.rank, c.size
        b = np.arange(4.0) if r == p - 1 else np.zeros(4)
        g = np.full(2 * p, -1.0)
        sc = np.zeros(2)
        ag = np.zeros(2 * p)
        a2 = np.zeros(2 * p)
        red = np.zeros(2 * p)
        ar = np.zeros(2 * p)
        rsb = np.zeros(2)
        ip = xs[r].copy()
        reqs = [c.Ibcast(b, root=p - 1),
                c.Igather(xs[r][:2], g, root=0),
                c.Iscatter(np.arange(2.0 * p) * 3 if r == 0 else None, sc, root=0),
                c.Iallgather(xs[r][:2], ag),
                c.Ialltoall(xs[r], a2),
                c.Ireduce(xs[r], red, op=MPI.SUM, root=0),
                c.Iallreduce(xs[r], ar, op=MPI.MAX),
                c.Ireduce_scatter_block(xs[r], rsb, op=MPI.SUM),
                c.Iallreduce(MPI.IN_PLACE, ip, op=MPI.SUM),
                c.Ibarrier()]
        c.Allreduce(np.ones(1), np.zeros(1))  # a blocking collective among them
        MPI.Request.Waitall(reqs)
        return [a.tolist() for a in (b, g, sc, ag, a2, red, ar, rsb, ip)]

    total, top = np.sum(xs, axis=0), np.max(xs, axis=0)
    for r, (b, g, sc, ag, a2, red, ar, rsb, ip) in enumerate(run_ranks(size, fn)):
        assert b == [0.0, 1.0, 2.0, 3.0]
        if r == 0:
            assert g == [v for q in range(size) for v in xs[q][:2]]
            assert red == total.tolist()
        assert sc == (np.arange(2.0 * size) * 3)[2 * r:2 * r + 2].tolist()
        assert ag == [v for q in range(size) for v in xs[q][:2]]
        assert a2 == [v for q in range(size) for v in xs[q][2 * r:2 * r + 2]]
        assert ar == top.tolist() and ip == total.tolist()
        assert rsb == total[2 * r:2 * r + 2].tolist()


def test_a_nonblocking_collective_never_waits_at_its_call():
    """Legal MPI that a collective completed at its call would deadlock: rank 0 starts
    an Iallreduce and then sends what rank 1 waits for before it joins. Test is False
    until every rank has joined, then True."""
    def fn(c):
        x, out = np.array([c.rank + 1.0]), np.zeros(1)
        if c.rank == 0:
            req = c.Iallreduce(x, out)
            bar = c.Ibarrier()
            early = (req.Test(), bar.Test())
            c.send("go", dest=1)
            while not req.Test():
                pass
            bar.Wait()
            return early, out.tolist()
        c.recv(source=0)
        req = c.Iallreduce(x, out)
        c.Ibarrier().Wait()
        req.Wait()
        return None, out.tolist()

    assert run_ranks(2, fn) == [((False, False), [3.0]), (None, [3.0])]


def test_groups_and_the_communicators_made_from_them():
    def fn(c):
        r = c.rank
        world = c.Get_group()
        evens = world.Incl([2, 0])  # (order kept: rank 2 first)
        odd = world.Excl([0, 2])
        out = {"sizes": (world.Get_size(), evens.Get_size(), odd.Get_size()),
               "ranks": (world.Get_rank(), evens.Get_rank(), odd.Get_rank()),
               "translate": evens.Translate_ranks([0, 1], world),
               "to_odd": world.Translate_ranks(None, odd),
               "union": MPI.Group.Union(odd, evens).Translate_ranks(None, world),
               "inter": MPI.Group.Intersection(world, evens).Translate_ranks(None, world),
               "diff": MPI.Group.Difference(world, evens).Translate_ranks(None, world),
               "range": world.Range_incl([(3, 0, -2)]).Translate_ranks(None, world),
               "compare": (world.Compare(world.Dup()), evens.Compare(world.Incl([0, 2])),
                           evens.Compare(odd)),
               "empty": (MPI.GROUP_EMPTY.Get_size(), MPI.GROUP_EMPTY.Get_rank())}
        sub = c.Create(evens)  # every rank calls it
        out["create"] = (None if sub == MPI.COMM_NULL else
                         (sub.Get_rank(), sub.Get_size(), sub.allgather(r)))
        if r % 2:  # only the group's processes call Create_group, twice
            a, b = c.Create_group(odd, tag=5), c.Create_group(odd, tag=5)
            a.send(f"a{r}", dest=1 - a.Get_rank())
            b.send(f"b{r}", dest=1 - b.Get_rank())
            out["create_group"] = (b.recv(), a.recv(), a.Get_group().Compare(odd))
        with pytest.raises(ValueError, match="ranks \\[4\\] must be distinct ranks"):
            world.Incl([4])
        return out

    vals = run_ranks(4, fn)
    for r, v in enumerate(vals):
        assert v["sizes"] == (4, 2, 2)
        assert v["ranks"] == (r, {2: 0, 0: 1}.get(r, MPI.UNDEFINED),
                              {1: 0, 3: 1}.get(r, MPI.UNDEFINED))
        assert v["translate"] == [2, 0]
        assert v["to_odd"] == [MPI.UNDEFINED, 0, MPI.UNDEFINED, 1]
        assert v["union"] == [1, 3, 2, 0] and v["inter"] == [0, 2] and v["diff"] == [1, 3]
        assert v["range"] == [3, 1]
        assert v["compare"] == (MPI.IDENT, MPI.SIMILAR, MPI.UNEQUAL)
        assert v["empty"] == (0, MPI.UNDEFINED)
        assert v["create"] == ({2: (0, 2, [2, 0]), 0: (1, 2, [2, 0])}.get(r))
        if r % 2:
            other = 4 - r  # 1 <-> 3
            # each communicator's message stays in it, though both have the same group and tag
            assert v["create_group"] == (f"b{other}", f"a{other}", MPI.IDENT)


def test_ireduce_scatter_counts_must_add_up_to_the_send_buffer():
    def fn(c):
        with pytest.raises(ValueError, match="recvcounts \\[1, 1\\] add up to 2 items; the "
                                             "send buffer has 3"):
            c.Ireduce_scatter(np.zeros(3), np.zeros(1), [1, 1])
        return True

    assert run_ranks(2, fn) == [True, True]


def test_persistent_requests_repeat_their_send_and_receive():
    """A halo exchange around a ring with Send_init/Recv_init, started three times: each
    Start sends what the buffer holds then, and receives into the same buffer."""
    def fn(c):
        r, p = c.rank, c.size
        out, inbox = np.zeros(2), np.zeros(2)
        reqs = [c.Recv_init(inbox, source=(r - 1) % p, tag=4),
                c.Send_init(out, dest=(r + 1) % p, tag=4)]
        assert reqs[0].Test() is True and reqs[0].Wait() is True  # inactive: at once
        seen = []
        for step in range(3):
            out[:] = (r, step)
            MPI.Prequest.Startall(reqs)
            MPI.Request.Waitall(reqs)
            seen.append(inbox.tolist())
        reqs[0].Start()
        with pytest.raises(MPI.Exception, match="Start on a request still active"):
            reqs[0].Start()
        c.Send(np.array([-1.0, -1.0]), dest=(r + 1) % p, tag=4)
        reqs[0].Wait()
        return seen, inbox.tolist()

    for r, (seen, last) in enumerate(run_ranks(3, fn)):
        assert seen == [[float((r - 1) % 3), float(step)] for step in range(3)]
        assert last == [-1.0, -1.0]


def test_a_matched_probe_takes_the_message_out_of_matching():
    def fn(c):
        if c.rank == 0:
            c.send({"a": 1}, dest=1, tag=1)
            c.Send(np.arange(3.0), dest=1, tag=2)
            c.send("later", dest=1, tag=1)
            return None
        st = MPI.Status()
        m = c.mprobe(source=0, tag=1, status=st)
        first = (st.Get_tag(), m.recv())
        with pytest.raises(MPI.Exception, match="received already"):
            m.recv()
        # the next tag-1 message is the later one: the first is no longer there to match
        second = c.recv(source=0, tag=1)
        buf = np.zeros(3)
        m2 = c.improbe(source=0, tag=2)
        m2.Recv(buf)
        none = c.improbe(source=0, tag=9)
        nothing = c.mprobe(source=MPI.PROC_NULL).recv()
        return first, second, buf.tolist(), none, nothing

    assert run_ranks(2, fn)[1] == ((1, {"a": 1}), "later", [0.0, 1.0, 2.0], None, None)


def test_cancel_takes_a_posted_receive_out_of_matching_and_keeps_its_message():
    """A cancelled receive completes at once with a cancelled status; the message it would
    have matched goes to the next receive (as under MPICH); a completed receive, a send and
    a persistent receive's active round follow MPI's rules."""
    def cancelled(req):
        req.Cancel()
        st = MPI.Status()
        req.Wait(st)
        return st.Is_cancelled()

    def fn(c):
        r = c.rank
        out = {}
        if r == 0:
            out["cancelled"] = cancelled(c.Irecv(np.zeros(1), source=1, tag=5))
            c.Barrier()
            got = np.zeros(1)
            st = MPI.Status()
            c.Recv(got, source=1, tag=5, status=st)
            out["later"] = (got.tolist(), st.Is_cancelled())
            done = c.irecv(source=1, tag=6)
            value = done.wait()
            out["completed"] = (value, cancelled(done))  # completed: nothing to cancel
            pers = c.Recv_init(np.zeros(1), source=1, tag=7)
            pers.Start()
            out["persistent"] = cancelled(pers)
            c.Barrier()
            again = np.zeros(1)
            c.Recv(again, source=1, tag=7)
            out["persistent_message"] = again.tolist()
        else:
            c.Barrier()
            c.Send(np.ones(1), dest=0, tag=5)
            out["send"] = cancelled(c.isend("x", dest=0, tag=6))  # buffered: out already
            c.Barrier()
            c.Send(np.full(1, 7.0), dest=0, tag=7)
        return out

    zero, one = run_ranks(2, fn)
    assert zero == {"cancelled": True, "later": ([1.0], False), "completed": ("x", False),
                    "persistent": True, "persistent_message": [7.0]}
    assert one == {"send": False}
