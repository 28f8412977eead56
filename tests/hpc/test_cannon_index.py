"""Cannon's index algebra, checked without Ray."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rayflow.hpc.algorithms import cannon_index as ci


@pytest.mark.parametrize("n,p", [(10, 3), (7, 7), (5, 8), (1024, 4), (0, 2)])
def test_split_sizes_cover_n_like_array_split(n, p):
    sizes = ci.split_sizes(n, p)
    assert sum(sizes) == n and len(sizes) == p
    assert sizes == [len(x) for x in np.array_split(np.arange(n), p)]
    assert ci.offsets(sizes)[-1] == n


@pytest.mark.parametrize("bad", [2, 3, 5, 8, 0])
def test_grid_side_rejects_non_square_rank_counts(bad):
    with pytest.raises(ValueError, match="square number of ranks"):
        ci.grid_side(bad)


def test_grid_side_of_squares():
    assert [ci.grid_side(k * k) for k in (1, 2, 3, 4)] == [1, 2, 3, 4]


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_schedule_visits_every_inner_index_once_and_matches_shifts(p):
    for i in range(p):
        for j in range(p):
            sched = ci.cannon_schedule(i, j, p)
            assert sorted(a[1] for a, _ in sched) == list(range(p))
            assert all(a[1] == b[0] for a, b in sched)  # inner indices agree every round
            assert sched[0] == (ci.skew_a_source(i, j, p), ci.skew_b_source(i, j, p))
            # after a left shift of A, rank (i, j) holds what (i, j+1) held the round before
            for t in range(1, p):
                right = ci.shift(i, j, 0, 1, p)
                below = ci.shift(i, j, 1, 0, p)
                assert sched[t][0] == ci.cannon_schedule(*right, p)[t - 1][0]
                assert sched[t][1] == ci.cannon_schedule(*below, p)[t - 1][1]


@pytest.mark.parametrize("n,p", [(9, 3), (10, 3), (7, 2), (4, 4)])
def test_serial_cannon_from_the_schedule_equals_matmul(n, p):
    rng = np.random.default_rng(n * p)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    o = ci.offsets(ci.split_sizes(n, p))
    blk = lambda m, i, j: m[o[i] : o[i + 1], o[j] : o[j + 1]]  # noqa: E731
    c = np.zeros_like(a)
    for i in range(p):
        for j in range(p):
            for (ai, ak), (bk, bj) in ci.cannon_schedule(i, j, p):
                c[o[i] : o[i + 1], o[j] : o[j + 1]] += blk(a, ai, ak) @ blk(b, bk, bj)
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


def test_pure_modules_do_not_import_ray():
    code = (
        "import sys; import rayflow.hpc.algorithms.cannon_index, rayflow.hpc.algorithms.cg_math, rayflow.hpc.comm; "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_accumulate_adds_the_product_in_place(dtype):
    from rayflow.hpc.algorithms.cannon import _accumulate

    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 7)).astype(dtype)
    b = rng.standard_normal((7, 4)).astype(dtype)
    c = rng.standard_normal((5, 4)).astype(dtype)
    want = c + a @ b
    buf = c.ctypes.data
    _accumulate(c, a, b)
    assert c.ctypes.data == buf  # no new array: the GEMM wrote into c
    np.testing.assert_allclose(c, want, rtol=1e-5 if dtype == np.float32 else 1e-13)


def test_accumulate_handles_read_only_strided_and_mixed_operands():
    from rayflow.hpc.algorithms.cannon import _accumulate

    rng = np.random.default_rng(4)
    a = np.asfortranarray(rng.standard_normal((6, 6)))[:, ::2]  # strided view
    b = rng.standard_normal((3, 5))
    b.flags.writeable = False  # like an object-store block
    c = np.zeros((6, 5))
    _accumulate(c, a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-13)
    c32 = np.zeros((6, 5), dtype=np.float64)
    _accumulate(c32, a.astype(np.float32), b)  # mixed dtypes: the plain path
    np.testing.assert_allclose(c32, a.astype(np.float32) @ b, rtol=1e-6)
