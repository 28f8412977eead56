"""Scaling on a many-core machine: what a 2-core laptop cannot show.

    python benchmarks/bench_scaling.py [--quick] [--sections collectives,cannon,cg,nexmark,sleep]

Five sections, each run and written on its own (a section that fails is recorded with its
error and the next one runs), to ``benchmarks/results/scaling.json``:

- **collectives**: the microbenchmarks of ``bench_collectives.py`` on 2, 4 and 8 ranks, rayflow
  beside mpi4py (MPICH) under ``mpiexec`` in the same run;
- **cannon**: Cannon's multiplication (n = 4096) on 4 and 16 ranks, and n = 8192 on 16 ranks,
  beside mpi4py's Cannon on the same grid, numpy on one thread and numpy with every core; a
  stage that loses a rank, recovered, on 16 ranks;
- **cg**: conjugate gradient ms/iteration, n = 1024, 4096 and 8192, on 2, 4, 8 and 16 ranks,
  beside mpi4py's CG on the same ranks and numpy with one thread and every core;
- **nexmark**: events/s and events/s per core of several queries at parallelism 1 and 8,
  exactly-once checkpoints on the memory backend, beside the same-run plain loop and Flink's
  published per-core figure (Flink ran 8 TaskManagers of 1 slot);
- **sleep**: W3 (a 1 ms sleep per record) at parallelism 1, 8 and 16, at default settings.

"Every core" is this process's CPU set (``os.sched_getaffinity``), capped by the cgroup's
CPU quota when there is one: a container that shows more processors than it may use would
otherwise give numpy threads it cannot run. The figures are for the machine recorded in the
file, not for the 2-core machine of the other results.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from statistics import median


def usable_cores() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 or v1 CPU quota."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        try:
            q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
            p = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
            if q > 0:
                cores = min(cores, max(1, q // p))
        except (OSError, ValueError):
            pass
    return cores


CORES = usable_cores()

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import click  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402
from _common import RESULTS_DIR, machine_info, print_table, ratio, timed, write_result  # noqa: E402

SECTIONS = ("collectives", "cannon", "cg", "nexmark", "sleep")


def _no_save(section: dict) -> None:
    pass


# set by main(): writes a section's rows so far, so a section stopped by a time limit keeps
# what it measured (marked ``"partial": true``)
save_partial = _no_save


def all_cores():
    """numpy's BLAS on every usable core (threadpoolctl, in this process only: an
    environment variable would reach the Ray workers started from here)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(CORES, user_api="blas")


def _ray(num_cpus: int):
    import ray

    from rayflow._raycontext import ensure_ray

    if ray.is_initialized():
        ray.shutdown()
    return ensure_ray(None, num_cpus=num_cpus, include_dashboard=False)


# ---------------------------------------------------------------------------- sections
def collectives(quick: bool) -> dict:
    import bench_collectives as bc

    _ray(max(16, CORES))
    cases = bc._cases(quick)
    rows = []
    for ranks in (2, 4) if quick else (2, 4, 8):
        ours = bc.run_rayflow(ranks, cases)
        ours.pop("paths", None)
        started = ours.pop("stage_on_started_gang_ms")
        mpi = bc.run_mpi(ranks, cases) or {"pickle": {}, "buffer": {}}
        for op, nbytes, _ in cases:
            k = f"{op} {nbytes}"
            p, b = mpi["pickle"].get(k), mpi["buffer"].get(k)
            rows.append({"ranks": ranks, "op": op, "bytes": nbytes, "rayflow_us": ours[k],
                         "mpi4py_pickle_us": p, "mpi4py_buffer_us": b,
                         "vs_pickle": ratio(ours[k], p), "vs_buffer": ratio(ours[k], b),
                         "stage_on_started_gang_ms": started})
        save_partial({"rows": rows})
        print(f"collectives: {ranks} ranks done", flush=True)
    print_table("median microseconds per operation (rank 0)",
                ["ranks", "op", "bytes", "rayflow", "mpi4py pickle", "mpi4py buffer",
                 "x pickle", "x buffer"], [list(r.values())[:8] for r in rows])
    return {"rows": rows}


