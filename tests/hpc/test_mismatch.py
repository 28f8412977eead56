"""Collectives whose ranks pass arrays of different sizes or dtypes, or different roots,
raise on every rank.

An allreduce above 2 ranks picks its algorithm from the array's size, so ranks whose arrays
fall on different sides of a size limit take different algorithms. Each must raise a clear
``ValueError`` at once instead of waiting for messages that never come. The same goes for
the rooted collectives (``bcast``, ``gather``, ``scatter``, ``reduce`` and MPI's buffer forms)
called with different roots. The transports here time out after a few seconds, so a hang
shows up as a ``TimeoutError`` and fails the test.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
import pytest

from rayflow.hpc import MPI
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


def run_ranks(size, fn, hub=None, check_roots=True):
    """``fn(comm)`` on every rank: its result, or the exception it raised. The rooted
    collectives check the roots here (``check_roots``, ``hpc.check_collectives``)."""
    hub = hub or Hub(size)
    with ThreadPoolExecutor(size) as ex:
        futs = [ex.submit(_outcome, fn, Communicator(ThreadTransport(hub, r, _TIMEOUT_S),
                                                     check_roots=check_roots))
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


# ------------------------------------------------------------------ rooted collectives
def _rooted_call(name, comm, root):
    """``name`` called as an mpi4py program would, with this rank's ``root``."""
    r, p = comm.rank, comm.size
    if name == "bcast":
        return comm.bcast({"from": r, "data": [r] * 3} if r == root else None, root=root)
    if name == "gather":
        return comm.gather((r, r * r), root=root)
    if name == "scatter":
        return comm.scatter([f"item {i}" for i in range(p)] if r == root else None, root=root)
    return comm.reduce(np.arange(4.0) * (r + 1), op="sum", root=root)


def _roots_text(roots):
    return ", ".join(f"rank {r}: root={x}" for r, x in enumerate(roots))


_ROOT_PATTERNS = [
    [0, 1],  # each rank its own root: nobody would receive
    [1, 0],  # each waits for the other
    [0, 0, 1],  # one rank trusts another root
    [2, 0, 1],  # a cycle of waits
    [0, 1, 1],
    [0, 0, 0, 3],
    [1, 1, 2, 2],
    [3, 2, 1, 0],
]


@pytest.mark.parametrize("name", ["bcast", "gather", "scatter", "reduce"])
@pytest.mark.parametrize("roots", _ROOT_PATTERNS, ids=lambda x: "-".join(map(str, x)))
def test_rooted_collectives_with_different_roots_raise_on_every_rank(name, roots):
    hub = Hub(len(roots))
    outs = run_ranks(len(roots), lambda c: _rooted_call(name, c, roots[c.rank]), hub)
    want = f"{name}: every rank must pass the same root; got {_roots_text(roots)}"
    for r, err in enumerate(outs):
        assert isinstance(err, ValueError), f"rank {r}: {err!r}"  # a hang: TimeoutError
        assert str(err) == want
    assert not hub.box, "every message of the failed call is read"


@pytest.mark.parametrize("check_roots", [True, False])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_rooted_collectives_with_one_root_give_the_plain_python_result(size, check_roots):
    def fn(comm):
        return {(name, root): _rooted_call(name, comm, root)
                for root in range(comm.size) for name in ("bcast", "gather", "scatter", "reduce")}

    hub = Hub(size)
    outs = run_ranks(size, fn, hub, check_roots)
    assert not hub.box
    for r, got in enumerate(outs):
        assert isinstance(got, dict), f"rank {r}: {got!r}"
        for root in range(size):
            assert got["bcast", root] == {"from": root, "data": [root] * 3}
            assert got["gather", root] == ([(s, s * s) for s in range(size)] if r == root
                                           else None)
            assert got["scatter", root] == f"item {r}"
            red = got["reduce", root]
            if r != root:
                assert red is None
                continue
            want = _rank_order_sum([np.arange(4.0) * (s + 1) for s in range(size)])
            assert red.dtype == want.dtype and red.tobytes() == want.tobytes()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_reduce_of_python_objects_at_each_root_is_exact(size):
    vals = [Fraction(1, s + 2) for s in range(size)]
    outs = run_ranks(size, lambda c: [c.reduce(vals[c.rank], op="sum", root=root)
                                      for root in range(c.size)])
    for r, got in enumerate(outs):
        assert got == [sum(vals) if root == r else None for root in range(size)]


