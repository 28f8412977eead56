"""The communicator's algorithms over an in-process transport (threads as ranks), no Ray."""

from __future__ import annotations

import functools
import operator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from rayflow.hpc.backends.transport import LocalTransport
from rayflow.hpc.comm import PROC_NULL, Communicator
from tests.hpc._threads import Hub, ThreadTransport


def run_ranks(size, fn):
    hub = Hub(size)
    with ThreadPoolExecutor(size) as ex:
        futs = [ex.submit(fn, Communicator(ThreadTransport(hub, r))) for r in range(size)]
        out = [f.result() for f in futs]
    assert not hub.box, f"undelivered messages: {list(hub.box)}"
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_collectives_match_numpy(size):
    data = [np.arange(6.0) * (r + 1) - r for r in range(size)]

    def fn(comm):
        r = comm.rank
        big = np.full(100_000, float(r + 1))  # takes the reduce-scatter + allgather path
        return {
            "sum": comm.allreduce(data[r]),
            "min": comm.allreduce(data[r], op="min"),
            "max": comm.allreduce(data[r], op="max"),
            "prod": comm.allreduce(data[r], op="prod"),
            "scalar": comm.allreduce(r + 1),
            "big": comm.allreduce(big),
            "reduce": comm.reduce(data[r], root=size - 1),
            "bcast": comm.bcast({"v": 42} if r == 0 else None),
            "allgather": comm.allgather(r * 10),
            "rs": comm.reduce_scatter(np.arange(7.0) + r),
            "a2a": comm.alltoall([(r, d) for d in range(size)]),
            "barrier": comm.barrier(),
        }

    out = run_ranks(size, fn)
    stack = np.stack(data)
    for r, o in enumerate(out):
        np.testing.assert_array_equal(o["sum"], stack.sum(0))
        np.testing.assert_array_equal(o["min"], stack.min(0))
        np.testing.assert_array_equal(o["max"], stack.max(0))
        np.testing.assert_array_equal(o["prod"], stack.prod(0))
        assert o["scalar"] == size * (size + 1) // 2
        assert o["big"][0] == size * (size + 1) / 2 and o["big"].shape == (100_000,)
        if r == size - 1:
            np.testing.assert_array_equal(o["reduce"], stack.sum(0))
        else:
            assert o["reduce"] is None
        assert o["bcast"] == {"v": 42}
        assert o["allgather"] == [10 * k for k in range(size)]
        full = sum(np.arange(7.0) + k for k in range(size))
        np.testing.assert_array_equal(o["rs"], np.array_split(full, size)[r])
        assert o["a2a"] == [(k, r) for k in range(size)]


def test_point_to_point_order_tags_and_sendrecv_replace():
    def fn(comm):
        r, other = comm.rank, 1 - comm.rank
        for k in range(3):
            comm.send((r, k), other, tag=5)
        comm.send("tagged", other, tag=9)
        first_tag9 = comm.recv(other, tag=9)  # receives out of send order by tag
        seq = [comm.recv(other, tag=5) for _ in range(3)]
        buf = np.full(4, float(r))
        comm.sendrecv_replace(buf, other)
        return first_tag9, seq, buf

    for r, (t9, seq, buf) in enumerate(run_ranks(2, fn)):
        assert t9 == "tagged"
        assert seq == [(1 - r, k) for k in range(3)]
        np.testing.assert_array_equal(buf, np.full(4, float(1 - r)))


@pytest.mark.parametrize("dims", [(2, 2), (2, 3), (3, 3)])
def test_periodic_cartesian_shift_rows_and_columns(dims):
    size = dims[0] * dims[1]

    def fn(comm):
        cart = comm.create_cart(dims, periods=[True, True])
        i, j = cart.coords
        row, col = cart.row(), cart.col()
        return {
            "coords": (i, j),
            "left": cart.shift_obj((i, j), 1, -1),  # value moves left: arrives from the right
            "up": cart.shift_obj((i, j), 0, -1),
            "row_sum": row.allreduce(comm.rank),
            "col_sum": col.allreduce(comm.rank),
            "row_rank": row.rank,
            "col_rank": col.rank,
            "shift": cart.shift(1, 1),
        }

    ranks = np.arange(size).reshape(dims)
    for r, o in enumerate(run_ranks(size, fn)):
        i, j = o["coords"]
        assert (i, j) == divmod(r, dims[1])
        assert o["left"] == (i, (j + 1) % dims[1])
        assert o["up"] == ((i + 1) % dims[0], j)
        assert o["row_sum"] == ranks[i].sum() and o["col_sum"] == ranks[:, j].sum()
        assert (o["row_rank"], o["col_rank"]) == (j, i)
        assert o["shift"] == (ranks[i, (j - 1) % dims[1]], ranks[i, (j + 1) % dims[1]])


