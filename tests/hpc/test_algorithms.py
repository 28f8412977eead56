"""Cannon, CG and the baselines against numpy/scipy ground truth."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from rayflow.hpc import BlockDataset, broadcast_cg, cannon_matmul, cg_solve, shuffle_matmul
from rayflow.hpc.algorithms.cg import ConvergenceWarning


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


@pytest.mark.parametrize("grid", [2.5, "2", True])
def test_cannon_rejects_a_grid_that_is_not_an_int(grid):
    """Not rounded to another grid (2.5 ran on a 2 x 2 grid)."""
    a, b = _mats(4, 4, 4)
    with pytest.raises(ValueError, match="cannon_matmul: grid must be an int"):
        cannon_matmul(a, b, grid=grid)


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
    with pytest.warns(ConvergenceWarning, match="did not converge.*after 3 iterations.*maxiter=3"):
        short = cg_solve(lap, b, ranks=4, tol=1e-10, max_iter=3, gang=gang4)
    assert short.iterations == 3 and not short.converged and not short.breakdown


def _hpd(n, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    return m @ m.conj().T + n * np.eye(n), rng.standard_normal(n) + 1j * rng.standard_normal(n)


def test_cg_complex_hermitian_matches_numpy_and_scipy(gang4):
    a, b = _hpd(21, seed=4)
    res = cg_solve(a, b, ranks=4, tol=1e-12, gang=gang4)
    x_scipy, info = spla.cg(a, b, rtol=1e-12)
    assert info == 0 and res.converged and res.iterations > 0
    assert res.x.dtype == np.complex128
    np.testing.assert_allclose(res.x, np.linalg.solve(a, b), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(res.x, x_scipy, rtol=1e-8, atol=1e-9)
    # a real right-hand side with a complex matrix gives a complex solution too
    res_real_b = cg_solve(a, b.real, ranks=4, tol=1e-12, gang=gang4)
    np.testing.assert_allclose(res_real_b.x, np.linalg.solve(a, b.real), rtol=1e-9, atol=1e-10)


def test_cg_zero_matrix_and_zero_rhs(gang4):
    with pytest.warns(ConvergenceWarning, match="broke down"):
        res = cg_solve(np.zeros((6, 6)), np.ones(6), ranks=4, gang=gang4)
    assert res.breakdown and not res.converged and res.iterations == 0
    np.testing.assert_array_equal(res.x, np.zeros(6))
    zero = cg_solve(np.eye(5) * 2, np.zeros(5), ranks=4, gang=gang4)
    assert zero.converged and zero.iterations == 0
    np.testing.assert_array_equal(zero.x, np.zeros(5))


def test_cg_takes_what_scipy_takes(gang4):
    """COO and other sparse formats, nested lists, b and x0 of shape (n, 1), maxiter."""
    n = 24
    lap = sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], shape=(n, n))
    rng = np.random.default_rng(1)
    b = rng.standard_normal(n)
    want = np.linalg.solve(lap.toarray(), b)
    for a in (lap.tocoo(), sp.coo_array(lap), lap.todia(), lap.toarray().tolist()):
        res = cg_solve(a, b[:, None], ranks=4, tol=1e-12, gang=gang4)
        assert res.x.shape == (n,) and res.converged
        np.testing.assert_allclose(res.x, want, rtol=1e-10, atol=1e-12)
    res = cg_solve(lap, b, x0=want[:, None], ranks=4, gang=gang4)
    assert res.iterations == 0 and res.converged  # started at the solution
    short = cg_solve(lap, b, maxiter=2, tol=0.0, ranks=4, gang=gang4)
    assert short.iterations == 2
    # CG does not converge for a non-symmetric matrix: the default maxiter (10 n, as scipy)
    # ends it (this one's symmetric part is I, so no step breaks down)
    skew = rng.standard_normal((6, 6))
    with pytest.warns(ConvergenceWarning, match="reached maxiter=60"):
        endless = cg_solve(np.eye(6) + 3 * (skew - skew.T), b[:6], ranks=4, gang=gang4)
    assert endless.iterations == 60 and not endless.converged and not endless.breakdown


@pytest.mark.parametrize("a, b, kwargs, message", [
    (np.eye(4), np.ones(5), {}, r"b has shape \(5,\); A has shape \(4, 4\), so b must have "
                                r"shape \(4,\) or \(4, 1\)"),
    (np.eye(4), np.ones((4, 2)), {}, r"b has shape \(4, 2\)"),
    (np.ones((3, 4)), np.ones(3), {}, r"A must be square, got shape \(3, 4\)"),
    (np.ones(4), np.ones(4), {}, r"A must be a 2-D matrix, got shape \(4,\)"),
    (np.eye(4), np.ones(4), {"x0": np.ones(3)}, r"x0 has shape \(3,\)"),
    (np.eye(4), np.ones(4), {"maxiter": 3, "max_iter": 4}, "disagree"),
    (np.eye(4), np.ones(4), {"maxiter": -1}, "non-negative"),
    (np.eye(4), np.ones(4), {"tol": -1.0}, "tol must be >= 0"),
    (np.eye(4), np.ones(4), {"ranks": 0}, "ranks must be a positive int"),
])
def test_cg_rejects_bad_input_on_the_driver(ray_session, a, b, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cg_solve(a, b, **kwargs)


def test_cg_unknown_option_is_an_error(ray_session):
    with pytest.raises(TypeError, match="bogus"):
        cg_solve(np.eye(2), np.ones(2), bogus=1)


def test_block_dataset_input_checks(ray_session):
    coo = sp.random(7, 5, density=0.4, random_state=2, format="coo")
    got = BlockDataset.from_numpy(coo, (2, 2)).to_numpy()
    assert sp.issparse(got) and (got != coo.tocsr()).nnz == 0
    lists = BlockDataset.from_numpy([[1.0, 2.0], [3.0, 4.0]], (2, 1))
    np.testing.assert_array_equal(lists.to_numpy(), [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(BlockDataset.from_numpy([1, 2, 3], 2).to_numpy(), [1, 2, 3])
    with pytest.raises(ValueError, match=r"1-D or 2-D.*got shape \(2, 2, 2\)"):
        BlockDataset.from_numpy(np.zeros((2, 2, 2)), 2)
    with pytest.raises(ValueError, match=r"got shape \(\)"):
        BlockDataset.from_numpy(3.0, 1)
    with pytest.raises(ValueError, match=r"a 1-D array \(shape \(3,\)\) splits into a \(p, 1\)"):
        BlockDataset.from_numpy(np.arange(3.0), (1, 2))
    for grid in (0, (2, 0), (1, 2, 3), "2", 1.5):
        with pytest.raises(ValueError, match="grid must be p or \\(rows, cols\\) of positive"):
            BlockDataset.from_numpy(np.eye(2), grid)
    with pytest.raises(ValueError, match=r"shape must be \(n,\) or \(m, n\)"):
        BlockDataset.from_function(lambda *a: None, (2, 2, 2), 1)


def test_cannon_rejects_what_is_not_a_matrix(ray_session):
    with pytest.raises(ValueError, match=r"A must be a 2-D matrix, got shape \(4,\)"):
        cannon_matmul(np.ones(4), np.ones((4, 4)), grid=2)
    with pytest.raises(ValueError, match=r"B must be a 2-D matrix, got shape \(4,\)"):
        cannon_matmul(np.ones((4, 4)), np.ones(4), grid=2)
    with pytest.raises(ValueError, match=r"shapes \(4, 3\) and \(4, 4\) do not multiply"):
        cannon_matmul(np.ones((4, 3)), np.ones((4, 4)), grid=2)
    with pytest.raises(ValueError, match="scipy.sparse"):
        cannon_matmul(sp.eye(4, format="csr"), np.ones((4, 4)), grid=2)
    with pytest.raises(ValueError, match=r"vector dataset of shape \(4,\)"):
        cannon_matmul(BlockDataset.from_numpy(np.ones(4), 1), np.ones((4, 4)), grid=1)


def test_cannon_takes_nested_lists(gang4):
    a = [[1.0, 2.0], [3.0, 4.0]]
    got = cannon_matmul(a, a, grid=2, gang=gang4).to_numpy()
    np.testing.assert_array_equal(got, np.array(a) @ np.array(a))


def test_broadcast_cg_baseline_matches(ray_session):
    a, b = _spd(25, seed=9)
    res = broadcast_cg(a, b, workers=2, tol=1e-10, num_cpus=0.5)
    assert res.converged
    np.testing.assert_allclose(res.x, np.linalg.solve(a, b), rtol=1e-8, atol=1e-10)
