"""mpi4py peers for W5 and W6, run under ``mpiexec`` by :mod:`peers` (not by hand, usually).

    mpiexec -n 4 python benchmarks/peer_mpi.py cannon 2048 3
    mpiexec -n 2 python benchmarks/peer_mpi.py cg 4096 3 30

Same data as the rayflow benchmarks (same seeds), one BLAS thread per rank, matrices already
distributed before timing. Rank 0 prints one JSON line: median seconds (Cannon) or median
ms per iteration (CG), and the error against numpy.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from statistics import median

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))


def cannon(n: int, reps: int) -> dict | None:
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    p = int(round(size ** 0.5))
    assert p * p == size and n % p == 0, "a square number of ranks dividing n"
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    cart = comm.Create_cart([p, p], periods=[True, True])
    i, j = cart.Get_coords(rank)
    s = n // p
    a0 = np.ascontiguousarray(a[i * s:(i + 1) * s, j * s:(j + 1) * s])
    b0 = np.ascontiguousarray(b[i * s:(i + 1) * s, j * s:(j + 1) * s])
    ref = a @ b if rank == 0 else None
    a = b = None  # a rank keeps its blocks only

    def run() -> np.ndarray:
        ab, bb = a0.copy(), b0.copy()
        c = np.zeros((s, s))
        # skew: row i of A left by i, column j of B up by j
        src, dst = cart.Shift(1, -i)
        cart.Sendrecv_replace(ab, dest=dst, source=src)
        src, dst = cart.Shift(0, -j)
        cart.Sendrecv_replace(bb, dest=dst, source=src)
        left_src, left_dst = cart.Shift(1, -1)
        up_src, up_dst = cart.Shift(0, -1)
        for k in range(p):
            c += ab @ bb
            if k < p - 1:
                cart.Sendrecv_replace(ab, dest=left_dst, source=left_src)
                cart.Sendrecv_replace(bb, dest=up_dst, source=up_src)
        return c

    times = []
    with threadpool_limits(1, user_api="blas"):
        run()  # warm-up
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            c = run()
            comm.Barrier()
            times.append(time.perf_counter() - t0)
    blocks = comm.gather(((i, j), c), root=0)
    if rank:
        return None
    full = np.zeros((n, n))
    for (bi, bj), blk in blocks:
        full[bi * s:(bi + 1) * s, bj * s:(bj + 1) * s] = blk
    err = float(np.abs(full - ref).max() / np.abs(ref).max())
    return {"peer": "mpi4py", "n": n, "ranks": size, "median_s": median(times),
            "runs_s": times, "rel_error_f64": err, "mpi": MPI.Get_library_version().split("\n")[0]}


def cg(n: int, reps: int, iters: int) -> dict | None:
    from bench_cg import _spd

    from rayflow.hpc.algorithms.cg_math import conjugate_gradient

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    a, b = _spd(n, seed=n)
    rows = np.array_split(np.arange(n), size)[rank]
    a_r = np.ascontiguousarray(a[rows])
    b_r = b[rows].copy()
    counts = [len(r) for r in np.array_split(np.arange(n), size)]
    x_ref = None
    if rank == 0:
        with threadpool_limits(1, user_api="blas"):
            x_ref = conjugate_gradient(lambda v: a @ v, np.dot, b, tol=0.0, max_iter=iters)[0]
    a = None  # a rank keeps its row block only
    full = np.empty(n)

    def matvec(v: np.ndarray) -> np.ndarray:
        comm.Allgatherv(v, [full, counts])
        return a_r @ full

    def dot(u: np.ndarray, v: np.ndarray) -> float:
        return comm.allreduce(float(np.dot(u, v)))

    per_it = []
    with threadpool_limits(1, user_api="blas"):
        conjugate_gradient(matvec, dot, b_r, tol=0.0, max_iter=3)  # warm-up
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            x_r, _, st = conjugate_gradient(matvec, dot, b_r, tol=0.0, max_iter=iters)
            per_it.append((time.perf_counter() - t0) / st.iteration * 1e3)
    xs = comm.gather(x_r, root=0)
    if rank:
        return None
    x = np.concatenate(xs)
    diff = float(np.abs(x - x_ref).max() / np.abs(x_ref).max())
    return {"peer": "mpi4py", "n": n, "ranks": size, "ms_per_it": median(per_it),
            "runs_ms_per_it": per_it, "rel_diff_vs_numpy_x": diff}


if __name__ == "__main__":
    kind, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    out = cannon(n, reps) if kind == "cannon" else cg(n, reps, int(sys.argv[4]))
    if out is not None:
        print("PEER-RESULT " + json.dumps(out), flush=True)