def cannon(quick: bool) -> dict:
    import ray
    from threadpoolctl import threadpool_limits

    from rayflow.hpc import BlockDataset, Gang, cannon_matmul

    _ray(max(16, CORES))
    plan = [(1024, (2,))] if quick else [(4096, (2, 4)), (8192, (4,))]
    reps = 2 if quick else 3
    rows, starts = [], []
    for n, grids in plan:
        rng = np.random.default_rng(n)
        a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
        with all_cores():
            t_all, _ = timed(lambda a=a, b=b: a @ b, reps)
        ref = a @ b
        t_one = None  # one thread at n = 8192 takes half a minute: measured at 4096 only
        if n <= 4096:
            with threadpool_limits(1, user_api="blas"):
                t0 = time.perf_counter()
                _ = a @ b
                t_one = time.perf_counter() - t0
        for p in grids:
            A, B = BlockDataset.from_numpy(a, (p, p)), BlockDataset.from_numpy(b, (p, p))
            ray.wait(list(A.refs + B.refs), num_returns=2 * p * p)
            t0 = time.perf_counter()
            with Gang(p * p, rank_num_cpus=1, blas_threads=1, gang_timeout_s=120) as g:
                starts.append({"ranks": p * p, "gang_start_s": time.perf_counter() - t0})
                last = {}

                def run(A=A, B=B, g=g, last=last):
                    last["c"] = cannon_matmul(A, B, gang=g)

                t_c, runs = timed(run, reps)
                err = float(np.abs(last["c"].to_numpy() - ref).max() / np.abs(ref).max())
            # mpi4py's Cannon builds both matrices and a single-thread reference in every
            # rank: affordable at n = 4096 only
            peer = peers.mpi("cannon", p * p, n, reps) if n <= 4096 else None
            t_mpi = peer["median_s"] if peer else None
            flops = 2.0 * n ** 3
            rows.append({"n": n, "ranks": p * p, "cannon_s": t_c, "runs_s": runs,
                         "cannon_gflops": flops / t_c / 1e9, "rel_error_f64": err,
                         "numpy_1thread_s": t_one, "numpy_all_cores_s": t_all,
                         "numpy_all_cores_threads": CORES,
                         "speedup_vs_1thread": ratio(t_one, t_c) if t_one else None,
                         "vs_numpy_all_cores_time_ratio": ratio(t_c, t_all),
                         "mpi4py_s": t_mpi,
                         "vs_mpi4py_time_ratio": ratio(t_c, t_mpi) if t_mpi else None})
            save_partial({"rows": rows, "gang_starts": starts})
            print(f"cannon n={n} ranks={p * p}: {t_c:.3f}s (numpy 1 thread {t_one}s, "
                  f"{CORES} threads {t_all:.3f}s, mpi4py {t_mpi})", flush=True)
            del A, B
    recovery = None
    if not quick and PLAN["recovery"]:
        import bench_cannon

        from rayflow.config import load_config

        recovery = bench_cannon._recovery_pairs(  # each run starts its own gang
            2048, 4, 1, load_config(hpc={"warm_gang_idle_s": 0}).hpc)
    print_table("Cannon, 1 BLAS thread per rank",
                ["n", "ranks", "s", "GF/s", "x 1 thread", "t/numpy all", "t/mpi4py"],
                [[r["n"], r["ranks"], r["cannon_s"], r["cannon_gflops"], r["speedup_vs_1thread"],
                  r["vs_numpy_all_cores_time_ratio"], r["vs_mpi4py_time_ratio"]] for r in rows])
    out = {"rows": rows, "gang_starts": starts}
    if recovery is not None:  # (a rerun without it keeps the one measured before)
        out["recovery"] = recovery
    return out


#: what a rerun may narrow (``--cg-sizes``, ``--cg-ranks``, ``--queries``, ``--no-recovery``)
PLAN: dict = {"cg_sizes": [1024, 4096, 8192], "cg_ranks": [2, 4, 8, 16],
              "queries": ["q0", "q5", "q8", "q11", "q13"], "recovery": True,
              "parallelism": [1, 8, 16]}

#: the key of a row in each section: a rerun's rows replace the earlier rows of equal key
ROW_KEYS = {"collectives": ("ranks", "op", "bytes"), "cannon": ("n", "ranks"),
            "cg": ("n", "ranks"), "nexmark": ("query", "parallelism"), "sleep": ("parallelism",)}


