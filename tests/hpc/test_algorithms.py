"""Cannon, CG and the baselines against numpy/scipy ground truth."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from rayflow.hpc import BlockDataset, broadcast_cg, cannon_matmul, cg_solve, shuffle_matmul


def _mats(m, k, n, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)


def _spd(n, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    return m @ m.T + n * np.eye(n), rng.standard_normal(n)


@pytest.mark.parametrize("n", [8, 13])  # 13: ragged blocks on a 2x2 grid
def test_cannon_2x2_float64(gang4, n):
    a, b = _mats(n, n, n, seed=n)
    c = cannon_matmul(a, b, grid=2, gang=gang4)
    assert c.grid == (2, 2) and c.shape == (n, n)
    got = c.to_numpy()
    assert np.abs(got - a @ b).max() / np.abs(a @ b).max() <= 1e-12


def test_cannon_rectangular_and_float32(gang4):
    a, b = _mats(9, 7, 5, dtype=np.float32, seed=1)
    got = cannon_matmul(a, b, grid=2, gang=gang4).to_numpy()
    assert got.dtype == np.float32 and got.shape == (9, 5)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # starting 9 ranks on 2 cores takes 10-20 s; the 3x3 algebra is also
# covered without Ray in test_cannon_index.py and test_comm_threads.py
def test_cannon_3x3_ragged_from_generated_blocks(gang9):
    n = 20  # blocks of 7, 7, 6
    rng = np.random.default_rng(7)
    a_full, b_full = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    A = BlockDataset.from_function(lambda i, j, r, c: a_full[r, c], (n, n), (3, 3))
    B = BlockDataset.from_numpy(b_full, (3, 3))
    got = cannon_matmul(A, B, gang=gang9).to_numpy()
    np.testing.assert_allclose(got, a_full @ b_full, rtol=1e-12, atol=1e-12)


def test_cannon_of_a_dataset_with_itself_on_its_own_gang(ray_session):
    """A @ A: the skewed inputs share blocks (the same object refs twice) when the stage
    starts its own gang."""
    a, _ = _mats(10, 10, 10, seed=3)
    A = BlockDataset.from_numpy(a, (2, 2))
    got = cannon_matmul(A, A, rank_num_cpus=0.25).to_numpy()
    np.testing.assert_allclose(got, a @ a, rtol=1e-12, atol=1e-12)


def test_cannon_single_rank(ray_session):
    a, b = _mats(6, 6, 6)
    np.testing.assert_allclose(cannon_matmul(a, b, ranks=1, rank_num_cpus=0.5).to_numpy(), a @ b)


@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_cannon_rejects_non_square_rank_counts_before_starting(ranks):
    a, b = _mats(4, 4, 4)
    with pytest.raises(ValueError, match="square number of ranks"):
        cannon_matmul(a, b, ranks=ranks)


def test_cannon_rejects_mismatched_grid(ray_session):
    a, b = _mats(4, 4, 4)
    with pytest.raises(ValueError, match="Cannon needs"):
        cannon_matmul(BlockDataset.from_numpy(a, (2, 1)), b, grid=2)


@pytest.mark.parametrize("grid", [1, 2])
def test_shuffle_baseline_matches_numpy(ray_session, grid):
    a, b = _mats(11, 11, 11, seed=4)
    np.testing.assert_allclose(shuffle_matmul(a, b, grid=grid).to_numpy(), a @ b, rtol=1e-12)


def test_cg_dense_on_4_ranks_ragged(gang4):
    a, b = _spd(30, seed=2)  # 30 rows over 4 ranks: 8, 8, 7, 7
    res = cg_solve(a, b, tol=1e-10, ranks=4, gang=gang4)
    assert res.converged and res.iterations == len(res.history) - 1
    np.testing.assert_allclose(res.x, np.linalg.solve(a, b), rtol=1e-8, atol=1e-10)
    assert res.history[-1] <= 1e-10 * np.linalg.norm(b) < res.history[0]


def test_cg_sparse_csr_rows_and_max_iter(gang4):
    n = 60
    lap = sp.diags([-1.0, 2.2, -1.0], [-1, 0, 1], shape=(n, n), format="csr")
    b = np.ones(n)
    res = cg_solve(lap, b, ranks=4, tol=1e-10, gang=gang4)
    np.testing.assert_allclose(lap @ res.x, b, atol=1e-8)
    short = cg_solve(lap, b, ranks=4, tol=1e-10, max_iter=3, gang=gang4)
    assert short.iterations == 3 and not short.converged


def test_broadcast_cg_baseline_matches(ray_session):
    a, b = _spd(25, seed=9)
    res = broadcast_cg(a, b, workers=2, tol=1e-10, num_cpus=0.5)
    assert res.converged
    np.testing.assert_allclose(res.x, np.linalg.solve(a, b), rtol=1e-8, atol=1e-10)
