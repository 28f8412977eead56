"""The CG recurrence and its checkpoints, without Ray."""

from __future__ import annotations

import numpy as np

from rayflow.hpc.cg_math import conjugate_gradient


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