@pytest.mark.parametrize("bad", [3, -1, 7])
def test_a_root_out_of_range_raises_at_once_on_its_rank_and_the_others_name_it(bad):
    # alone, the rank must raise without waiting: a receive would time out at once
    lone = Communicator(ThreadTransport(Hub(3), 1, timeout_s=0.01), check_roots=True)
    with pytest.raises(ValueError, match=f"^root rank {bad} out of range for a group of size 3$"):
        lone.bcast("x", root=bad)
    roots = [0, bad, 0]
    outs = run_ranks(3, lambda c: c.gather(c.rank, root=roots[c.rank]))
    assert isinstance(outs[1], ValueError) and str(outs[1]) == \
        f"root rank {bad} out of range for a group of size 3"
    for r in (0, 2):
        assert isinstance(outs[r], ValueError), f"rank {r}: {outs[r]!r}"
        assert str(outs[r]) == f"gather: every rank must pass the same root; got {_roots_text(roots)}"


def test_the_same_root_out_of_range_everywhere_raises_on_every_rank():
    outs = run_ranks(3, lambda c: c.scatter([1, 2, 3], root=3))
    for r, err in enumerate(outs):
        assert isinstance(err, ValueError) and str(err) == \
            "root rank 3 out of range for a group of size 3", f"rank {r}: {err!r}"


def test_a_root_that_is_not_an_int_is_named():
    roots = [0, "0"]
    outs = run_ranks(2, lambda c: c.bcast(1, root=roots[c.rank]))
    assert isinstance(outs[1], TypeError) and str(outs[1]) == "root rank must be an int, got '0'"
    assert str(outs[0]) == "bcast: every rank must pass the same root; got rank 0: root=0, " \
        "rank 1: root='0'"
    # numpy integers are roots like ints
    assert run_ranks(2, lambda c: c.bcast(c.rank, root=[1, np.int64(1)][c.rank])) == [1, 1]


def test_different_rooted_collectives_on_different_ranks_raise_on_every_rank():
    calls = ["bcast", "gather", "bcast"]
    outs = run_ranks(3, lambda c: _rooted_call(calls[c.rank], c, 0))
    want = ("bcast: every rank must call the same collective; got rank 0: bcast root=0, "
            "rank 1: gather root=0, rank 2: bcast root=0")
    for r, err in enumerate(outs):
        assert isinstance(err, ValueError), f"rank {r}: {err!r}"
        assert str(err) == want.replace("bcast:", f"{calls[r]}:", 1)


@pytest.mark.parametrize("objs, text", [([1, 2], "2 objects"), (None, "None"), (5, "a int")])
def test_scatter_of_a_wrong_list_at_the_root_raises_on_every_rank(objs, text):
    outs = run_ranks(3, lambda c: c.scatter(objs if c.rank == 1 else None, root=1))
    for r, err in enumerate(outs):
        assert isinstance(err, ValueError), f"rank {r}: {err!r}"
        assert str(err) == f"scatter: the root (rank 1) must pass one object per rank (3), got {text}"


# MPI's buffer forms: the roots and the buffers' sizes and types travel together
def _mpi_ranks(size, fn):
    hub = Hub(size)
    outs = run_ranks(size, lambda c: fn(MPI.Intracomm(c)), hub)
    return outs, hub


def _buffer_text(roots, items):
    return ", ".join(f"rank {r}: root={x} with {n}" for r, (x, n) in enumerate(zip(roots, items)))


_BUFFER_PREFIX = "every rank must pass the same root and a buffer of the same size and type; got "


@pytest.mark.parametrize("roots", [[0, 1], [0, 0, 2], [1, 1, 1, 0]])
def test_buffer_bcast_with_different_roots_raises_on_every_rank(roots):
    def fn(c):
        buf = np.full(4, float(c.rank))
        c.Bcast(buf, root=roots[c.rank])
        return buf

    outs, hub = _mpi_ranks(len(roots), fn)
    want = "Bcast: " + _BUFFER_PREFIX + _buffer_text(roots, ["4 items of float64"] * len(roots))
    for r, err in enumerate(outs):
        assert isinstance(err, ValueError) and str(err) == want, f"rank {r}: {err!r}"
    assert not hub.box


