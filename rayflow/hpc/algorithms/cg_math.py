"""The conjugate-gradient recurrence, written once over injected mat-vec and dot functions.

Usage: ``x, hist, _ = conjugate_gradient(lambda v: A @ v, np.vdot, b, tol=1e-8)``

The same function runs the single-process numpy baseline and each rank of the distributed
solver (there ``matvec`` combines the ranks' pieces of ``A v``), so the two can only differ
in communication, never in arithmetic. ``dot(u, v)`` is the inner product ``u^H v``
(``numpy.vdot``; for real vectors ``numpy.dot`` is the same), so complex Hermitian positive
definite systems are solved too. No Ray is imported here.

>>> import numpy as np
>>> A = np.array([[4.0, 1.0], [1.0, 3.0]]); b = np.array([1.0, 2.0])
>>> x, hist, state = conjugate_gradient(lambda v: A @ v, np.vdot, b, tol=1e-12)
>>> bool(np.allclose(A @ x, b)), state.iteration, state.converged
(True, 2, True)
>>> _, _, state = conjugate_gradient(lambda v: 0 * v, np.vdot, b)  # A = 0: no step possible
>>> state.iteration, state.converged, state.breakdown
(0, False, True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class CGState:
    """Everything needed to resume the recurrence at ``iteration`` (a checkpoint).

    Attributes:
        iteration: iterations completed.
        x: the (local piece of the) iterate.
        r: the residual piece ``b - A x``.
        p: the search direction piece.
        rho: the global ``r^H r`` (real).
        history: global residual norms ``||r_k||`` for k = 0..iteration.
        converged: whether ``||r|| <= tol * ||b||`` when the recurrence stopped.
        breakdown: whether it stopped because no step was possible (``p^H A p`` zero or not
            finite: ``A`` is singular or not positive definite, or the values overflowed).
    """

    iteration: int
    x: np.ndarray
    r: np.ndarray
    p: np.ndarray
    rho: float
    history: list[float] = field(default_factory=list)
    converged: bool = False
    breakdown: bool = False

    def copy(self) -> CGState:
        """A deep copy (checkpoints must not alias arrays the solver keeps mutating)."""
        return CGState(
            self.iteration, self.x.copy(), self.r.copy(), self.p.copy(), self.rho,
            list(self.history), self.converged, self.breakdown,
        )


def _real(z) -> float:
    """The real part of an inner product that is real in exact arithmetic (``r^H r``)."""
    return float(np.real(z))


def initial_state(
    matvec: Callable[[np.ndarray], np.ndarray],
    dot: Callable[[np.ndarray, np.ndarray], float],
    b: np.ndarray,
    x0: np.ndarray | None = None,
) -> CGState:
    """The state at iteration 0: ``r = p = b - A x0``.

    The iterate has ``b``'s dtype (at least float32; complex when ``b`` or ``x0`` is).
    """
    dtype = np.result_type(b.dtype, np.float32, *(() if x0 is None else (x0.dtype,)))
    if x0 is None:
        x = np.zeros(b.shape, dtype=dtype)
        r = b.astype(dtype, copy=True)
    else:
        x = x0.astype(dtype, copy=True)
        r = (b - matvec(x)).astype(dtype, copy=False)
    rho = _real(dot(r, r))
    return CGState(0, x, r, r.copy(), rho, [float(np.sqrt(rho))])


def conjugate_gradient(
    matvec: Callable[[np.ndarray], np.ndarray],
    dot: Callable[[np.ndarray, np.ndarray], float],
    b: np.ndarray,
    x0: np.ndarray | None = None,
    tol: float = 1e-8,
    max_iter: int = 1000,
    state: CGState | None = None,
    checkpoint: Callable[[CGState], None] | None = None,
    checkpoint_every: int = 0,
    on_iteration: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, list[float], CGState]:
    """Solve ``A x = b`` for Hermitian (real: symmetric) positive definite ``A`` by CG.

    Args:
        matvec: ``v -> A v`` on (pieces of) vectors.
        dot: global inner product ``u^H v`` of two (pieces of) vectors (``numpy.vdot``).
        b: the right-hand side (piece).
        x0: initial guess (zeros when ``None``); ignored when ``state`` is given.
        tol: stop when ``||r|| <= tol * ||b||``.
        max_iter: stop after this many iterations in total (counting resumed ones).
        state: resume from this checkpoint instead of iteration 0.
        checkpoint: called with a copy-safe state every ``checkpoint_every`` iterations.
        checkpoint_every: checkpoint interval in iterations; 0 disables checkpoints.
        on_iteration: called with the iteration number after each iteration (progress, tests).

    Returns:
        ``(x, history, state)``: the solution piece, the residual norms from iteration 0, and
        the final state (``state.converged``, ``state.breakdown`` say why it stopped).
    """
    bnorm = float(np.sqrt(_real(dot(b, b))))
    st = state if state is not None else initial_state(matvec, dot, b, x0)
    threshold = tol * (bnorm if bnorm > 0 else 1.0)
    st.breakdown = False
    while st.iteration < max_iter and st.history[-1] > threshold:
        q = matvec(st.p)
        # p^H A p is real for Hermitian A; its rounding-level imaginary part is dropped so
        # that the step stays real, as in exact arithmetic
        pq = _real(dot(st.p, q))
        if pq == 0.0 or not np.isfinite(pq):
            st.breakdown = True
            break
        alpha = st.rho / pq
        st.x += alpha * st.p
        st.r -= alpha * q
        rho_new = _real(dot(st.r, st.r))
        beta = rho_new / st.rho
        # p = r + beta p, in place to avoid a temporary per iteration
        st.p *= beta
        st.p += st.r
        st.rho = rho_new
        st.iteration += 1
        st.history.append(float(np.sqrt(rho_new)))
        if not np.isfinite(rho_new):  # overflow: the iterate is lost
            st.breakdown = True
            break
        if checkpoint is not None and checkpoint_every > 0 and st.iteration % checkpoint_every == 0:
            checkpoint(st)
        if on_iteration is not None:
            on_iteration(st.iteration)
    st.converged = st.history[-1] <= threshold
    return st.x, st.history, st
