"""The CG recurrence and its checkpoints, without Ray."""

from __future__ import annotations

import numpy as np
import pytest

from rayflow.hpc.algorithms.cg_math import conjugate_gradient


def _spd(n, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    return m @ m.T + n * np.eye(n), rng.standard_normal(n)


def test_cg_solves_spd_system_and_residuals_fall():
    a, b = _spd(40)
    x, hist, st = conjugate_gradient(lambda v: a @ v, np.dot, b, tol=1e-12, max_iter=200)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-9, atol=1e-10)
    assert hist[0] == np.linalg.norm(b) and hist[-1] <= 1e-12 * np.linalg.norm(b)
    assert len(hist) == st.iteration + 1 and st.iteration < 40


def test_max_iter_stops_early_and_tol_zero_runs_exactly():
    a, b = _spd(30)
    _, hist, st = conjugate_gradient(lambda v: a @ v, np.dot, b, tol=0.0, max_iter=5)
    assert st.iteration == 5 and len(hist) == 6


def test_resume_from_checkpoint_gives_the_same_answer():
    a, b = _spd(30, seed=3)
    saved = []
    x_full, hist_full, _ = conjugate_gradient(
        lambda v: a @ v, np.dot, b, tol=1e-12, checkpoint=lambda s: saved.append(s.copy()),
        checkpoint_every=4,
    )
    assert [s.iteration for s in saved] == list(range(4, 4 * len(saved) + 1, 4)) and saved
    mid = saved[1]
    x_res, hist_res, st = conjugate_gradient(lambda v: a @ v, np.dot, b, tol=1e-12, state=mid.copy())
    np.testing.assert_array_equal(x_res, x_full)  # same arithmetic, bit for bit
    assert hist_res == hist_full


def test_x0_is_used():
    a, b = _spd(20, seed=5)
    x_true = np.linalg.solve(a, b)
    _, hist, st = conjugate_gradient(lambda v: a @ v, np.dot, b, x0=x_true, tol=1e-8)
    assert st.iteration == 0 and hist[0] < 1e-8 * np.linalg.norm(b)


def _hpd(n, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    return m @ m.conj().T + n * np.eye(n), rng.standard_normal(n) + 1j * rng.standard_normal(n)


def test_complex_hermitian_system_is_solved_with_the_conjugated_product():
    a, b = _hpd(30)
    x, hist, st = conjugate_gradient(lambda v: a @ v, np.vdot, b, tol=1e-12, max_iter=300)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-9, atol=1e-10)
    assert x.dtype == np.complex128 and st.converged and not st.breakdown
    assert hist[0] == pytest.approx(np.linalg.norm(b), rel=1e-15)
    assert all(type(h) is float for h in hist)


def test_zero_matrix_breaks_down_with_a_clear_state_and_zero_rhs_converges_at_once():
    b = np.ones(4)
    x, hist, st = conjugate_gradient(lambda v: np.zeros_like(v), np.vdot, b, tol=1e-8)
    assert st.breakdown and not st.converged and st.iteration == 0 and hist == [2.0]
    np.testing.assert_array_equal(x, np.zeros(4))
    x, hist, st = conjugate_gradient(lambda v: np.zeros_like(v), np.vdot, np.zeros(3))
    assert st.converged and not st.breakdown and st.iteration == 0 and hist == [0.0]


def test_integer_x0_and_rhs_give_a_float_iterate():
    a = np.array([[2, 0], [0, 4]])
    x, _, st = conjugate_gradient(lambda v: a @ v, np.vdot, np.array([2, 4]), x0=np.array([0, 0]),
                                  tol=1e-12)
    assert x.dtype == np.float64 and st.converged
    np.testing.assert_allclose(x, [1.0, 1.0])