def merge_rows(section: str, old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` rows whose key no ``new`` row has, then the ``new`` rows, ordered by key.

        >>> merge_rows("cg", [{"n": 1, "ranks": 2, "t": 1}, {"n": 1, "ranks": 4, "t": 2}],
        ...            [{"n": 1, "ranks": 4, "t": 3}])
        [{'n': 1, 'ranks': 2, 't': 1}, {'n': 1, 'ranks': 4, 't': 3}]
    """
    names = ROW_KEYS[section]

    def key(r: dict) -> tuple:
        return tuple(r.get(k) for k in names)

    fresh = {key(r) for r in new}
    rows = [r for r in old if key(r) not in fresh] + list(new)
    return sorted(rows, key=lambda r: tuple(str(v) if isinstance(v, str) else f"{v:020}"
                                            for v in key(r)))


def cg(quick: bool) -> dict:
    import bench_cg
    from threadpoolctl import threadpool_limits

    from rayflow.hpc import BlockDataset, Gang, cg_solve
    from rayflow.hpc.algorithms.cg_math import conjugate_gradient

    _ray(max(16, CORES))
    sizes = [1024] if quick else PLAN["cg_sizes"]
    rank_counts = (2, 4) if quick else PLAN["cg_ranks"]
    iters, reps = 50, 3
    rows = []
    for n in sizes:
        a, b = bench_cg._spd(n, seed=n)

        def numpy_cg(a=a, b=b):
            x, _, st = conjugate_gradient(lambda v: a @ v, np.dot, b, tol=0.0, max_iter=iters)
            return x, st.iteration

        with threadpool_limits(1, user_api="blas"):
            t_one, _ = timed(numpy_cg, reps)
            x_np = numpy_cg()[0]
        with all_cores():
            t_all, _ = timed(numpy_cg, reps)
        ms_one, ms_all = t_one / iters * 1e3, t_all / iters * 1e3
        for r in rank_counts:
            A, B = BlockDataset.from_numpy(a, (r, 1)), BlockDataset.from_numpy(b, r)
            with Gang(r, rank_num_cpus=1, blas_threads=1, gang_timeout_s=120) as g:
                res = cg_solve(A, B, tol=0.0, max_iter=iters, gang=g)  # warm-up
                ts = []
                for _ in range(reps):
                    res = cg_solve(A, B, tol=0.0, max_iter=iters, gang=g)
                    ts.append(res.ms_per_iteration)
            diff = float(np.abs(res.x - x_np).max() / np.abs(x_np).max())
            peer = peers.mpi("cg", r, n, reps, iters)
            m_mpi = peer["ms_per_it"] if peer else None
            t = median(ts)
            rows.append({"n": n, "ranks": r, "iterations": iters, "rayflow_ms_per_it": t,
                         "runs_ms_per_it": ts, "rel_diff_vs_numpy_x": diff,
                         "numpy_1thread_ms_per_it": ms_one, "numpy_all_cores_ms_per_it": ms_all,
                         "numpy_all_cores_threads": CORES, "mpi4py_ms_per_it": m_mpi,
                         "vs_mpi4py_ratio": ratio(t, m_mpi) if m_mpi else None,
                         "vs_numpy_all_cores_ratio": ratio(t, ms_all),
                         "speedup_vs_1thread": ratio(ms_one, t)})
            save_partial({"rows": rows})
            print(f"cg n={n} ranks={r}: {t:.3f} ms/it (mpi4py {m_mpi}, numpy 1 thread "
                  f"{ms_one:.3f}, {CORES} threads {ms_all:.3f})", flush=True)
            del A, B
    print_table(f"CG ms/iteration, {iters} iterations, 1 BLAS thread per rank",
                ["n", "ranks", "rayflow", "mpi4py", "numpy 1", "numpy all", "t/mpi4py",
                 "t/numpy all"],
                [[r["n"], r["ranks"], r["rayflow_ms_per_it"], r["mpi4py_ms_per_it"],
                  r["numpy_1thread_ms_per_it"], r["numpy_all_cores_ms_per_it"],
                  r["vs_mpi4py_ratio"], r["vs_numpy_all_cores_ratio"]] for r in rows])
    return {"rows": rows}


def nexmark(quick: bool) -> dict:
    import bench_nexmark as bn

    from rayflow.nexmark import QUERIES

    _ray(max(16, CORES))
    names = ["q0", "q5"] if quick else PLAN["queries"]
    runs = 1 if quick else 2
    rows = []
    for name in names:
        q = QUERIES[name]
        base = (200_000 if quick else 2_000_000) if q.columnar else \
            (40_000 if quick else 400_000)
        plain = bn.plain_run(name, base)
        for par in (1, 8):
            n = base * (4 if par > 1 else 1)
            res = [bn.rayflow_run(name, n, "memory", parallelism=par) for _ in range(runs)]
            row = {"query": name, "parallelism": par, "events": n, "backend": "memory",
                   "guarantee": "exactly_once", "runs": res,
                   "events_s": median(r["events_s"] for r in res),
                   "cores": median(r["cores"] for r in res),
                   "per_core": median(r["per_core"] for r in res),
                   "plain_per_core": plain["per_core"],
                   "flink_per_core": bn.FLINK_PER_CORE.get(name)}
            row["vs_plain"] = ratio(row["per_core"], row["plain_per_core"])
            row["vs_flink"] = ratio(row["per_core"], row["flink_per_core"])
            rows.append(row)
            save_partial({"rows": rows})
            print(f"nexmark {name} p={par}: {row['events_s']:,.0f} events/s, "
                  f"{row['cores']:.1f} cores, {row['per_core']:,.0f} per core", flush=True)
    for row in rows:
        one = next(r for r in rows if r["query"] == row["query"] and r["parallelism"] == 1)
        row["speedup_vs_p1"] = ratio(row["events_s"], one["events_s"])
    print_table("Nexmark, exactly-once, memory backend",
                ["query", "p", "events/s", "x p=1", "cores", "per core", "vs plain", "vs Flink"],
                [[r["query"], r["parallelism"], r["events_s"], r["speedup_vs_p1"], r["cores"],
                  r["per_core"], r["vs_plain"], r["vs_flink"]] for r in rows])
    return {"rows": rows}


def sleep(quick: bool) -> dict:
    import bench_sleep as bs

    _ray(max(16, CORES))
    seconds = 1.0 if quick else 3.0
    call_ms = bs.sleep_call_ms()
    rows = [bs.sleep_run(p, seconds) for p in ((1, 4) if quick else PLAN["parallelism"])]
    for r in rows:
        r["scaling_efficiency"] = ratio(r["rec_s"], rows[0]["rec_s"] * r["parallelism"])
    print_table(f"W3 sleep 1 ms per record, defaults (one sleep here: {call_ms:.3f} ms)",
                ["parallelism", "rec/s", "per instance", "efficiency", "startup s"],
                [[r["parallelism"], r["rec_s"], r["rec_s_per_instance"],
                  r["scaling_efficiency"], r["startup_s"]] for r in rows])
    return {"rows": rows, "sleep_call_ms": call_ms, "seconds_per_instance": seconds}


@click.command()
@click.option("--quick", is_flag=True, help="small sizes: a check that every section runs")
@click.option("--sections", default=",".join(SECTIONS), show_default=True)
@click.option("--out", default="scaling", show_default=True,
              help="result name: benchmarks/results/<out>.json")
@click.option("--cg-sizes", default=None, help="CG matrix sizes (default 1024,4096,8192)")
@click.option("--cg-ranks", default=None, help="CG rank counts (default 2,4,8,16)")
@click.option("--queries", default=None, help="Nexmark queries (default q0,q5,q8,q11,q13)")
@click.option("--parallelism", default=None, help="W3 parallelisms (default 1,8,16)")
@click.option("--no-recovery", is_flag=True, help="skip Cannon's stage recovery on 16 ranks")
def main(quick: bool, sections: str, out: str, cg_sizes: str | None, cg_ranks: str | None,
         queries: str | None, parallelism: str | None, no_recovery: bool) -> None:
    for name, given in (("cg_sizes", cg_sizes), ("cg_ranks", cg_ranks),
                        ("parallelism", parallelism)):
        if given:
            PLAN[name] = [int(x) for x in given.split(",")]
    if queries:
        PLAN["queries"] = [q.strip() for q in queries.split(",") if q.strip()]
    PLAN["recovery"] = not no_recovery
    chosen = [s.strip() for s in sections.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        raise click.BadParameter(f"unknown sections {unknown}; known: {list(SECTIONS)}")
    path = RESULTS_DIR / f"{out}.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.setdefault("sections", {})
    print("machine:", machine_info(), "usable cores:", CORES, flush=True)
    global save_partial
    for name in chosen:
        t0 = time.perf_counter()

        before = dict(doc["sections"].get(name) or {})

        def merged(res: dict, name=name, before=before) -> dict:
            """``res`` with the rows of an earlier run that this one did not measure again."""
            res = {**res}
            if "rows" in res:
                stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
                for r in res["rows"]:
                    r.setdefault("measured", stamp)
                res["rows"] = merge_rows(name, before.get("rows", []), res["rows"])
            return {**before, **res}

        def partial(res: dict, name=name, t0=t0) -> None:
            doc["sections"][name] = {**merged(res), "partial": True,
                                     "section_s": round(time.perf_counter() - t0, 1),
                                     "machine": {**machine_info(), "usable_cores": CORES}}
            write_result(out, {"quick": quick, "sections": doc["sections"]})

        save_partial = partial
        try:
            res = globals()[name](quick)
        except Exception as err:  # noqa: BLE001 - a failed section is recorded, the rest run
            traceback.print_exc()
            res = {"error": f"{type(err).__name__}: {err}"[:2000]}
        res["section_s"] = round(time.perf_counter() - t0, 1)
        res["machine"] = {**machine_info(), "usable_cores": CORES}
        doc["sections"][name] = {**merged(res), "partial": "error" in res}
        written = write_result(out, {"quick": quick, "sections": doc["sections"]})
        print(f"{name}: {res['section_s']} s; wrote {written}", flush=True)


if __name__ == "__main__":
    main()
