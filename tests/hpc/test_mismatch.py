"""Collectives whose ranks pass arrays of different sizes or dtypes raise on every rank.

An allreduce above 2 ranks picks its algorithm from the array's size, so ranks whose arrays
fall on different sides of a size limit take different algorithms. Each must raise a clear
``ValueError`` at once instead of waiting for messages that never come. The transports here
time out after a few seconds, so a hang shows up as a ``TimeoutError`` and fails the test.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rayflow.hpc import comm as comm_mod
from rayflow.hpc.comm import Communicator
from tests.hpc._threads import Hub, ThreadTransport

_TIMEOUT_S = 5.0
_KIB = 1024
_PREFIX = "allreduce: every rank must pass an array of the same shape and dtype; got "


def _outcome(fn, comm):
    try:
        return fn(comm)
    except Exception as err:  # noqa: BLE001 - the test inspects what each rank raised
        return err


def run_ranks(size, fn):
    """``fn(comm)`` on every rank: its result, or the exception it raised."""
    hub = Hub(size)
    with ThreadPoolExecutor(size) as ex:
        futs = [ex.submit(_outcome, fn, Communicator(ThreadTransport(hub, r, _TIMEOUT_S)))
                for r in range(size)]
        return [f.result() for f in futs]


def _text(a: np.ndarray) -> str:
    return f"an array of {a.dtype} {a.shape}"


def _arrays(nbytes_per_rank, dtypes=None):
    dtypes = dtypes or [np.float64] * len(nbytes_per_rank)
    return [np.arange(n // np.dtype(d).itemsize, dtype=d) + r
            for r, (n, d) in enumerate(zip(nbytes_per_rank, dtypes))]


def _assert_every_rank_names_the_mismatch(outs, arrays):
    """Every rank raised ValueError naming itself and a rank whose array differs from its."""
    for r, err in enumerate(outs):
        assert isinstance(err, ValueError), f"rank {r}: {err!r}"
        msg = str(err)
        assert msg.startswith(_PREFIX), msg
        assert f"rank {r}: {_text(arrays[r])}" in msg
        differing = [s for s, a in enumerate(arrays)
                     if a.shape != arrays[r].shape or a.dtype != arrays[r].dtype]
        assert any(f"rank {s}: {_text(arrays[s])}" in msg for s in differing), msg


# The cases: bytes per rank and the algorithms they straddle.
_STRADDLE_256K = [200 * _KIB, 300 * _KIB]  # reduce-at-root | all-to-all or reduce-scatter
_STRADDLE_4M = [1600 * 1000, 6400 * 1000]  # all-to-all | reduce-scatter (pieces coincide)


@pytest.mark.parametrize("size, pattern", [
    (3, [0, 1, 1]),  # rank 0 reduces at the root, the others all-to-all
    (3, [1, 0, 1]),  # rank 0 all-to-all: a root rank passes the error on to rank 2
    (4, [1, 0, 1, 0]),
    (5, [0, 1, 1, 1, 1]),  # reduce-at-root against reduce-scatter
    (5, [1, 1, 0, 1, 1]),
])
def test_allreduce_straddling_the_large_limit_raises_on_every_rank(size, pattern):
    arrays = _arrays([_STRADDLE_256K[k] for k in pattern])
    outs = run_ranks(size, lambda c: c.allreduce(arrays[c.rank]))
    _assert_every_rank_names_the_mismatch(outs, arrays)
    # rank 0 sees every rank's header: its message lists them all, and so do the messages
    # it sends on
    full = _PREFIX + ", ".join(f"rank {r}: {_text(a)}" for r, a in enumerate(arrays))
    assert str(outs[0]) == full


@pytest.mark.parametrize("pattern", [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 1]])
def test_allreduce_straddling_the_all_to_all_limit_raises_on_every_rank(pattern):
    # 6.4 MB cut into 4 pieces of 1.6 MB: each piece has the shape of the other ranks'
    # whole arrays, so only the header tells them apart
    arrays = _arrays([_STRADDLE_4M[k] for k in pattern])
    assert comm_mod._DIRECT_LARGE_ALLREDUCE_MAX_BYTES < arrays[pattern.index(1)].nbytes
    outs = run_ranks(4, lambda c: c.allreduce(arrays[c.rank]))
    _assert_every_rank_names_the_mismatch(outs, arrays)


@pytest.mark.parametrize("size", [2, 3, 4, 5])
@pytest.mark.parametrize("dtypes", [
    [np.float32, np.float64],  # 200 KB against 400 KB for the same count
    [np.int64, np.float64],  # the same size: the same algorithm, still an error
])
def test_allreduce_with_different_dtypes_raises_on_every_rank(size, dtypes):
    n = 50_000
    arrays = [np.arange(n, dtype=dtypes[r % 2]) for r in range(size)]
    outs = run_ranks(size, lambda c: c.allreduce(arrays[c.rank]))
    _assert_every_rank_names_the_mismatch(outs, arrays)


def test_allreduce_of_an_array_against_a_python_object_raises_on_every_rank():
    big = np.ones(300 * _KIB // 8)
    values = [big, 3, big]
    outs = run_ranks(3, lambda c: c.allreduce(values[c.rank]))
    for r, err in enumerate(outs):
        assert isinstance(err, ValueError), f"rank {r}: {err!r}"
        assert str(err) == (_PREFIX + f"rank 0: {_text(big)}, rank 1: a Python int, "
                            f"rank 2: {_text(big)}")


@pytest.mark.parametrize("size", [2, 3])
def test_reduce_scatter_with_different_row_counts_raises_on_every_rank(size):
    # rank 0's 7 rows split as [4, 3] or [3, 2, 2]; rank 1's 8 rows as [4, 4] or [3, 3, 2]:
    # rank 0's own piece has the shape of rank 1's piece for it
    arrays = [np.arange(7.0 + (r == 1)) for r in range(size)]
    outs = run_ranks(size, lambda c: c.reduce_scatter(arrays[c.rank]))
    for r, err in enumerate(outs):
        assert isinstance(err, ValueError), f"rank {r}: {err!r}"
        msg = str(err)
        assert msg.startswith("reduce_scatter: every rank must pass an array of the same "
                              "shape and dtype; got "), msg
        assert "rank 1: an array of float64 (8,) split as" in msg


def _rank_order_sum(arrays):
    return functools.reduce(np.add, arrays)


@pytest.mark.parametrize("size", [2, 3, 4, 5])
@pytest.mark.parametrize("nbytes", [200 * _KIB, 300 * _KIB, 6400 * 1000])
def test_equal_shapes_still_give_the_numpy_result_bit_for_bit(size, nbytes):
    rng = np.random.default_rng(size)
    arrays = [rng.standard_normal(nbytes // 8) for _ in range(size)]
    outs = run_ranks(size, lambda c: c.allreduce(arrays[c.rank]))
    want = _rank_order_sum(arrays)
    for r, got in enumerate(outs):
        assert isinstance(got, np.ndarray), f"rank {r}: {got!r}"
        assert got.tobytes() == want.tobytes()


def _mismatched_allreduce(comm, block, nbytes, dtypes):
    """One rank's allreduce of a mismatched array, on a transport timing out in seconds."""
    comm._t.timeout_s = _TIMEOUT_S
    x = np.arange(nbytes[comm.rank] // np.dtype(dtypes[comm.rank]).itemsize,
                  dtype=dtypes[comm.rank])
    try:
        comm.allreduce(x)
    except Exception as err:  # noqa: BLE001 - the driver checks what each rank raised
        return type(err).__name__, str(err), _text(x)
    return "no error", "", _text(x)


