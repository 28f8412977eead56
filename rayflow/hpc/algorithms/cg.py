"""Conjugate gradient as one MPI stage over row blocks (dense or scipy.sparse CSR).

Usage: ``res = cg_solve(A, b, ranks=2, tol=1e-10); res.x, res.converged, res.history``

The signature follows ``scipy.sparse.linalg.cg`` (``x0``, ``maxiter`` defaulting to ``10 n``;
``max_iter`` is an alias), and so do the inputs it takes: dense arrays or lists, scipy.sparse
matrices of any format (split as CSR row blocks), ``b`` of shape ``(n,)`` or ``(n, 1)``, real
symmetric or complex Hermitian positive definite ``A``.

Rank ``r`` holds the row block ``A_r``; the vectors (``x``, ``r``, ``p``: O(n), against the
O(n²/P) of its block) are replicated on every rank. Each iteration is one collective: the
ranks combine their pieces ``A_r p`` of ``q = A p`` (an allreduce of the pieces placed at
their offsets); both dot products are then computed
locally on full vectors, identically on every rank, with no allreduce (two fewer round
trips per iteration than allgathering ``p`` and allreducing ``p.q`` and ``r.r``). The
recurrence itself is :func:`~rayflow.hpc.algorithms.cg_math.conjugate_gradient`, shared with the numpy
baseline, whose arithmetic it repeats exactly except for the row-block mat-vec.

Recovery: with ``checkpoint_every=k``, every rank sends a copy of its state to a checkpoint
actor owned by the driver every ``k`` iterations. If a rank dies, :func:`mpimap` re-runs the
stage on a new gang and the ranks resume from the newest iteration that *all* ranks saved,
instead of iteration 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import ray

from rayflow.hpc.algorithms.cg_math import CGState, conjugate_gradient
from rayflow.hpc.dataset import BlockDataset, dense_matrix
from rayflow.hpc.stage import StageInfo, mpimap

# Complete checkpoints kept; older ones are dropped. More than one, so a late save from a
# dying gang can never make the only complete checkpoint disappear.
_KEEP_CHECKPOINTS = 3


@ray.remote(num_cpus=0)
class CheckpointStore:
    """Per-rank CG states by iteration; lives outside the gang, owned by the driver."""

    def __init__(self, size: int):
        self._size = size
        self._states: dict[int, dict[int, CGState]] = {}

    def save(self, rank: int, state: CGState) -> None:
        # Copy: the arrays may be views of objects owned by the (mortal) rank actor.
        self._states.setdefault(state.iteration, {})[rank] = state.copy()
        complete = sorted(k for k, v in self._states.items() if len(v) == self._size)
        for k in complete[:-_KEEP_CHECKPOINTS]:
            del self._states[k]

    def latest(self) -> int | None:
        """The newest iteration saved by every rank."""
        complete = [k for k, v in self._states.items() if len(v) == self._size]
        return max(complete) if complete else None

    def get(self, iteration: int, rank: int) -> CGState:
        return self._states[iteration][rank]


class ConvergenceWarning(UserWarning):
    """``cg_solve`` stopped before the residual reached the tolerance."""


def cg_rank(
    comm,
    a_block,
    b_block: np.ndarray,
    tol: float,
    max_iter: int | None,
    checkpoint_every: int = 0,
    store: Any = None,
    on_iteration: Callable[[Any, int], None] | None = None,
    x0: np.ndarray | None = None,
):
    """The rank function: returns ``(x_r, info)`` (usable directly with mpimap).

    ``max_iter=None`` means ``10 n`` (scipy's default); ``x0`` is the full initial guess.
    """
    import time

    pieces = comm.allgather(np.asarray(b_block).reshape(-1))  # an (n_r, 1) block is a vector
    lo = sum(len(piece) for piece in pieces[:comm.rank])
    hi = lo + len(pieces[comm.rank])
    dtype = np.result_type(a_block.dtype, *(piece.dtype for piece in pieces), np.float32)
    b = np.concatenate(pieces).astype(dtype, copy=False)  # replicated, as x, r and p will be
    if max_iter is None:
        max_iter = 10 * len(b)

    def matvec(v: np.ndarray) -> np.ndarray:
        # full v in, full A v out: the one collective. An allreduce of the pieces at their
        # offsets (zeros elsewhere, so the sum is exact) is one round of the native backend;
        # an allgather of arrays is two (sizes, then data).
        buf = np.zeros(len(b), dtype=np.result_type(a_block.dtype, v.dtype))
        buf[lo:hi] = a_block @ v
        return comm.allreduce(buf)

    state, resumed_from = None, 0
    if store is not None and comm.attempt > 0:
        k = comm.bcast(ray.get(store.latest.remote()) if comm.rank == 0 else None, 0)
        if k is not None:
            state = ray.get(store.get.remote(k, comm.rank)).copy()  # fetched arrays are read-only
            resumed_from = k

    def checkpoint(st: CGState) -> None:
        store.save.options(num_returns=0).remote(comm.rank, st.copy())

    hook = None if on_iteration is None else (lambda k: on_iteration(comm, k))
    t0 = time.perf_counter()
    x, history, st = conjugate_gradient(
        matvec, np.vdot, b, x0=x0, tol=tol, max_iter=max_iter, state=state,
        checkpoint=checkpoint if store is not None else None,
        checkpoint_every=checkpoint_every, on_iteration=hook,
    )
    loop_s = time.perf_counter() - t0
    info = {
        "iterations": st.iteration,
        "resumed_from": resumed_from,
        "iterations_run": st.iteration - resumed_from,
        "history": history,
        "loop_s": loop_s,
        "converged": st.converged,
        "breakdown": st.breakdown,
        "maxiter": max_iter,
    }
    return x[lo:hi].copy(), info


@dataclass
class CGResult:
    """The solution and how it was reached.

    Attributes:
        x: the solution vector, shape ``(n,)``.
        history: residual norms ``||b - A x_k||`` (recurrence), k = 0..iterations.
        iterations: iterations in total.
        converged: whether ``history[-1] <= tol * ||b||``.
        resumed_from: the checkpoint iteration the last attempt started from (0 = none).
        iterations_run: iterations computed by the last attempt.
        ms_per_iteration: loop time per iteration of the last attempt (rank 0).
        stage: the stage's :class:`~rayflow.hpc.stage.StageInfo`.
        breakdown: CG stopped because no step was possible (``p^H A p`` was zero or not
            finite: ``A`` is singular or not positive definite).
    """

    x: np.ndarray
    history: list[float]
    iterations: int
    converged: bool
    resumed_from: int = 0
    iterations_run: int = 0
    ms_per_iteration: float = 0.0
    stage: StageInfo | None = None
    breakdown: bool = False


def _as_matrix(a: Any, what: str) -> Any:
    """``a`` as a 2-D numpy array or CSR matrix, or a ValueError naming its shape."""
    if hasattr(a, "tocsr") and getattr(a, "ndim", 2) == 2:  # scipy.sparse, any format
        return a.tocsr()
    return dense_matrix(a, what)


def _row_blocks(x: Any, p: int, what: str) -> BlockDataset:
    """The row blocks of matrix ``x`` over ``p`` ranks (a (p, 1) grid)."""
    if isinstance(x, BlockDataset):
        if x.grid[1] != 1:
            raise ValueError(f"{what} must be split in row blocks (a (p, 1) grid), got {x.grid}")
        return x
    return BlockDataset.from_numpy(_as_matrix(x, what), (p, 1))


def _as_vector(v: Any, n: int | None, what: str, shape_a: Any) -> np.ndarray:
    """``v`` as a vector of length ``n``: shape (n,) or (n, 1), as scipy accepts."""
    arr = np.asarray(v)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1 or (n is not None and arr.shape[0] != n):
        want = "(n,) or (n, 1)" if n is None else f"({n},) or ({n}, 1)"
        raise ValueError(
            f"cg_solve: {what} has shape {np.shape(v)}; A has shape {shape_a}, so {what} "
            f"must have shape {want}"
        )
    if arr.dtype.kind not in "biufc":
        raise ValueError(f"cg_solve: {what} must hold numbers, got dtype {arr.dtype}")
    return arr


def cg_solve(
    a: Any,
    b: Any,
    x0: Any = None,
    ranks: int | None = None,
    tol: float = 1e-8,
    maxiter: int | None = None,
    checkpoint_every: int = 0,
    on_iteration: Callable[[Any, int], None] | None = None,
    max_iter: int | None = None,
    **stage_options: Any,
) -> CGResult:
    """Solve ``a x = b`` by distributed conjugate gradients, as ``scipy.sparse.linalg.cg``.

    ``a`` must be Hermitian positive definite (real: symmetric positive definite); complex
    systems use the conjugated inner product. A run that stops before the tolerance warns
    (:class:`ConvergenceWarning`) and returns ``converged=False``; so does a breakdown
    (``p^H A p = 0``, e.g. a zero or singular matrix), with ``breakdown=True``.

    Args:
        a: numpy array (or nested lists), scipy.sparse matrix of any format, or a row-block
            ``BlockDataset``; square.
        b: vector of shape ``(n,)`` or ``(n, 1)``, or a ``BlockDataset`` split like ``a``.
        x0: initial guess, shape ``(n,)`` or ``(n, 1)`` (zeros when ``None``).
        ranks: number of ranks (default: ``a``'s block count, else 1).
        tol: relative residual tolerance: stop when ``||b - A x|| <= tol * ||b||``; 0 runs
            exactly ``maxiter`` iterations (and does not warn).
        maxiter: iteration limit (default ``10 * n``, as scipy).
        checkpoint_every: checkpoint interval in iterations (0: restart from 0 on failure).
        on_iteration: ``fn(comm, k)`` called on every rank after iteration ``k``.
        max_iter: the same as ``maxiter`` (an alias).
        **stage_options: passed to :func:`~rayflow.hpc.stage.mpimap`.

    Raises:
        ValueError: shapes that do not fit (named in the message), or bad settings.
    """
    if max_iter is not None:
        if maxiter is not None and maxiter != max_iter:
            raise ValueError(f"cg_solve: maxiter={maxiter} and max_iter={max_iter} disagree")
        maxiter = max_iter
    if maxiter is not None and (not isinstance(maxiter, (int, np.integer)) or maxiter < 0):
        raise ValueError(f"cg_solve: maxiter must be a non-negative int, got {maxiter!r}")
    if not tol >= 0:
        raise ValueError(f"cg_solve: tol must be >= 0, got {tol!r}")
    if checkpoint_every < 0:
        raise ValueError(f"cg_solve: checkpoint_every must be >= 0, got {checkpoint_every}")
    if ranks is not None and (not isinstance(ranks, (int, np.integer)) or ranks < 1):
        raise ValueError(f"cg_solve: ranks must be a positive int, got {ranks!r}")
    p = ranks or (a.num_blocks if isinstance(a, BlockDataset) else 1)
    if not isinstance(a, BlockDataset):
        a = _as_matrix(a, "A")
        if a.shape[0] != a.shape[1]:
            raise ValueError(f"cg_solve: A must be square, got shape {a.shape}")
    A = _row_blocks(a, p, "A")
    n = A.shape[0] if A.shape is not None else None
    if A.shape is not None and len(A.shape) == 2 and A.shape[0] != A.shape[1]:
        raise ValueError(f"cg_solve: A must be square, got shape {A.shape}")
    shape_a = A.shape if A.shape is not None else "unknown"
    if isinstance(b, BlockDataset):
        B = _row_blocks(b, p, "b")
        if n is not None and B.shape is not None and B.shape[0] != n:
            raise ValueError(f"cg_solve: b has shape {B.shape}; A has shape {shape_a}")
    else:
        B = BlockDataset.from_numpy(_as_vector(b, n, "b", shape_a), A.num_blocks)
    if A.num_blocks != B.num_blocks:
        raise ValueError(f"A has {A.num_blocks} row blocks, b has {B.num_blocks}")
    if A.row_sizes is not None and B.row_sizes is not None and A.row_sizes != B.row_sizes:
        raise ValueError(f"A's row blocks {A.row_sizes} differ from b's {B.row_sizes}")
    if x0 is not None:
        x0 = _as_vector(x0, n, "x0", shape_a)
    store = (CheckpointStore.remote(A.num_blocks)  # type: ignore[attr-defined]  # (added by ray.remote)
             if checkpoint_every > 0 else None)
    stage_options.setdefault("name", "cg")
    try:
        xs, infos = cast(tuple[BlockDataset, BlockDataset], mpimap(  # (two outputs)
            cg_rank, A, B, num_outputs=2,
            fn_args=(tol, maxiter, checkpoint_every, store, on_iteration, x0), **stage_options,
        ))
        info = ray.get(infos.refs[0])
    finally:
        if store is not None:
            ray.kill(store)
    hist = info["history"]
    if not info["converged"] and tol > 0:
        why = ("it broke down (p^H A p was zero or not finite: A is singular or not positive "
               "definite)" if info["breakdown"] else f"it reached maxiter={info['maxiter']}")
        warnings.warn(
            f"cg_solve did not converge: ||r|| = {hist[-1]:.3g} after {info['iterations']} "
            f"iterations > tol * ||b||; {why}", ConvergenceWarning, stacklevel=2,
        )
    return CGResult(
        x=xs.to_numpy(),
        history=hist,
        iterations=info["iterations"],
        converged=info["converged"],
        resumed_from=info["resumed_from"],
        iterations_run=info["iterations_run"],
        ms_per_iteration=1e3 * info["loop_s"] / max(info["iterations_run"], 1),
        stage=xs.stage,
        breakdown=info["breakdown"],
    )