def test_buffer_collectives_with_mismatched_buffers_raise_on_every_rank():
    # the same root, but rank 1's buffer is shorter (Bcast) or of another type (Reduce)
    def bcast(c):
        c.Bcast(np.zeros(4 - (c.rank == 1)), root=0)

    outs, _ = _mpi_ranks(3, bcast)
    items = ["4 items of float64", "3 items of float64", "4 items of float64"]
    want = "Bcast: " + _BUFFER_PREFIX + _buffer_text([0, 0, 0], items)
    assert [str(e) for e in outs] == [want] * 3

    def reduce(c):
        c.Reduce(np.ones(2, dtype="f8" if c.rank != 1 else "f4"), np.zeros(2) if c.rank == 0
                 else None, op=MPI.SUM, root=0)

    outs, _ = _mpi_ranks(2, reduce)
    want = "Reduce: " + _BUFFER_PREFIX + _buffer_text([0, 0], ["2 items of float64",
                                                               "2 items of float32"])
    assert [str(e) for e in outs] == [want] * 2

    def gather(c):  # the root's blocks hold 2 items, rank 2 sends 3
        c.Gather(np.ones(3 if c.rank == 2 else 2, dtype="i8"),
                 np.zeros(6, dtype="i8") if c.rank == 1 else None, root=1)

    outs, _ = _mpi_ranks(3, gather)
    items = ["2 items of int64", "2 items of int64", "3 items of int64"]
    want = "Gather: " + _BUFFER_PREFIX + _buffer_text([1, 1, 1], items)
    assert [str(e) for e in outs] == [want] * 3

    def scatter(c):  # the root sends blocks of 2 items, rank 0 receives 1
        c.Scatter(np.arange(6, dtype="i8") if c.rank == 2 else None,
                  np.zeros(1 if c.rank == 0 else 2, dtype="i8"), root=2)

    outs, _ = _mpi_ranks(3, scatter)
    items = ["1 items of int64", "2 items of int64", "2 items of int64"]
    want = "Scatter: " + _BUFFER_PREFIX + _buffer_text([2, 2, 2], items)
    assert [str(e) for e in outs] == [want] * 3


@pytest.mark.parametrize("call, want", [
    # a rank's own wrong input reaches every rank instead of leaving the root waiting
    (lambda c: c.Gather(MPI.IN_PLACE, np.zeros(4), root=0),
     "Gather: IN_PLACE is for the root's send buffer only"),
    (lambda c: c.Reduce(MPI.IN_PLACE, np.zeros(2), root=0),
     "Reduce: IN_PLACE is for the root's send buffer only"),
    (lambda c: c.Scatter(np.arange(4.0) if c.rank == 0 else None,
                         MPI.IN_PLACE if c.rank == 1 else np.zeros(2), root=0),
     "Scatter: IN_PLACE is for the root's receive buffer only"),
    (lambda c: c.Bcast(np.zeros(2) if c.rank != 1 else "ab", root=0),
     "Bcast: the buffer must be a numpy array, got str"),
    (lambda c: c.Gather(np.zeros(2), np.zeros(5) if c.rank == 0 else None, root=0),
     "Gather: a buffer of 5 items does not split into 2 equal blocks"),
    (lambda c: c.Gather(np.zeros(3), np.zeros(4) if c.rank == 0 else None, root=0),
     "Gather: the root's send buffer (3 items of float64) does not match its receive "
     "buffer's blocks (2 items of float64)"),
])
def test_a_buffer_form_whose_rank_has_a_bad_buffer_raises_on_every_rank(call, want):
    outs, _ = _mpi_ranks(2, call)
    for r, err in enumerate(outs):
        assert not isinstance(err, TimeoutError), f"rank {r} waited: {err!r}"
        assert isinstance(err, Exception) and str(err) == want, f"rank {r}: {err!r}"