@pytest.mark.parametrize("nbytes, dtypes", [
    ([300 * _KIB, 200 * _KIB, 300 * _KIB, 200 * _KIB], [np.float64] * 4),
    ([200 * _KIB, 300 * _KIB, 300 * _KIB, 300 * _KIB], [np.float64] * 4),
    ([1600 * 1000, 6400 * 1000, 1600 * 1000, 1600 * 1000], [np.float64] * 4),
    ([200_000, 400_000, 200_000, 400_000], [np.float32, np.float64] * 2),
])
def test_a_ray_gang_raises_on_every_rank_before_the_timeout(gang4, nbytes, dtypes):
    from rayflow.hpc import BlockDataset, mpimap

    outs = mpimap(_mismatched_allreduce, BlockDataset.from_numpy(np.zeros(4), 4), gang=gang4,
                  fn_args=(nbytes, dtypes)).blocks()
    texts = [t for _, _, t in outs]
    for r, (kind, msg, mine) in enumerate(outs):
        assert kind == "ValueError", f"rank {r}: {kind}: {msg}"
        assert msg.startswith(_PREFIX) and f"rank {r}: {mine}" in msg, msg
        assert any(f"rank {s}: {t}" in msg for s, t in enumerate(texts) if t != mine), msg


def _equal_allreduce(comm, block, n):
    x = np.random.default_rng(comm.rank).standard_normal(n)
    return comm.allreduce(x)


@pytest.mark.parametrize("n", [200 * _KIB // 8, 300 * _KIB // 8, 6400 * 1000 // 8])
def test_a_ray_gang_with_equal_shapes_gives_the_numpy_result(gang4, n):
    from rayflow.hpc import BlockDataset, mpimap

    outs = mpimap(_equal_allreduce, BlockDataset.from_numpy(np.zeros(4), 4), gang=gang4,
                  fn_args=(n,)).blocks()
    want = _rank_order_sum([np.random.default_rng(r).standard_normal(n) for r in range(4)])
    for got in outs:
        assert got.tobytes() == want.tobytes()