def _neighbour(ranks, i, j, di, dj):
    """The rank at (i + di, j + dj) of a non-periodic grid, PROC_NULL outside it."""
    ii, jj = i + di, j + dj
    if 0 <= ii < ranks.shape[0] and 0 <= jj < ranks.shape[1]:
        return int(ranks[ii, jj])
    return PROC_NULL


@pytest.mark.parametrize("dims", [(1, 4), (2, 3), (3, 1)])
def test_default_grid_is_non_periodic_and_the_boundary_idiom_completes(dims):
    """MPI's halo idiom: ``src, dst = shift(...)``; ``sendrecv(x, dest=dst, source=src)`` on
    every rank, edge ranks included, then the same with sendrecv_replace and shift_obj."""
    size = dims[0] * dims[1]

    def fn(comm):
        cart = comm.create_cart(dims)
        i, j = cart.coords
        src, dst = cart.shift(1, 1)
        got = cart.sendrecv((i, j), dest=dst, source=src)
        buf = np.full(2, float(comm.rank))
        cart.sendrecv_replace(buf, dest=dst, source=src)
        up = cart.shift_obj(comm.rank, 0, -1)  # arrives from below; None on the last row
        down = cart.shift(0, 1)
        req = cart.isend("x", dest=down[1], tag=3)
        req.wait()
        came = cart.recv(down[0], tag=3)
        return {"periods": cart.periods, "shift": (src, dst), "got": got, "buf": buf,
                "up": up, "came": came}

    ranks = np.arange(size).reshape(dims)
    for r, o in enumerate(run_ranks(size, fn)):
        i, j = divmod(r, dims[1])
        left, right = _neighbour(ranks, i, j, 0, -1), _neighbour(ranks, i, j, 0, 1)
        assert o["periods"] == (False, False)
        assert o["shift"] == (left, right)
        assert o["got"] == (None if left == PROC_NULL else (i, j - 1))
        # nothing arrives at the left edge: the buffer keeps this rank's values
        np.testing.assert_array_equal(o["buf"], np.full(2, float(r if left == PROC_NULL else left)))
        below = _neighbour(ranks, i, j, 1, 0)
        assert o["up"] == (None if below == PROC_NULL else below)
        assert o["came"] == (None if i == 0 else "x")


def test_proc_null_point_to_point_is_a_no_op():
    comm = Communicator(LocalTransport())
    comm.send("lost", PROC_NULL)
    assert comm.isend(np.zeros(2), PROC_NULL).test()
    assert comm.recv(PROC_NULL, tag=4) is None
    assert comm.sendrecv(1, dest=PROC_NULL, source=PROC_NULL) is None
    buf = np.arange(3.0)
    assert comm.sendrecv_replace(buf, dest=PROC_NULL, source=PROC_NULL) is buf
    np.testing.assert_array_equal(buf, np.arange(3.0))
    with pytest.raises(ValueError, match="destination rank -1 out of range.*PROC_NULL"):
        comm.send(1, dest=-1)
    with pytest.raises(TypeError, match="source rank must be an int, got None"):
        comm.recv(None)
    with pytest.raises(ValueError, match="root rank -2 out of range"):
        comm.bcast(1, root=PROC_NULL)
    cart_err = [(dict(dims=(2, 2)), "need 4 ranks"), (dict(dims=(1,), periods=[1, 1]), "periods"),
                (dict(dims=(0,)), "positive")]
    for kwargs, msg in cart_err:
        with pytest.raises(ValueError, match=msg):
            comm.create_cart(**kwargs)
    with pytest.raises(ValueError, match="direction 2 out of range"):
        comm.create_cart((1,)).shift(2)


