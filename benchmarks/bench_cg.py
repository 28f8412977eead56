"""W6: conjugate gradient per iteration: rayflow (Ray-native and gloo) vs broadcast vs numpy.

Usage: ``python benchmarks/bench_cg.py [--quick]``

A dense SPD matrix (symmetric random plus a diagonal shift) is distributed in row blocks
before timing; each solver runs exactly ``--iters`` iterations (tol 0) so the per-iteration
time is comparable. 1 BLAS thread per rank/worker; numpy CG (the same recurrence,
:mod:`rayflow.hpc.cg_math`) runs in this process with 1 thread. Also measures the collective
latencies behind the gap between the two backends.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import click  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402
from _common import machine_info, print_table, ratio, write_result  # noqa: E402

PUBLISHED = ("Blaze CG 51-94% faster per iteration than the Spark broadcast baseline "
             "(32,000^2, varying cores); 58-92% at 32 cores, varying size")


def _spd(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1.0, 1.0, (n, n))
    a = (a + a.T) / 2
    a[np.diag_indices(n)] += 3.0 * np.sqrt(n)  # spectrum of the symmetric part is ~ +-1.2 sqrt(n)
    return a, rng.standard_normal(n)


def _collective_latency(comm, block, reps):
    out = []
    for size in (1, 1 << 20):  # a scalar and 8 MiB
        v = np.ones(size)
        comm.allreduce(v)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            comm.allreduce(v)
        out.append((time.perf_counter() - t0) / reps * 1e3)
    return np.array(out)


def run(sizes: list[int], ranks: int, iters: int, reps: int, backends: list[str]) -> dict:
    import ray
    from threadpoolctl import threadpool_limits

    from rayflow._raycontext import ensure_ray
    from rayflow.hpc import BlockDataset, Gang, broadcast_cg, cg_solve, mpimap
    from rayflow.hpc.cg_math import conjugate_gradient

    ensure_ray(None, num_cpus=8)
    rows, lat = [], []
    problems = {n: _spd(n, seed=n) for n in sizes}
    base = {}
    for n, (a, b) in problems.items():
        with threadpool_limits(1, user_api="blas"):
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                x_np, _, st = conjugate_gradient(lambda v, a=a: a @ v, np.dot, b, tol=0.0, max_iter=iters)
                ts.append((time.perf_counter() - t0) / st.iteration * 1e3)
        A = BlockDataset.from_numpy(a, (ranks, 1))
        B = BlockDataset.from_numpy(b, ranks)
        bc = [broadcast_cg(A, b, workers=ranks, tol=0.0, max_iter=iters).ms_per_iteration
              for _ in range(reps)]
        peer = peers.mpi("cg", ranks, n, reps, iters)
        t_mpi = peer["ms_per_it"] if peer else None
        base[n] = (A, B, x_np, median(ts), median(bc), t_mpi)
        print(f"n={n}: numpy {median(ts):.2f} ms/it, broadcast {median(bc):.2f} ms/it, "
              f"mpi4py {t_mpi} ms/it", flush=True)
    for backend in backends:
        with Gang(ranks, backend=backend, rank_num_cpus=1, blas_threads=1,
                  gang_timeout_s=120) as g:
            ds = BlockDataset.from_numpy(np.zeros(ranks), ranks)
            l_ms = mpimap(_collective_latency, ds, fn_args=(50,), gang=g).blocks()[0]
            lat.append({"backend": backend, "ranks": ranks, "allreduce_scalar_ms": l_ms[0],
                        "allreduce_8MiB_ms": l_ms[1]})
            for n in sizes:
                A, B, x_np, t_np, t_bc, t_mpi = base[n]
                runs = [cg_solve(A, B, tol=0.0, max_iter=iters, gang=g) for _ in range(reps)]
                t = median(r.ms_per_iteration for r in runs)
                diff = float(np.abs(runs[0].x - x_np).max() / np.abs(x_np).max())
                rows.append({
                    "n": n, "ranks": ranks, "backend": backend, "iterations": iters,
                    "rayflow_ms_per_it": t, "broadcast_ms_per_it": t_bc, "numpy_ms_per_it": t_np,
                    "speedup_vs_broadcast": ratio(t_bc, t),
                    "improvement_vs_broadcast_pct": round(100 * (t_bc - t) / t_bc, 1),
                    "vs_numpy_ratio": ratio(t, t_np), "rel_diff_vs_numpy_x": diff,
                    "mpi4py_ms_per_it": t_mpi,
                    "vs_mpi4py_ratio": ratio(t, t_mpi) if t_mpi else None,
                    "max_rank_rss_mib": max(runs[-1].stage.rank_maxrss_bytes) / 2**20,
                    "matrix_mib": n * n * 8 / 2**20,
                })
                print(f"n={n} {backend}: {t:.2f} ms/it", flush=True)
    ray.shutdown()
    return {"rows": rows, "collective_latency": lat, "published": PUBLISHED}


@click.command()
@click.option("--quick", is_flag=True, help="small sizes: a smoke run (writes nothing)")
@click.option("--ranks", default=2, show_default=True)
@click.option("--iters", default=30, show_default=True)
@click.option("--reps", default=3, show_default=True)
@click.option("--backend", "backends", multiple=True, help="ray and/or gloo (default: both)")
def main(quick: bool, ranks: int, iters: int, reps: int, backends: tuple[str, ...]) -> None:
    """Run the W6 benchmark and write benchmarks/results/cg.json."""
    from rayflow.hpc.gloo_backend import gloo_available

    sizes = [1024, 2048] if quick else [4096, 8192]
    chosen = list(backends) or (["ray", "gloo"] if gloo_available() else ["ray"])
    res = run(sizes, ranks, iters, reps, chosen)
    print_table(f"CG ms/iteration, {ranks} ranks, {iters} iterations, 1 BLAS thread per rank",
                ["n", "backend", "rayflow", "broadcast", "numpy", "mpi4py", "x bcast", "improv %",
                 "t/numpy", "t/mpi4py", "rel diff"],
                [[r["n"], r["backend"], r["rayflow_ms_per_it"], r["broadcast_ms_per_it"],
                  r["numpy_ms_per_it"], r["mpi4py_ms_per_it"], r["speedup_vs_broadcast"],
                  r["improvement_vs_broadcast_pct"], r["vs_numpy_ratio"], r["vs_mpi4py_ratio"],
                  r["rel_diff_vs_numpy_x"]]
                 for r in res["rows"]])
    print_table("allreduce latency (ms)", ["backend", "ranks", "scalar", "8 MiB"],
                [[x["backend"], x["ranks"], x["allreduce_scalar_ms"], x["allreduce_8MiB_ms"]]
                 for x in res["collective_latency"]])
    print(f"\npublished: {PUBLISHED}")
    if quick:
        print(f"machine: {machine_info()}")
        return
    print(f"wrote {write_result('cg', res)}")


if __name__ == "__main__":
    main()