@pytest.mark.parametrize("size", [2, 3, 4])
def test_buffer_forms_with_one_root_give_the_numpy_result(size):
    def fn(c):
        r, p = c.rank, c.size
        out = {}
        for root in range(p):
            b = np.arange(3.0) * (root + 1) if r == root else np.zeros(3)
            c.Bcast(b, root=root)
            g = np.full(2 * p, -1, dtype="i8") if r == root else None
            c.Gather(np.array([r, 10 * r], dtype="i8"), g, root=root)
            sc = np.zeros(2, dtype="i8")
            c.Scatter(np.arange(2 * p, dtype="i8") * 3 if r == root else None, sc, root=root)
            red = np.zeros(3) if r == root else None
            c.Reduce(np.arange(3.0) + r, red, op=MPI.MAX, root=root)
            ip = np.arange(3.0) * (r + 1)
            c.Reduce(MPI.IN_PLACE if r == root else ip, ip, op=MPI.SUM, root=root)
            out[root] = (b, g, sc, red, ip)
        return out

    outs, hub = _mpi_ranks(size, fn)
    assert not hub.box
    for r, got in enumerate(outs):
        assert isinstance(got, dict), f"rank {r}: {got!r}"
        for root, (b, g, sc, red, ip) in got.items():
            np.testing.assert_array_equal(b, np.arange(3.0) * (root + 1))
            np.testing.assert_array_equal(sc, np.arange(2 * size).reshape(size, 2)[r] * 3)
            if r != root:
                assert g is None and red is None
                continue
            np.testing.assert_array_equal(g, np.array([[s, 10 * s] for s in range(size)]).ravel())
            np.testing.assert_array_equal(red, np.arange(3.0) + size - 1)
            want = _rank_order_sum([np.arange(3.0) * (s + 1) for s in range(size)])
            assert ip.tobytes() == want.tobytes()


def _rooted_on_a_gang(comm, block, name, roots):
    assert comm.check_roots, "the gang's hpc.check_collectives reaches every rank"
    comm._t.timeout_s = _TIMEOUT_S
    try:
        got = _rooted_call(name, comm, roots[comm.rank])
    except Exception as err:  # noqa: BLE001 - the driver checks what each rank raised
        return type(err).__name__, str(err)
    return "no error", repr(got)


@pytest.mark.parametrize("name, roots", [("bcast", [0, 0, 1, 1]), ("scatter", [3, 2, 1, 0]),
                                         ("gather", [0, 0, 0, 2]), ("reduce", [1, 0, 1, 1])])
def test_a_gang_with_different_roots_raises_on_every_rank(checked_gang4, name, roots):
    """On both backends: gloo's own broadcast does not check, so a checked gloo world
    broadcasts over point-to-point messages."""
    from rayflow.hpc import BlockDataset, mpimap

    outs = mpimap(_rooted_on_a_gang, BlockDataset.from_numpy(np.zeros(4), 4),
                  gang=checked_gang4, fn_args=(name, roots)).blocks()
    want = f"{name}: every rank must pass the same root; got {_roots_text(roots)}"
    assert outs == [("ValueError", want)] * 4


@pytest.fixture(scope="module", params=["ray", "gloo"])
def checked_gang4(ray_session, request):
    from rayflow.config import HpcOptions
    from rayflow.hpc import Gang

    if request.param == "gloo":
        pytest.importorskip("torch")
    g = Gang(4, backend=request.param, rank_num_cpus=0.5, gang_timeout_s=60,
             options=HpcOptions(check_collectives=True)).start()
    yield g
    g.shutdown()


def _unchecked_on_a_gang(comm, block):
    return comm.check_roots, comm.bcast(comm.rank * 10 if comm.rank == 2 else None, root=2)


def test_a_default_gang_does_not_check_roots_and_still_broadcasts(gang4):
    """Unchecked, as MPI: a matched call costs no message beyond the algorithm's."""
    from rayflow.hpc import BlockDataset, mpimap

    outs = mpimap(_unchecked_on_a_gang, BlockDataset.from_numpy(np.zeros(4), 4),
                  gang=gang4).blocks()
    assert outs == [(False, 20)] * 4


class _CountingTransport(ThreadTransport):
    def send(self, dest, key, obj):
        with self.hub.cond:
            self.hub.sent = getattr(self.hub, "sent", 0) + 1
        super().send(dest, key, obj)


@pytest.mark.parametrize("check_roots, messages", [(False, 3), (True, 12)])
def test_a_bcast_sends_the_roots_messages_unless_it_checks(check_roots, messages):
    """Unchecked (the default, as MPI) a 4-rank bcast sends the root's 3 messages; checked,
    every rank sends one to every other (4 x 3)."""
    hub = Hub(4)
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(lambda c: c.bcast("x" if c.rank == 1 else None, root=1),
                          Communicator(_CountingTransport(hub, r, _TIMEOUT_S),
                                       check_roots=check_roots)) for r in range(4)]
        assert [f.result() for f in futs] == ["x"] * 4
    assert hub.sent == messages and not hub.box
