"""The gloo backend's own code (codec, world allreduce, allgather, bcast, p2p) with threads as
ranks, over a stand-in for ``torch.distributed`` and ``ray.util.collective``: no torch needed.

The stand-in behaves as gloo does where it matters: a receive whose buffer size differs from
the message fails, and messages between a pair with one tag arrive in order.
"""

from __future__ import annotations

import functools
import operator
import threading
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from rayflow.hpc.backends.gloo_backend import GlooNative, GlooTransport, _decode, _encode
from rayflow.hpc.comm import Communicator


class _Completed:
    def is_completed(self):
        return True

    def wait(self):
        pass


class _FakeGloo:
    """Point-to-point messages between threads, keyed (src, dst, tag), FIFO per key."""

    def __init__(self, size):
        self.size = size
        self.cond = threading.Condition()
        self.queues = defaultdict(deque)
        self.coll_seq = defaultdict(int)

    def dist(self, rank):
        hub = self

        def isend(tensor, dst, tag=0):
            with hub.cond:
                hub.queues[(rank, dst, tag)].append(np.array(tensor, copy=True))
                hub.cond.notify_all()
            return _Completed()

        def recv(tensor, src, tag=0):
            with hub.cond:
                ok = hub.cond.wait_for(lambda: hub.queues[(src, rank, tag)], timeout=10)
                assert ok, f"rank {rank} waits forever for rank {src} (tag {tag})"
                msg = hub.queues[(src, rank, tag)].popleft()
            if msg.nbytes != tensor.nbytes or msg.dtype != tensor.dtype:
                raise RuntimeError("gloo: message size mismatch (the process would abort)")
            np.copyto(tensor, msg)

        return SimpleNamespace(isend=isend, recv=recv)

    def collective(self, rank):
        """``ray.util.collective``'s barrier, allgather and broadcast for one rank."""
        d = self.dist(rank)
        hub = self

        def tag():
            hub.coll_seq[rank] += 1
            return -hub.coll_seq[rank]

        def allgather(outs, arr, group):
            t = tag()
            for dst in range(hub.size):
                d.isend(arr, dst, t)
            for src in range(hub.size):
                d.recv(outs[src], src, t)

        def broadcast(arr, root, group):
            t = tag()
            if rank == root:
                for dst in range(hub.size):
                    if dst != root:
                        d.isend(arr, dst, t)
            else:
                d.recv(arr, root, t)

        def barrier(group):
            allgather([np.zeros(1) for _ in range(hub.size)], np.zeros(1), group)

        return SimpleNamespace(allgather=allgather, broadcast=broadcast, barrier=barrier)


def run_gloo(size, fn):
    """Run ``fn(comm)`` on ``size`` gloo ranks (threads); the world uses the native path."""
    hub = _FakeGloo(size)
    torch = SimpleNamespace(from_numpy=lambda a: a)

    def rank_main(r):
        t = GlooTransport(r, size, torch_module=torch, dist_module=hub.dist(r))
        native = GlooNative(hub.collective(r), "g", t)
        return fn(Communicator(t, native=native))

    with ThreadPoolExecutor(size) as ex:
        out = [f.result() for f in [ex.submit(rank_main, r) for r in range(size)]]
    left = {k: len(q) for k, q in hub.queues.items() if q}
    assert not left, f"undelivered messages: {left}"
    return out


# --------------------------------------------------------------------------- codec
@pytest.mark.parametrize("obj", [
    np.array([1 + 2j, 3 - 4j]), np.array([2**64 - 1], dtype=np.uint64),
    np.array([0.5, 65504.0], dtype=np.float16), np.arange(6, dtype=np.int16).reshape(2, 3),
    np.zeros((2, 0, 3)), np.array([True, False]), np.array(7, dtype=np.int8),
    np.float32(2.5), np.complex64(1 - 1j), np.array([1.0, 2.0], dtype=">f8"),
    np.array([Fraction(1, 3)], dtype=object), np.zeros((1,) * 9), 2**100, "text",
    np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.arange(10.0)[::3],
])
def test_codec_round_trips_exactly(obj):
    hdr, data = _encode(obj)
    assert data.dtype == np.uint8
    got = _decode(hdr, data.copy())
    assert type(got) is type(obj)
    if isinstance(obj, (np.ndarray, np.generic)):
        assert got.dtype == obj.dtype and got.shape == obj.shape
        np.testing.assert_array_equal(got, obj)
    else:
        assert got == obj


# ------------------------------------------------------------------- world allreduce
def _values(r):
    return {
        "complex": np.array([1 + 2j, -3j, 0.5]) * (r + 1),
        "complex_scalar": np.complex128(1 + 1j) * (r + 1),
        "u64": np.array([2**63 + r, 2**64 - 1 - r], dtype=np.uint64),
        "f16": np.array([0.5, 1.5, 2.0], dtype=np.float16) * (r + 1),
        "f32": np.arange(4, dtype=np.float32) + r,
        "i32": np.arange(4, dtype=np.int32) * r,
        "bool": np.array([r == 0, True, False]),
        "zero_d": np.array(r + 1.0),
        "f64_scalar": np.float64(r + 0.25),
        "py_int": 2**62 + r,
        "py_float": 0.1 * (r + 1),
        "py_bool": r % 2 == 0,
        "fraction": Fraction(1, r + 2),
        "decimal": Decimal("0.1") * (r + 1),
        "object_array": np.array([Fraction(1, r + 1)], dtype=object),
        "empty": np.zeros((0, 2)),
    }


