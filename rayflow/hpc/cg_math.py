"""The conjugate-gradient recurrence, written once over injected mat-vec and dot functions.

Usage: ``x, hist, _ = conjugate_gradient(lambda v: A @ v, np.dot, b, tol=1e-8)``

The same function runs the single-process numpy baseline (``dot`` is ``numpy.dot``) and each
rank of the distributed solver (``matvec`` allgathers the vector pieces and ``dot`` allreduces
the local products), so the two can only differ in communication, never in arithmetic. No Ray
is imported here.

>>> import numpy as np
>>> A = np.array([[4.0, 1.0], [1.0, 3.0]]); b = np.array([1.0, 2.0])
>>> x, hist, state = conjugate_gradient(lambda v: A @ v, np.dot, b, tol=1e-12)
>>> bool(np.allclose(A @ x, b)), state.iteration
(True, 2)
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
        rho: the global ``r . r``.
        history: global residual norms ``||r_k||`` for k = 0..iteration.
    """

    iteration: int
    x: np.ndarray
    r: np.ndarray
    p: np.ndarray
    rho: float
    history: list[float] = field(default_factory=list)

    def copy(self) -> CGState:
        """A deep copy (checkpoints must not alias arrays the solver keeps mutating)."""
        return CGState(
            self.iteration, self.x.copy(), self.r.copy(), self.p.copy(), self.rho, list(self.history)
        )


def initial_state(
    matvec: Callable[[np.ndarray], np.ndarray],
    dot: Callable[[np.ndarray, np.ndarray], float],
    b: np.ndarray,
    x0: np.ndarray | None = None,
) -> CGState:
    """The state at iteration 0: ``r = p = b - A x0``."""
    x = np.zeros_like(b, dtype=np.result_type(b.dtype, np.float32)) if x0 is None else x0.copy()
    r = b - matvec(x) if x0 is not None else b.astype(x.dtype, copy=True)
    rho = float(dot(r, r))
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
    """Solve ``A x = b`` for SPD ``A`` by conjugate gradients.

    Args:
        matvec: ``v -> A v`` on (pieces of) vectors.
        dot: global dot product of two (pieces of) vectors.
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
        the final state.
    """
    bnorm = float(np.sqrt(dot(b, b)))
    st = state if state is not None else initial_state(matvec, dot, b, x0)
    threshold = tol * (bnorm if bnorm > 0 else 1.0)
    while st.iteration < max_iter and st.history[-1] > threshold:
        q = matvec(st.p)
        alpha = st.rho / float(dot(st.p, q))
        st.x += alpha * st.p
        st.r -= alpha * q
        rho_new = float(dot(st.r, st.r))
        beta = rho_new / st.rho
        # p = r + beta p, in place to avoid a temporary per iteration
        st.p *= beta
        st.p += st.r
        st.rho = rho_new
        st.iteration += 1
        st.history.append(float(np.sqrt(rho_new)))
        if checkpoint is not None and checkpoint_every > 0 and st.iteration % checkpoint_every == 0:
            checkpoint(st)
        if on_iteration is not None:
            on_iteration(st.iteration)
    return st.x, st.history, st
