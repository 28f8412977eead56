"""W5: Cannon's multiplication vs the MLlib-style shuffle multiply vs numpy, on this machine.

Usage: ``python benchmarks/bench_cannon.py [--quick]``

Matrices are distributed into the object store before timing (as in the study). Every rank
and task runs one BLAS thread (threadpoolctl), and numpy's ``A @ B`` in this process with one
thread is the BLAS limit. Times are medians of ``--reps`` runs on gangs started beforehand;
the gang start is reported separately. Peers, when installed (``pip install -e ".[peers]"``):
mpi4py Cannon under mpiexec (MPICH) and Dask's blocked matmul, on the same matrices, same
grid, one BLAS thread per rank (:mod:`peers`), and Spark MLlib's ``BlockMatrix.multiply``
(pyspark on ``local[p*p]``, in its own process; one timed run after a warm-up, as it is slow)
on the largest grid.
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import click  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402
from _common import machine_info, print_table, ratio, timed, write_result  # noqa: E402
from report.published import W5_CANNON as PUBLISHED  # noqa: E402


def _peers() -> dict[str, bool]:
    import importlib.util

    out = {m: importlib.util.find_spec(m) is not None for m in ("mpi4py", "dask")}
    out["pyspark"] = peers.spark_installed()
    return out


def _cannon_with_fault(comm, a, b):
    """Cannon whose rank 1 is killed (ray.kill) after its first GEMM on the first attempt."""
    import ray

    from rayflow.hpc.algorithms.cannon import cannon_rank

    if comm.attempt == 0 and comm.rank == 1:
        _ = a @ b
        ray.kill(ray.get_runtime_context().current_actor)
        time.sleep(60)
    return cannon_rank(comm, a, b)


def measure_recovery(n: int, p: int, reps: int) -> dict:
    """One rank killed after its first GEMM vs the failure-free run, medians of ``reps``
    pairs. The target's pair starts a gang for every run (warm gangs off: the start is most
    of either time at small n); a second pair runs with warm gangs, as a stage without
    ``gang=`` does by default: the failure-free run then reuses an idle gang, and the
    recovery pays for starting the replacement rank."""
    from rayflow.config import load_config
    from rayflow.hpc.pool import warm_gangs

    warm_gangs.clear()
    cold = _recovery_pairs(n, p, reps, load_config(hpc={"warm_gang_idle_s": 0}).hpc)
    warm = _recovery_pairs(n, p, reps, load_config().hpc)
    warm_gangs.clear()
    out = {**cold, "warm": {k: warm[k] for k in ("failure_free_s", "with_killed_rank_s",
                                                  "ratio", "ranks_replaced")}}
    print(f"recovery, warm gangs: {warm['with_killed_rank_s']:.2f}s vs "
          f"{warm['failure_free_s']:.2f}s failure-free ({warm['ratio']}x)", flush=True)
    return out


def _recovery_pairs(n: int, p: int, reps: int, hpc: Any) -> dict:
    """``reps`` pairs of runs with ``hpc`` (the stages' options: warm gangs or not)."""
    from rayflow.hpc import BlockDataset, cannon_matmul, mpimap
    from rayflow.hpc.algorithms.cannon_index import skew_a_source, skew_b_source

    a = np.random.default_rng(1).standard_normal((n, n))
    A = BlockDataset.from_numpy(a, (p, p))
    a_s = A.take(lambda i, j: skew_a_source(i, j, p))
    b_s = A.take(lambda i, j: skew_b_source(i, j, p))
    t_ok, t_rec, rec_err, replaced, attempts = [], [], 0.0, [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ok = cannon_matmul(A, A, options=hpc)
        t_ok.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rec = mpimap(_cannon_with_fault, a_s, b_s, rank_num_cpus=1, options=hpc)
        t_rec.append(time.perf_counter() - t0)
        rec_err = max(rec_err, float(np.abs(rec.to_numpy() - ok.to_numpy()).max()))
        replaced.append(rec.stage.ranks_replaced)
        attempts.append(rec.stage.attempts)
    out = {"n": n, "ranks": p * p, "failure_free_s": median(t_ok),
           "with_killed_rank_s": median(t_rec), "ratio": ratio(median(t_rec), median(t_ok)),
           "runs_failure_free_s": t_ok, "runs_with_killed_rank_s": t_rec,
           "attempts": max(attempts), "ranks_replaced": max(replaced), "max_abs_diff": rec_err,
           "machine": machine_info(),
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "note": ("both runs start their own gang (warm gangs off)"
                    if hpc.warm_gang_idle_s == 0 else "warm gangs on")
                   + "; only the killed rank is replaced"}
    print(f"recovery: {out['with_killed_rank_s']:.2f}s vs {out['failure_free_s']:.2f}s "
          f"failure-free ({out['ratio']}x), ranks replaced {replaced}", flush=True)
    return out


def _job_memory(inputs: tuple, p: int, backend: str) -> dict:
    """One Cannon run on a fresh gang, sampled: the stage's processes (USS above the idle Ray,
    so the rank processes count whole) plus the object store's growth, beside the inputs
    already in the store; over the bytes of A, B and C."""
    from rayflow.hpc import Gang, cannon_matmul
    from rayflow.memprobe import MemoryProbe

    A, B = inputs
    n = A.shape[0]
    with MemoryProbe(interval_s=0.1) as probe:
        with Gang(p * p, backend=backend, rank_num_cpus=1, blas_threads=1,
                  gang_timeout_s=120) as g:
            c = cannon_matmul(A, B, gang=g)
            del c
    mem = probe.report()
    in_bytes, data_bytes = 2 * n * n * 8, 3 * n * n * 8
    extra = (mem["uss_peak_above_idle_mb"] + mem["object_store_peak_mb"]) * 1e6
    return {"n": n, "ranks": p * p, "backend": backend,
            "uss_above_idle_mb": mem["uss_peak_above_idle_mb"],
            "store_growth_mb": mem["object_store_peak_mb"],
            "data_mb": round(data_bytes / 1e6, 1),
            "peak_over_data": ratio(in_bytes + extra, data_bytes)}


def run(sizes: list[int], grids: list[int], reps: int, backends: list[str],
        memory_sizes: tuple[int, ...] = ()) -> dict:
    import ray
    from threadpoolctl import threadpool_info, threadpool_limits

    from rayflow._raycontext import ensure_ray
    from rayflow.hpc import BlockDataset, Gang, cannon_matmul, shuffle_matmul

    # 8 logical CPUs: one gang of at most 4 ranks alive at a time, and at most 4 concurrent
    # shuffle tasks, so both get the same parallelism.
    ensure_ray(None, num_cpus=8)
    blas = [i.get("architecture") for i in threadpool_info() if i.get("user_api") == "blas"]
    rows, raw, memory = [], [], []
    gangs: dict = {}
    mats = {}
    for n in sizes:
        rng = np.random.default_rng(n)
        a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
        with threadpool_limits(1, user_api="blas"):
            t_np, _ = timed(lambda a=a, b=b: a @ b, reps)
            ref = a @ b
        # numpy with every core of the machine (BLAS threads unlimited): the honest bound
        t_np_all, _ = timed(lambda a=a, b=b: a @ b, reps)
        mats[n] = (a, b, ref, t_np, t_np_all)
    try:
        for p in grids:
            data = {}
            for n in sizes:
                a, b, ref, t_np, t_np_all = mats[n]
                A, B = BlockDataset.from_numpy(a, (p, p)), BlockDataset.from_numpy(b, (p, p))
                ray.wait(list(A.refs + B.refs), num_returns=2 * p * p)

                def shuffle(A=A, B=B):
                    out = shuffle_matmul(A, B, blas_threads=1, num_cpus=1)
                    ray.wait(list(out.refs), num_returns=len(out.refs), fetch_local=False)

                peer_mpi = peers.mpi("cannon", p * p, n, reps)
                peer_dask = peers.dask_matmul(a, b, p, reps)
                peer_spark = peers.spark("cannon", p * p, n, 1) if p == max(grids) else None
                data[n] = (A, B, timed(shuffle, reps)[0], peer_mpi, peer_dask, peer_spark)
            for backend in backends:
                t0 = time.perf_counter()
                g = gangs[backend] = Gang(p * p, backend=backend, rank_num_cpus=1,
                                          blas_threads=1, gang_timeout_s=120).start()
                raw.append({"gang_start_s": time.perf_counter() - t0, "backend": backend,
                            "ranks": p * p})
                for n in sizes:
                    a, b, ref, t_np, t_np_all = mats[n]
                    A, B, t_sh, peer_mpi, peer_dask, peer_spark = data[n]
                    t_mpi = peer_mpi["median_s"] if peer_mpi else None
                    t_dask = peer_dask["median_s"] if peer_dask else None
                    t_spark = peer_spark["median_s"] if peer_spark else None
                    flops, data_bytes = 2.0 * n**3, 3 * n * n * 8
                    last = {}

                    def cannon(A=A, B=B, g=g, last=last):
                        last["c"] = cannon_matmul(A, B, gang=g)

                    t_c, all_t = timed(cannon, reps)
                    c = last["c"]
                    err = float(np.abs(c.to_numpy() - ref).max() / np.abs(ref).max())
                    rss = c.stage.rank_maxrss_bytes
                    rows.append({
                        "n": n, "ranks": p * p, "backend": backend,
                        "cannon_s": t_c, "cannon_gflops": flops / t_c / 1e9,
                        "rank_compute_s": max(c.stage.rank_wall_s),
                        "shuffle_s": t_sh, "shuffle_gflops": flops / t_sh / 1e9,
                        "numpy_1thread_s": t_np, "numpy_gflops": flops / t_np / 1e9,
                        "speedup_vs_shuffle": ratio(t_sh, t_c),
                        "improvement_vs_shuffle_pct": round(100 * (t_sh - t_c) / t_sh, 1),
                        "vs_numpy_time_ratio": ratio(t_c, t_np),
                        "numpy_all_cores_s": t_np_all,
                        "numpy_all_cores_gflops": flops / t_np_all / 1e9,
                        "vs_numpy_all_cores_time_ratio": ratio(t_c, t_np_all),
                        "mpi4py_s": t_mpi, "dask_s": t_dask, "spark_s": t_spark,
                        "spark_gflops": flops / t_spark / 1e9 if t_spark else None,
                        "speedup_vs_spark": ratio(t_spark, t_c) if t_spark else None,
                        "spark_blas": peer_spark and peer_spark.get("jvm_blas"),
                        "vs_mpi4py_time_ratio": ratio(t_c, t_mpi) if t_mpi else None,
                        "vs_dask_time_ratio": ratio(t_c, t_dask) if t_dask else None,
                        "peer_errors": {"mpi4py": peer_mpi and peer_mpi["rel_error_f64"],
                                        "dask": peer_dask and peer_dask["rel_error_f64"],
                                        "spark": peer_spark and peer_spark["rel_error_f64"]},
                        "rel_error_f64": err,
                        "max_rank_rss_mib": max(rss) / 2**20,
                        "sum_rank_rss_over_data": ratio(sum(rss), data_bytes),
                        "runs_s": all_t,
                    })
                    print(f"n={n} ranks={p * p} {backend}: cannon {t_c:.3f}s "
                          f"shuffle {t_sh:.3f}s numpy {t_np:.3f}s mpi4py {t_mpi} dask {t_dask} "
                          f"spark {t_spark} "
                          f"err {err:.1e}", flush=True)
                g.shutdown()
                del gangs[backend]
                if p == max(grids):  # untimed: sampling every process's smaps costs CPU
                    memory.append(_job_memory(data[max(sizes)][:2], p, backend))
                    print(f"memory: {memory[-1]}", flush=True)
        # Memory at a larger n as well, where a rank process's own ~60 MB (Python, Ray, numpy;
        # ~190 MB with torch for gloo) weighs less against its blocks.
        for n_mem in memory_sizes:
            p = max(grids)
            rng = np.random.default_rng(n_mem)
            A = BlockDataset.from_numpy(rng.standard_normal((n_mem, n_mem)), (p, p))
            B = BlockDataset.from_numpy(rng.standard_normal((n_mem, n_mem)), (p, p))
            ray.wait(list(A.refs + B.refs), num_returns=2 * p * p)
            for backend in backends:
                memory.append(_job_memory((A, B), p, backend))
                print(f"memory: {memory[-1]}", flush=True)
            del A, B
        recovery = measure_recovery(sizes[0], max(grids), reps)
    finally:
        for g in gangs.values():
            g.shutdown()
    return {"rows": rows, "gang_starts": raw, "recovery": recovery, "blas_kernel": blas,
            "memory": memory,
            "peers": _peers(), "published": PUBLISHED}


@click.command()
@click.option("--quick", is_flag=True, help="small sizes, 3 reps: a smoke run")
@click.option("--reps", default=3, show_default=True)
@click.option("--backend", "backends", multiple=True, help="ray and/or gloo (default: both)")
@click.option("--recovery-only", is_flag=True,
              help="re-measure only the stage recovery and update it in cannon.json")
@click.option("--memory-n", "memory_sizes", multiple=True, type=int, default=(8192,),
              show_default=True, help="extra matrix sizes for the (untimed) job memory runs")
def main(quick: bool, reps: int, backends: tuple[str, ...], memory_sizes: tuple[int, ...],
         recovery_only: bool) -> None:
    """Run the W5 benchmark and write benchmarks/results/cannon.json."""
    from rayflow.hpc.backends.gloo_backend import gloo_available

    if recovery_only:
        import json

        from _common import RESULTS_DIR

        from rayflow._raycontext import ensure_ray

        ensure_ray(None, num_cpus=8)
        path = RESULTS_DIR / "cannon.json"
        doc = json.loads(path.read_text())
        doc["recovery"] = measure_recovery(1024, 2, reps)
        path.write_text(json.dumps(doc, indent=2))
        print(f"updated the recovery of {path}")
        return

    sizes = [256, 512] if quick else [1024, 2048, 4096]
    chosen = list(backends) or (["ray", "gloo"] if gloo_available() else ["ray"])
    res = run(sizes, [1, 2], reps, chosen, () if quick else memory_sizes)
    header = ["n", "ranks", "backend", "cannon GF/s", "shuffle GF/s", "numpy GF/s",
              "x shuffle", "x spark", "improv %", "t/numpy", "t/mpi4py", "t/dask", "rel err",
              "RSS/data"]
    print_table("Cannon vs shuffle (MLlib algorithm) vs numpy, 1 BLAS thread per rank", header, [
        [r["n"], r["ranks"], r["backend"], r["cannon_gflops"], r["shuffle_gflops"],
         r["numpy_gflops"], r["speedup_vs_shuffle"], r.get("speedup_vs_spark"),
         r["improvement_vs_shuffle_pct"],
         r["vs_numpy_time_ratio"], r["vs_mpi4py_time_ratio"], r["vs_dask_time_ratio"],
         r["rel_error_f64"], r["sum_rank_rss_over_data"]]
        for r in res["rows"]
    ])
    print(f"\npublished: {PUBLISHED}")
    print(f"BLAS kernel: {res['blas_kernel']}; peers installed: {res['peers']}")
    if quick:  # a smoke run must not overwrite the recorded figures
        print(f"machine: {machine_info()}")
        return
    print(f"wrote {write_result('cannon', res)}")


if __name__ == "__main__":
    main()
