"""The communicator's algorithms over an in-process transport (threads as ranks), no Ray."""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rayflow.hpc.comm import Communicator, LocalTransport


class _Hub:
    def __init__(self, size):
        self.size = size
        self.cond = threading.Condition()
        self.box = {}


class _ThreadTransport:
    backend = "threads"

    def __init__(self, hub, rank):
        self.hub, self.rank, self.size = hub, rank, hub.size

    def send(self, dest, key, obj):
        with self.hub.cond:
            assert (dest, self.rank, key) not in self.hub.box, "duplicate message key"
            # snapshot, as a real transport serialises at send time
            self.hub.box[(dest, self.rank, key)] = pickle.loads(pickle.dumps(obj))
            self.hub.cond.notify_all()

    def send_many(self, dests, key, obj):
        for d in dests:
            self.send(d, key, obj)

    def recv(self, src, key):
        with self.hub.cond:
            ok = self.hub.cond.wait_for(lambda: (self.rank, src, key) in self.hub.box, timeout=10)
            assert ok, f"rank {self.rank} timed out waiting for {src} {key}"
            return self.hub.box.pop((self.rank, src, key))


def run_ranks(size, fn):
    hub = _Hub(size)
    with ThreadPoolExecutor(size) as ex:
        futs = [ex.submit(fn, Communicator(_ThreadTransport(hub, r))) for r in range(size)]
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
def test_cartesian_shift_rows_and_columns(dims):
    size = dims[0] * dims[1]

    def fn(comm):
        cart = comm.create_cart(dims)
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
