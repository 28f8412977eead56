"""W6: conjugate gradient per iteration: rayflow (Ray-native and gloo) vs broadcast vs numpy.

Usage: ``python benchmarks/bench_cg.py [--quick] [--sizes 1024,4096,8192] [--reps 3]``

A dense SPD matrix (symmetric random plus a diagonal shift) is distributed in row blocks
before timing; each solver runs exactly ``--iters`` iterations (tol 0) so the per-iteration
time is comparable. 1 BLAS thread per rank/worker; numpy CG (the same recurrence,
:mod:`rayflow.hpc.algorithms.cg_math`) runs in this process with 1 thread. Also measures the collective
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
from report.published import W6_CG as PUBLISHED  # noqa: E402


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
    """Every solver once per round, rounds back to back, medians over the rounds.

    The memory bandwidth of this VM drifts by 20-30% over minutes and the mat-vec is bound by
    it, so the solvers are interleaved rather than timed one after the other.
    """
    import ray
    from threadpoolctl import threadpool_limits

    from rayflow._raycontext import ensure_ray
    from rayflow.hpc import BlockDataset, Gang, broadcast_cg, cg_solve, mpimap
    from rayflow.hpc.algorithms.cg_math import conjugate_gradient

    ensure_ray(None, num_cpus=8)
    rows, lat = [], []
    gangs = {b: Gang(ranks, backend=b, rank_num_cpus=1, blas_threads=1, gang_timeout_s=120).start()
             for b in backends}
    try:
        for backend, g in gangs.items():
            ds = BlockDataset.from_numpy(np.zeros(ranks), ranks)
            l_ms = mpimap(_collective_latency, ds, fn_args=(50,), gang=g).blocks()[0]
            lat.append({"backend": backend, "ranks": ranks, "allreduce_scalar_ms": l_ms[0],
                        "allreduce_8MiB_ms": l_ms[1]})
        for n in sizes:
            a, b = _spd(n, seed=n)
            A = BlockDataset.from_numpy(a, (ranks, 1))
            B = BlockDataset.from_numpy(b, ranks)
            t_np, t_np_all, t_bc, t_mpi = [], [], [], []
            t_rf: dict[str, list[float]] = {bk: [] for bk in backends}
            last = {}
            for _ in range(reps):
                with threadpool_limits(1, user_api="blas"):
                    t0 = time.perf_counter()
                    x_np, _, st = conjugate_gradient(lambda v, a=a: a @ v, np.dot, b, tol=0.0,
                                                     max_iter=iters)
                    t_np.append((time.perf_counter() - t0) / st.iteration * 1e3)
                # numpy with every core of the machine (its BLAS threads unlimited): what a
                # single process gets from this machine, the honest bound for the gang
                t0 = time.perf_counter()
                _, _, st = conjugate_gradient(lambda v, a=a: a @ v, np.dot, b, tol=0.0,
                                              max_iter=iters)
                t_np_all.append((time.perf_counter() - t0) / st.iteration * 1e3)
                t_bc.append(broadcast_cg(A, b, workers=ranks, tol=0.0,
                                         max_iter=iters).ms_per_iteration)
                peer = peers.mpi("cg", ranks, n, 1, iters)
                if peer:
                    t_mpi.append(peer["ms_per_it"])
                for backend, g in gangs.items():
                    last[backend] = cg_solve(A, B, tol=0.0, max_iter=iters, gang=g)
                    t_rf[backend].append(last[backend].ms_per_iteration)
            m_np, m_np_all, m_bc = median(t_np), median(t_np_all), median(t_bc)
            m_mpi = median(t_mpi) if t_mpi else None
            # Spark's broadcast CG (pyspark peer): one Spark job per iteration, hundreds of
            # ms each, so a few iterations suffice; run once, not per round
            spark = peers.spark("cg", ranks, n, 1, min(iters, 20))
            m_spark = spark["ms_per_it"] if spark else None
            print(f"n={n}: numpy {m_np:.2f} ms/it, broadcast {m_bc:.2f} ms/it, "
                  f"mpi4py {m_mpi} ms/it, spark {m_spark} ms/it", flush=True)
            for backend in backends:
                t, res = median(t_rf[backend]), last[backend]
                diff = float(np.abs(res.x - x_np).max() / np.abs(x_np).max())
                rows.append({
                    "n": n, "ranks": ranks, "backend": backend, "iterations": iters,
                    "rounds": reps, "rayflow_ms_per_it": t, "broadcast_ms_per_it": m_bc,
                    "numpy_ms_per_it": m_np, "numpy_all_cores_ms_per_it": m_np_all,
                    "vs_numpy_all_cores_ratio": ratio(t, m_np_all),
                    "runs_ms_per_it": t_rf[backend],
                    "mpi4py_runs_ms_per_it": t_mpi,
                    "speedup_vs_broadcast": ratio(m_bc, t),
                    "improvement_vs_broadcast_pct": round(100 * (m_bc - t) / m_bc, 1),
                    "vs_numpy_ratio": ratio(t, m_np), "rel_diff_vs_numpy_x": diff,
                    "mpi4py_ms_per_it": m_mpi,
                    "spark_ms_per_it": m_spark,
                    "speedup_vs_spark": ratio(m_spark, t) if m_spark else None,
                    "vs_mpi4py_ratio": ratio(t, m_mpi) if m_mpi else None,
                    "max_rank_rss_mib": max(res.stage.rank_maxrss_bytes) / 2**20,
                    "matrix_mib": n * n * 8 / 2**20,
                })
                print(f"n={n} {backend}: {t:.2f} ms/it", flush=True)
            del A, B
    finally:
        for g in gangs.values():
            g.shutdown()
    ray.shutdown()
    return {"rows": rows, "collective_latency": lat, "published": PUBLISHED}


@click.command()
@click.option("--quick", is_flag=True, help="small sizes: a smoke run (writes nothing)")
@click.option("--ranks", default=2, show_default=True)
@click.option("--iters", default=100, show_default=True)
@click.option("--reps", default=5, show_default=True, help="rounds")
@click.option("--backend", "backends", multiple=True, help="ray and/or gloo (default: both)")
@click.option("--sizes", default=None, help="matrix sizes, comma-separated (default: 4096,8192; "
              "with --quick 1024,2048)")
def main(quick: bool, ranks: int, iters: int, reps: int, backends: tuple[str, ...],
         sizes: str | None) -> None:
    """Run the W6 benchmark and write benchmarks/results/cg.json."""
    from rayflow.hpc.backends.gloo_backend import gloo_available

    if sizes is not None:
        try:
            chosen_sizes = [int(x) for x in sizes.split(",") if x.strip()]
        except ValueError:
            raise click.BadParameter(f"sizes must be integers separated by commas, got "
                                     f"{sizes!r}", param_hint="--sizes") from None
        if not chosen_sizes or min(chosen_sizes) < ranks:
            raise click.BadParameter(f"every size must be at least --ranks ({ranks}), got "
                                     f"{sizes!r}", param_hint="--sizes")
    else:
        chosen_sizes = [1024, 2048] if quick else [4096, 8192]
    chosen = list(backends) or (["ray", "gloo"] if gloo_available() else ["ray"])
    res = run(chosen_sizes, ranks, iters, reps, chosen)
    print_table(f"CG ms/iteration, {ranks} ranks, {iters} iterations, 1 BLAS thread per rank",
                ["n", "backend", "rayflow", "broadcast", "numpy", "mpi4py", "spark", "x bcast",
                 "x spark", "improv %", "t/numpy", "t/mpi4py", "rel diff"],
                [[r["n"], r["backend"], r["rayflow_ms_per_it"], r["broadcast_ms_per_it"],
                  r["numpy_ms_per_it"], r["mpi4py_ms_per_it"], r["spark_ms_per_it"],
                  r["speedup_vs_broadcast"], r["speedup_vs_spark"],
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