def _fold(vals, op):
    """Ground truth: numpy's ufuncs for numpy values, Python's operators otherwise, rank order."""
    if isinstance(vals[0], (np.ndarray, np.generic)):
        fns = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
    else:
        fns = {"sum": operator.add, "prod": operator.mul, "min": min, "max": max}
    out = functools.reduce(fns[op], vals)
    return np.asarray(out) if isinstance(vals[0], np.ndarray) else out


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_gloo_allreduce_matches_numpy_and_python_for_every_dtype(size):
    ops = ["sum", "prod", "min", "max"]

    def fn(comm):
        out = {}
        for k, v in _values(comm.rank).items():
            for op in ops:
                if not (k.startswith("complex") and op in ("min", "max")):
                    out[(k, op)] = comm.allreduce(v, op)
        return out

    per_rank = [_values(r) for r in range(size)]
    outs = run_gloo(size, fn)
    for out in outs:
        for (k, op), got in out.items():
            want = _fold([v[k] for v in per_rank], op)
            assert type(got) is type(want), (k, op, type(got), type(want))
            if isinstance(want, (np.ndarray, np.generic)):
                assert got.dtype == want.dtype and np.shape(got) == np.shape(want), (k, op)
                np.testing.assert_array_equal(got, want, err_msg=f"{k} {op}")
            else:
                assert got == want, (k, op, got, want)
        # bitwise the same on every rank
        for key, got in out.items():
            np.testing.assert_array_equal(got, outs[0][key])
    if size == 4:
        assert outs[0][("py_int", "sum")] == 4 * 2**62 + 6  # no int64 overflow
        assert outs[0][("complex", "sum")][1] == -30j  # the imaginary part survives


@pytest.mark.parametrize("size", [2, 3, 4, 5])
@pytest.mark.parametrize("odd_rank", [0, -1])
def test_gloo_mismatched_allreduce_raises_on_every_rank_and_the_world_stays_usable(
    size, odd_rank
):
    odd = odd_rank % size

    def fn(comm):
        errors = []
        for mine, theirs in [(np.ones(4), np.ones(3)),
                             (np.ones(3, np.float32), np.ones(3)),
                             (np.ones(3), 1.0)]:
            try:
                comm.allreduce(theirs if comm.rank == odd else mine)
                errors.append(None)
            except ValueError as err:
                errors.append(str(err))
        return errors, comm.allreduce(np.full(2, comm.rank + 1.0)), comm.allreduce(comm.rank)

    for errors, after, total in run_gloo(size, fn):
        assert all(e is not None and "same shape and dtype" in e for e in errors), errors
        # the error names what the two sides passed
        assert "an array of float64 (4,)" in errors[0] and "an array of float64 (3,)" in errors[0]
        assert "float32 (3,)" in errors[1] and "float64 (3,)" in errors[1]
        assert "a Python object" in errors[2] and "an array of float64 (3,)" in errors[2]
        np.testing.assert_array_equal(after, np.full(2, size * (size + 1) / 2))
        assert total == size * (size - 1) // 2


def test_gloo_world_and_subgroup_collectives():
    def fn(comm):
        r = comm.rank
        row = comm.create_cart((2, 2)).row()
        return {
            "allgather": comm.allgather(np.arange(r + 1, dtype=np.complex64)),
            "mixed": comm.allgather(r if r % 2 else np.float16(r)),
            "bcast": comm.bcast(np.array([2**64 - 1], np.uint64) if r == 1 else None, root=1),
            "bcast_obj": comm.bcast({"k": Fraction(1, 3)} if r == 0 else None),
            "empty": comm.bcast(np.zeros((0, 3)) if r == 0 else None),
            "rs": comm.reduce_scatter(np.arange(6) * (r + 1)),
            "row_sum": row.allreduce(np.array([1 + 1j]) * r),
            "p2p": comm.sendrecv(np.arange(3, dtype=np.float16) + r, dest=(r + 1) % 4,
                                 source=(r - 1) % 4),
            "barrier": comm.barrier(),
        }

    for r, o in enumerate(run_gloo(4, fn)):
        for k, g in enumerate(o["allgather"]):
            assert g.dtype == np.complex64
            np.testing.assert_array_equal(g, np.arange(k + 1))
        assert o["mixed"] == [np.float16(0), 1, np.float16(2), 3]
        assert type(o["mixed"][0]) is np.float16 and type(o["mixed"][1]) is int
        assert o["bcast"].dtype == np.uint64 and o["bcast"][0] == 2**64 - 1
        assert o["bcast_obj"] == {"k": Fraction(1, 3)}
        assert o["empty"].shape == (0, 3)
        np.testing.assert_array_equal(o["rs"], np.array_split(np.arange(6) * 10, 4)[r])
        i = r // 2
        np.testing.assert_array_equal(o["row_sum"], [(1 + 1j) * (4 * i + 1)])
        assert o["p2p"].dtype == np.float16
        np.testing.assert_array_equal(o["p2p"], np.arange(3) + (r - 1) % 4)
