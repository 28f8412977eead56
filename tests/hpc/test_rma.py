"""One-sided communication: the window server's pure logic (locks, post-start-complete-wait
epochs, the transfers on a window's bytes) without sockets, then ``MPI.Win`` on ranks that
are threads (no Ray) against numpy. The same calls on a Ray gang, beside MPICH's results,
are in ``test_mpi_api_programs.py``."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rayflow.hpc import MPI
from rayflow.hpc.rma import Exposure, LockQueue, RMAError, apply
from tests.hpc.test_mpi_api_threads import run_ranks


# ------------------------------------------------------------------------------ pure logic
def test_locks_are_granted_in_order_shared_together_exclusive_alone():
    q = LockQueue()
    assert q.request(1, exclusive=False) and q.request(2, exclusive=False)
    assert not q.request(3, exclusive=True)  # two readers hold it
    assert not q.request(4, exclusive=False)  # behind the writer: it is not starved
    assert not q.request(5, exclusive=False)
    assert q.release(1) == []
    assert q.release(2) == [3]
    assert q.release(3) == [4, 5]  # the readers behind it, together
    assert q.holders == {4: False, 5: False}


def test_a_lock_taken_twice_or_released_unheld_is_an_rma_sync_error():
    q = LockQueue()
    q.request(1, exclusive=True)
    with pytest.raises(RMAError, match="locked already") as e:
        q.request(1, exclusive=False)
    assert e.value.error_class == MPI.ERR_RMA_SYNC
    with pytest.raises(RMAError, match="not locked"):
        q.release(2)


def test_exposure_counts_posts_and_completes_per_origin():
    e = Exposure()
    assert not e.start(2)  # before the post: it waits
    assert e.post([1, 2, 2]) == [2]  # rank 2 twice: two accesses in this epoch
    assert e.start(2) and e.start(1) and not e.start(1)  # one post for rank 1
    e.complete(1)
    e.complete(2)
    assert not e.done()
    e.complete(2)
    assert e.done()
    with pytest.raises(RMAError, match="did not post"):
        e.complete(1)


def test_a_second_post_before_wait_is_refused():
    e = Exposure()
    e.post([1])
    with pytest.raises(RMAError, match="call Win.Wait first"):
        e.post([1])


def test_transfers_on_a_windows_bytes_against_numpy():
    mem = np.zeros(40, np.uint8)
    f8 = np.dtype("f8")
    apply(mem, 8, ("put", 1, f8, 3, np.array([1.0, 2.0, 3.0])), None)
    assert mem.view("f8").tolist() == [0.0, 1.0, 2.0, 3.0, 0.0]
    assert apply(mem, 8, ("get", 2, f8, 2), None).tolist() == [2.0, 3.0]
    apply(mem, 8, ("acc", 0, f8, 5, np.full(5, 2.0), "PROD"), lambda n: np.multiply)
    assert mem.view("f8").tolist() == [0.0, 2.0, 4.0, 6.0, 0.0]
    old = apply(mem, 8, ("get_acc", 3, f8, 2, np.array([9.0, 9.0]), "REPLACE"), None)
    assert old.tolist() == [6.0, 0.0] and mem.view("f8").tolist()[3:] == [9.0, 9.0]
    assert apply(mem, 8, ("get_acc", 0, f8, 1, np.array([5.0]), "NO_OP"), None).tolist() == [0.0]
    assert mem.view("f8")[0] == 0.0
    # compare-and-swap: swapped only where the item equals compare
    assert apply(mem, 8, ("cas", 1, f8, 7.0, 3.0), None).tolist() == [2.0]
    assert mem.view("f8")[1] == 2.0
    assert apply(mem, 8, ("cas", 1, f8, 7.0, 2.0), None).tolist() == [2.0]
    assert mem.view("f8")[1] == 7.0
    # a displacement unit of 1 byte: a float at byte 4 straddles two doubles
    apply(mem, 1, ("put", 4, np.dtype("i4"), 1, np.array([-1], "i4")), None)
    assert mem[4:8].view("i4")[0] == -1


@pytest.mark.parametrize("request_", [("put", 4, np.dtype("f8"), 2, np.zeros(2)),
                                      ("get", -1, np.dtype("f8"), 1),
                                      ("cas", 5, np.dtype("f8"), 1.0, 0.0)])
def test_a_transfer_past_the_window_is_a_range_error_and_writes_nothing(request_):
    mem = np.arange(40, dtype=np.uint8)
    with pytest.raises(RMAError, match="past the window") as e:
        apply(mem, 8, request_, None)
    assert e.value.error_class == MPI.ERR_RMA_RANGE
    assert mem.tolist() == list(range(40))


# ------------------------------------------------------------------------------ ranks as threads
def test_fence_epochs_put_get_and_accumulate_on_every_size():
    """Each rank puts into its right neighbour, accumulates into everyone, then reads its
    left neighbour in the next epoch: the windows against a numpy model."""
    for size in (1, 2, 3, 4):
        def fn(c):
            r, p = c.rank, c.size
            a = np.zeros(p + 1)
            win = MPI.Win.Create(a, disp_unit=8, comm=c)
            win.Fence()
            win.Put(np.array([r + 0.5]), (r + 1) % p, target=r)
            for t in range(p):
                win.Accumulate(np.array([2.0 ** r]), t, target=p, op=MPI.SUM)
            win.Fence()
            mine = a.copy()
            left = np.zeros(p + 1)
            win.Get(left, (r - 1) % p)
            win.Fence()
            win.Free()
            return mine, left

        out = run_ranks(size, fn)
        model = [np.zeros(size + 1) for _ in range(size)]
        for r in range(size):
            model[(r + 1) % size][r] = r + 0.5
            for t in range(size):
                model[t][size] += 2.0 ** r
        for r, (mine, left) in enumerate(out):
            np.testing.assert_array_equal(mine, model[r])
            np.testing.assert_array_equal(left, model[(r - 1) % size])


def test_passive_target_progresses_while_the_target_makes_no_mpi_call():
    """Rank 0 computes (sleeps) without calling MPI while rank 1 locks, puts into and reads
    its window: the transfers complete inside that time, as a server thread serves them
    (the MPICH build of the conformance tests hangs on such a program)."""
    done = threading.Event()

    def fn(c):
        win = MPI.Win.Allocate(64 if c.rank == 0 else 0, disp_unit=8, comm=c)
        if c.rank == 0:
            t0 = time.perf_counter()
            while not done.is_set() and time.perf_counter() - t0 < 8:
                time.sleep(0.01)  # no MPI call here
            got = np.frombuffer(win, "i8").tolist()
        else:
            win.Lock(0)
            win.Put(np.arange(8, dtype="i8") * 3, 0)
            back = np.zeros(8, "i8")
            win.Get(back, 0)
            win.Unlock(0)
            done.set()
            got = back.tolist()
        c.Barrier()
        win.Free()
        return got

    out = run_ranks(2, fn)
    assert done.is_set()  # before rank 0's wait ran out
    assert out == [[3 * i for i in range(8)]] * 2


def test_an_exclusive_lock_makes_a_get_then_put_increment_exact():
    """Each rank increments rank 0's counter by a get, +1 and a put, 30 times under an
    exclusive lock: no update is lost (without the lock, two ranks' gets would see the same
    value)."""
    n = 30

    def fn(c):
        win = MPI.Win.Allocate(8 if c.rank == 0 else 0, disp_unit=8, comm=c)
        c.Barrier()
        v = np.zeros(1, "i8")
        for _ in range(n):
            win.Lock(0, MPI.LOCK_EXCLUSIVE)
            win.Get(v, 0)
            win.Put(v + 1, 0)
            win.Unlock(0)
        c.Barrier()
        total = int(np.frombuffer(win, "i8")[0]) if c.rank == 0 else None
        win.Free()
        return total

    assert run_ranks(3, fn)[0] == 3 * n


def test_accumulates_under_shared_locks_are_atomic_and_fetch_and_op_hands_out_each_value_once():
    n = 25

    def fn(c):
        win = MPI.Win.Allocate(16 if c.rank == 0 else 0, disp_unit=8, comm=c)
        c.Barrier()
        res = np.zeros(1, "i8")
        seen = []
        win.Lock_all()
        for _ in range(n):
            win.Accumulate(np.array([2], "i8"), 0, target=1, op=MPI.SUM)
            win.Fetch_and_op(np.array([1], "i8"), res, 0, 0, op=MPI.SUM)
            seen.append(int(res[0]))
        win.Unlock_all()
        c.Barrier()
        final = np.frombuffer(win, "i8").tolist() if c.rank == 0 else None
        win.Free()
        return seen, final

    out = run_ranks(3, fn)
    assert sorted(v for seen, _ in out for v in seen) == list(range(3 * n))
    assert out[0][1] == [3 * n, 2 * 3 * n]


def test_post_start_complete_wait_delivers_each_epoch_before_wait_returns():
    def fn(c):
        r, p = c.rank, c.size
        ring = np.full(3, -1, "i4")
        win = MPI.Win.Create(ring, disp_unit=4, comm=c)
        g = c.Get_group()
        seen = []
        for step in range(3):
            win.Post(g.Incl([(r - 1) % p]))
            win.Start(g.Incl([(r + 1) % p]))
            win.Put(np.array([100 * step + r], "i4"), (r + 1) % p, target=step)
            win.Complete()
            win.Wait()
            seen.append(ring.tolist())
        assert win.Test()  # (nothing posted is outstanding)
        win.Free()
        return seen

    out = run_ranks(3, fn)
    for r, seen in enumerate(out):
        left = (r - 1) % 3
        assert seen == [[left, -1, -1], [left, 100 + left, -1], [left, 100 + left, 200 + left]]


def test_allocate_shared_ranks_store_into_one_segment_and_see_each_others_parts():
    def fn(c):
        r, p = c.rank, c.size
        win = MPI.Win.Allocate_shared(8 * (r + 1), disp_unit=8, comm=c)
        np.frombuffer(win, "i8")[:] = r  # this rank's part
        win.Fence()
        parts = [np.frombuffer(win.Shared_query(q)[0], "i8").tolist() for q in range(p)]
        # the parts lie one after the other, as MPI's contiguous shared windows do
        addrs = [np.frombuffer(win.Shared_query(q)[0], "i8").ctypes.data for q in range(p)]
        win.Fence()
        win.Free()
        return parts, addrs

    out = run_ranks(3, fn)
    assert all(parts == [[0], [1, 1], [2, 2, 2]] for parts, _ in out)
    for _, addrs in out:
        assert [b - a for a, b in zip(addrs, addrs[1:])] == [8, 16]


def test_errors_name_the_call_and_carry_mpis_error_class():
    def fn(c):
        win = MPI.Win.Create(np.zeros(4), disp_unit=8, comm=c)
        got = {}

        def err(call):
            try:
                call()
            except MPI.Exception as exc:
                return exc.Get_error_class(), str(exc)
            except (TypeError, ValueError) as exc:
                return type(exc).__name__, str(exc)
            return None

        got["no_epoch"] = err(lambda: win.Put(np.ones(1), 0))
        win.Fence()
        got["range"] = err(lambda: win.Put(np.ones(2), 0, target=3))
        got["type"] = err(lambda: win.Put(np.ones(1, "i4"), 0, target=(0, 1, MPI.DOUBLE)))
        got["truncate"] = err(lambda: win.Put(np.ones(3), 0, target=(0, 2, MPI.DOUBLE)))
        got["get_short"] = err(lambda: win.Get(np.ones(1), 0, target=(0, 2, MPI.DOUBLE)))
        got["user_op"] = err(lambda: win.Accumulate(np.ones(1), 0,
                                                    op=MPI.Op.Create(lambda x, y: x)))
        got["rank"] = err(lambda: win.Put(np.ones(1), 5))
        got["target"] = err(lambda: win.Put(np.ones(1), 0, target="0"))
        got["lock_type"] = err(lambda: win.Lock(0, 7))
        vec = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
        try:
            win.Put(np.ones(2), 0, target=(0, 1, vec))
            got["derived"] = None
        except NotImplementedError as exc:
            got["derived"] = str(exc)
        got["complete"] = err(win.Complete)
        got["shared_query"] = err(lambda: win.Shared_query(0))
        win.Fence()
        np.testing.assert_array_equal(np.frombuffer(win, "f8"), np.zeros(4))  # nothing written
        win.Free()
        got["freed"] = err(win.Fence)
        got["create"] = err(lambda: MPI.Win.Create([1, 2], comm=c))
        got["disp_unit"] = err(lambda: MPI.Win.Allocate(8, disp_unit=0, comm=c))
        return got

    got = run_ranks(1, fn)[0]
    assert got["no_epoch"][0] == MPI.ERR_RMA_SYNC and "Win.Fence, Win.Start or Win.Lock" in \
        got["no_epoch"][1]
    assert got["range"][0] == MPI.ERR_RMA_RANGE and "past the window's 32 bytes" in got["range"][1]
    assert got["type"][0] == MPI.ERR_TYPE
    assert got["truncate"][0] == MPI.ERR_TRUNCATE and "3 items" in got["truncate"][1]
    assert got["get_short"][0] == MPI.ERR_TRUNCATE
    assert got["user_op"][0] == MPI.ERR_OP
    assert got["rank"][0] == "ValueError" and "out of range" in got["rank"][1]
    assert got["target"][0] == "ValueError"
    assert got["lock_type"][0] == "ValueError"
    assert "derived target datatypes" in got["derived"]
    assert got["complete"][0] == MPI.ERR_RMA_SYNC
    assert got["shared_query"][0] == MPI.ERR_RMA_FLAVOR
    assert got["freed"][0] == MPI.ERR_WIN
    assert got["create"][0] == "TypeError" and "numpy array" in got["create"][1]
    assert got["disp_unit"][0] == "ValueError"


def test_a_window_is_a_buffer_with_mpis_attributes():
    def fn(c):
        win = MPI.Win.Allocate(24, disp_unit=8, comm=c)
        view = np.frombuffer(win, "f8")
        view[:] = (1.5, 2.5, 3.5)
        mem = np.frombuffer(win.tomemory(), "f8").tolist()
        base, size, unit = win.attrs
        info = (bool(win), win.Get_attr(MPI.WIN_SIZE), win.flavor == MPI.WIN_FLAVOR_ALLOCATE,
                win.model == MPI.WIN_UNIFIED, size, unit, base == win.Get_attr(MPI.WIN_BASE),
                win.Get_group().Get_size())
        win.Free()
        return mem, info, bool(win)

    mem, info, alive = run_ranks(2, fn)[0]
    assert mem == [1.5, 2.5, 3.5]
    assert info == (True, 24, True, True, 24, 8, True, 2)
    assert not alive  # freed


def test_puts_sent_without_waiting_are_done_in_order_and_their_refusals_come_at_the_flush():
    """Puts and accumulates go out without waiting; a get (or any request that waits) on
    the same target reads their replies first, so it sees them; a refusal among them is
    raised at the flush that reads it, once."""
    from rayflow.hpc import rma

    srv = rma.server(MPI._rma_ufunc)
    mem = np.zeros(64, np.uint8)
    key = (("test-posted",), 0)
    srv.register(key, mem, 8)
    try:
        client = rma.Client([srv.address], timeout_s=10)
        f8 = np.dtype("f8")
        for i in range(8):
            client.post(0, ("data", key, 0, ("acc", i % 2, f8, 1, np.array([1.0]), "SUM")))
        got = client.call(0, ("data", key, 0, ("get", 0, f8, 2)))
        assert got.tolist() == [4.0, 4.0]
        client.post(0, ("data", (("gone",), 0), 0, ("put", 0, f8, 1, np.ones(1))))
        client.post(0, ("data", key, 0, ("put", 2, f8, 1, np.array([9.0]))))
        with pytest.raises(RMAError, match="no window") as e:
            client.flush(0)
        assert e.value.error_class == MPI.ERR_WIN
        client.flush()  # (read once: nothing is owed now)
        assert mem.view("f8")[2] == 9.0  # the put after the refused one was done
    finally:
        srv.unregister(key)
