"""The study's Spark baselines, rebuilt on Ray so they run in the same benchmark.

Usage: ``C = shuffle_matmul(A, B).to_numpy(); res = broadcast_cg(a, b, workers=2)``

- :func:`shuffle_matmul` follows Spark MLlib's ``BlockMatrix.multiply``: every block of A and
  B is *replicated* to each result block that needs it (the shuffle write), the pairs with the
  same inner index are *joined* and multiplied, and the partial products are *reduced by key*
  ``(i, j)``. Each phase is a set of Ray tasks, and every replica is a real copy, as a
  shuffle's are.
- :func:`broadcast_cg` is the study's CG baseline: the row blocks of A are cached in worker
  actors, the driver broadcasts the search direction every iteration, the workers return
  ``A_r p`` and the driver concatenates and computes the dot products.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from rayflow.hpc.algorithms.cg import CGResult, _row_blocks
from rayflow.hpc.algorithms.cg_math import conjugate_gradient
from rayflow.hpc.blas import limit_blas_threads
from rayflow.hpc.dataset import BlockDataset


@ray.remote
def _replicate(block: np.ndarray, copies: int, blas_threads: int | None):
    out = tuple(np.array(block, copy=True) for _ in range(copies))
    return out if copies > 1 else out[0]


@ray.remote
def _multiply(a: np.ndarray, b: np.ndarray, blas_threads: int | None) -> np.ndarray:
    limit_blas_threads(blas_threads)
    return a @ b


@ray.remote
def _sum(blas_threads: int | None, *parts: np.ndarray) -> np.ndarray:
    acc = np.array(parts[0], copy=True)
    for p in parts[1:]:
        acc += p
    return acc


def shuffle_matmul(
    a: BlockDataset | np.ndarray,
    b: BlockDataset | np.ndarray,
    grid: int = 1,
    num_cpus: float = 1.0,
    blas_threads: int | None = 1,
) -> BlockDataset:
    """``a @ b`` by replicate / join-multiply / reduce-by-key over Ray tasks (MLlib's algorithm).

    Args:
        a: ``m x k`` matrix or a dataset on a ``(p, q)`` grid.
        b: ``k x n`` matrix or a dataset on a ``(q, r)`` grid.
        grid: the grid side when numpy arrays are given.
        num_cpus: CPUs per task.
        blas_threads: BLAS threads per multiply task.
    """
    A = a if isinstance(a, BlockDataset) else BlockDataset.from_numpy(np.asarray(a), (grid, grid))
    B = b if isinstance(b, BlockDataset) else BlockDataset.from_numpy(np.asarray(b), (grid, grid))
    (p, q), (q2, r) = A.grid, B.grid
    if q != q2:
        raise ValueError(f"grids {A.grid} and {B.grid} do not multiply")
    opt = {"num_cpus": num_cpus}
    # Shuffle write: A_ik goes to every C_ij (r copies), B_kj to every C_ij (p copies).
    a_rep = {
        (i, k): _replicate.options(num_returns=r, **opt).remote(A.block(i, k), r, blas_threads)
        for i in range(p) for k in range(q)
    }
    b_rep = {
        (k, j): _replicate.options(num_returns=p, **opt).remote(B.block(k, j), p, blas_threads)
        for k in range(q) for j in range(r)
    }

    def copy_of(rep, key, n, idx):
        return rep[key][idx] if n > 1 else rep[key]

    refs = []
    for i in range(p):
        for j in range(r):
            # Join on k and multiply, then reduce by key (i, j).
            partial = [
                _multiply.options(**opt).remote(
                    copy_of(a_rep, (i, k), r, j), copy_of(b_rep, (k, j), p, i), blas_threads
                )
                for k in range(q)
            ]
            refs.append(partial[0] if q == 1 else _sum.options(**opt).remote(blas_threads, *partial))
    return BlockDataset(tuple(refs), (p, r), A.row_sizes, B.col_sizes)


@ray.remote
class _MatvecWorker:
    """Caches one row block of A (the Spark executor's cached partition)."""

    def __init__(self, block, blas_threads: int | None):
        self._limits = limit_blas_threads(blas_threads)
        self.a = block

    def matvec(self, v: np.ndarray) -> np.ndarray:
        return self.a @ v


def broadcast_cg(
    a: Any,
    b: np.ndarray,
    workers: int = 2,
    tol: float = 1e-8,
    max_iter: int | None = None,
    num_cpus: float = 1.0,
    blas_threads: int | None = 1,
) -> CGResult:
    """CG with A cached in ``workers`` actors, the vector broadcast and reduced at the driver."""
    import time

    A = _row_blocks(a, workers, "A")
    ws = [_MatvecWorker.options(num_cpus=num_cpus).remote(ref, blas_threads)  # type: ignore[attr-defined]  # (added by ray.remote)
          for ref in A.refs]
    try:
        ray.get([w.__ray_ready__.remote() for w in ws])

        def matvec(v: np.ndarray) -> np.ndarray:
            ref = ray.put(v)  # one broadcast object per iteration
            return np.concatenate(ray.get([w.matvec.remote(ref) for w in ws]))

        b = np.asarray(b)
        t0 = time.perf_counter()
        x, hist, st = conjugate_gradient(
            matvec, np.dot, b, tol=tol, max_iter=max_iter or b.shape[0]
        )
        loop_s = time.perf_counter() - t0
    finally:
        for w in ws:
            ray.kill(w)
    bnorm = float(np.linalg.norm(b))
    return CGResult(
        x=x, history=hist, iterations=st.iteration,
        converged=hist[-1] <= tol * (bnorm if bnorm > 0 else 1.0),
        iterations_run=st.iteration,
        ms_per_iteration=1e3 * loop_s / max(st.iteration, 1),
    )