def test_split_and_errors():
    def fn(comm):
        sub = comm.split(comm.rank % 2, key=-comm.rank)
        return sub.size, sub.rank, sub.allreduce(comm.rank)

    out = run_ranks(4, fn)
    assert out == [(2, 1, 2), (2, 1, 4), (2, 0, 2), (2, 0, 4)]
    comm = Communicator(LocalTransport())
    with pytest.raises(ValueError, match="unknown reduce op"):
        comm.allreduce(1.0, op="avg")
    with pytest.raises(ValueError, match="out of range"):
        comm.send(1, dest=3)
    with pytest.raises(ValueError, match="need 4 ranks"):
        comm.create_cart((2, 2))


def _values(r):
    """One value of each kind per rank; the ground truth folds them with plain Python/numpy."""
    return {
        "big_int": 2**62 + r,  # int64 would overflow on 2+ ranks
        "fraction": Fraction(1, 3 + r),
        "decimal": Decimal("0.1") * (r + 1),
        "bool": r % 2 == 0,
        "float": 0.1 * (r + 1),
        "f32_scalar": np.float32(0.5 + r),
        "zero_d": np.array(r + 1, dtype=np.int16),
        "complex": np.array([1 + 2j, -1j]) * (r + 1),
        "u64": np.array([2**63 + r], dtype=np.uint64),
        "f16": np.array([0.5, 1.5], dtype=np.float16) * (r + 1),
        "list": [r],
    }


def _python_fold(vals, op):
    fns = {"sum": operator.add, "prod": operator.mul, "min": min, "max": max}
    if isinstance(vals[0], (np.ndarray, np.generic)):
        fns = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
    out = functools.reduce(fns[op], vals)
    # an array stays an array whatever the rank count (numpy's ufuncs turn 0-d into scalars)
    return np.asarray(out) if isinstance(vals[0], np.ndarray) else out


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_reductions_keep_python_objects_exact_and_numpy_types(size):
    ops = ["sum", "prod", "min", "max"]

    def fn(comm):
        mine = _values(comm.rank)
        out = {}
        for k, v in mine.items():
            for op in ops:
                if k == "list" and op != "sum":
                    continue
                out[(k, op)] = comm.allreduce(v, op)
                out[(k, op, "reduce")] = comm.reduce(v, op, root=size - 1)
        return out

    per_rank = [_values(r) for r in range(size)]
    for r, out in enumerate(run_ranks(size, fn)):
        for (k, op, *red), got in out.items():
            if red and r != size - 1:
                assert got is None
                continue
            want = _python_fold([v[k] for v in per_rank], op)
            assert type(got) is type(want), (k, op, type(got), type(want))
            if isinstance(want, np.ndarray):
                assert got.dtype == want.dtype and got.shape == want.shape, (k, op)
                np.testing.assert_array_equal(got, want)
            else:
                assert got == want, (k, op, got, want)
    if size == 4:
        assert out[("big_int", "sum")] == 4 * 2**62 + 6  # exact, as mpi4py gives
        assert out[("bool", "sum")] == 2  # Python bools add up as ints (mpi4py too)
        assert out[("list", "sum")] == [0, 1, 2, 3]  # rank order


@pytest.mark.parametrize("size", [2, 3])
def test_mismatched_arrays_raise_on_every_rank(size):
    def fn(comm):
        shape = (3,) if comm.rank else (4,)
        errors = []
        for call in (lambda: comm.allreduce(np.ones(shape)),
                     lambda: comm.allreduce(np.ones(3, np.float32 if comm.rank else np.float64)),
                     lambda: comm.allreduce(np.ones(3) if comm.rank else 1.0)):
            try:
                call()
                errors.append(None)
            except ValueError as err:
                errors.append(str(err))
        return errors

    for errors in run_ranks(size, fn):
        assert "rank 0: an array of float64 (4,), rank 1: an array of float64 (3,)" in errors[0]
        assert "rank 0: an array of float64 (3,), rank 1: an array of float32 (3,)" in errors[1]
        assert "rank 0: a Python float, rank 1: an array of float64 (3,)" in errors[2]
