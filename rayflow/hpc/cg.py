"""Conjugate gradient as one MPI stage over row blocks (dense or scipy.sparse CSR).

Usage: ``res = cg_solve(A, b, ranks=2, tol=1e-10); res.x, res.history``

Rank ``r`` holds the row block ``A_r``; the vectors (``x``, ``r``, ``p``: O(n), against the
O(n²/P) of its block) are replicated on every rank. Each iteration is one collective: the
ranks combine their pieces ``A_r p`` of ``q = A p`` (an allreduce of the pieces placed at
their offsets); both dot products are then computed
locally on full vectors, identically on every rank, with no allreduce (two fewer round
trips per iteration than allgathering ``p`` and allreducing ``p.q`` and ``r.r``). The
recurrence itself is :func:`~rayflow.hpc.cg_math.conjugate_gradient`, shared with the numpy
baseline, whose arithmetic it repeats exactly except for the row-block mat-vec.

Recovery: with ``checkpoint_every=k``, every rank sends a copy of its state to a checkpoint
actor owned by the driver every ``k`` iterations. If a rank dies, :func:`mpimap` re-runs the
stage on a new gang and the ranks resume from the newest iteration that *all* ranks saved,
instead of iteration 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from rayflow.hpc.cg_math import CGState, conjugate_gradient
from rayflow.hpc.dataset import BlockDataset
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
        self.saves = 0

    def save(self, rank: int, state: CGState) -> None:
        # Copy: the arrays may be views of objects owned by the (mortal) rank actor.
        self._states.setdefault(state.iteration, {})[rank] = state.copy()
        self.saves += 1
        complete = sorted(k for k, v in self._states.items() if len(v) == self._size)
        for k in complete[:-_KEEP_CHECKPOINTS]:
            del self._states[k]

    def latest(self) -> int | None:
        """The newest iteration saved by every rank."""
        complete = [k for k, v in self._states.items() if len(v) == self._size]
        return max(complete) if complete else None

    def get(self, iteration: int, rank: int) -> CGState:
        return self._states[iteration][rank]

    def stats(self) -> dict[str, Any]:
        return {"saves": self.saves, "latest": self.latest()}


def cg_rank(
    comm,
    a_block,
    b_block: np.ndarray,
    tol: float,
    max_iter: int,
    checkpoint_every: int = 0,
    store: Any = None,
    on_iteration: Callable[[Any, int], None] | None = None,
):
    """The rank function: returns ``(x_r, info)`` (usable directly with mpimap)."""
    import time

    pieces = comm.allgather(np.asarray(b_block))
    lo = sum(len(piece) for piece in pieces[:comm.rank])
    hi = lo + len(pieces[comm.rank])
    b = np.concatenate(pieces)  # replicated, as x, r and p will be

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
        matvec, np.dot, b, tol=tol, max_iter=max_iter, state=state,
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
    }
    return x[lo:hi].copy(), info


@dataclass
class CGResult:
    """The solution and how it was reached.

    Attributes:
        x: the solution vector.
        history: residual norms ``||b - A x_k||`` (recurrence), k = 0..iterations.
        iterations: iterations in total.
        converged: whether ``history[-1] <= tol * ||b||``.
        resumed_from: the checkpoint iteration the last attempt started from (0 = none).
        iterations_run: iterations computed by the last attempt.
        ms_per_iteration: loop time per iteration of the last attempt (rank 0).
        stage: the stage's :class:`~rayflow.hpc.stage.StageInfo`.
    """

    x: np.ndarray
    history: list[float]
    iterations: int
    converged: bool
    resumed_from: int = 0
    iterations_run: int = 0
    ms_per_iteration: float = 0.0
    stage: StageInfo | None = None


def _row_blocks(x: Any, p: int, what: str) -> BlockDataset:
    if isinstance(x, BlockDataset):
        if x.grid[1] != 1:
            raise ValueError(f"{what} must be split in row blocks (a (p, 1) grid), got {x.grid}")
        return x
    return BlockDataset.from_numpy(x, (p, 1) if getattr(x, "ndim", 2) == 2 else p)


def cg_solve(
    a: Any,
    b: Any,
    ranks: int | None = None,
    tol: float = 1e-8,
    max_iter: int | None = None,
    checkpoint_every: int = 0,
    on_iteration: Callable[[Any, int], None] | None = None,
    **stage_options: Any,
) -> CGResult:
    """Solve ``a x = b`` for SPD ``a`` by distributed conjugate gradients.

    Args:
        a: numpy array, scipy.sparse matrix, or a row-block ``BlockDataset``.
        b: numpy vector or a ``BlockDataset`` split like ``a``'s rows.
        ranks: number of ranks (default: ``a``'s block count, else 1).
        tol: relative residual tolerance; 0 runs exactly ``max_iter`` iterations.
        max_iter: iteration limit (default: the matrix size).
        checkpoint_every: checkpoint interval in iterations (0: restart from 0 on failure).
        on_iteration: ``fn(comm, k)`` called on every rank after iteration ``k``.
        **stage_options: passed to :func:`~rayflow.hpc.stage.mpimap`.
    """
    p = ranks or (a.num_blocks if isinstance(a, BlockDataset) else 1)
    A = _row_blocks(a, p, "A")
    B = _row_blocks(b, p, "b")
    if A.num_blocks != B.num_blocks:
        raise ValueError(f"A has {A.num_blocks} row blocks, b has {B.num_blocks}")
    if A.row_sizes is not None and B.row_sizes is not None and A.row_sizes != B.row_sizes:
        raise ValueError(f"A's row blocks {A.row_sizes} differ from b's {B.row_sizes}")
    n = A.shape[0] if A.shape is not None else None
    if max_iter is None:
        max_iter = n if n is not None else 1000
    store = CheckpointStore.remote(A.num_blocks) if checkpoint_every > 0 else None
    stage_options.setdefault("name", "cg")
    try:
        xs, infos = mpimap(
            cg_rank, A, B, num_outputs=2,
            fn_args=(tol, max_iter, checkpoint_every, store, on_iteration), **stage_options,
        )
        info = ray.get(infos.refs[0])
    finally:
        if store is not None:
            ray.kill(store)
    hist = info["history"]
    bnorm = float(np.linalg.norm(b.to_numpy() if isinstance(b, BlockDataset) else b))
    return CGResult(
        x=xs.to_numpy(),
        history=hist,
        iterations=info["iterations"],
        converged=hist[-1] <= tol * (bnorm if bnorm > 0 else 1.0),
        resumed_from=info["resumed_from"],
        iterations_run=info["iterations_run"],
        ms_per_iteration=1e3 * info["loop_s"] / max(info["iterations_run"], 1),
        stage=xs.stage,
    )
