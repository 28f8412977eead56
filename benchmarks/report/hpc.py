"""The MPI-stage workloads' sections: W5 Cannon's multiplication and W6 conjugate
gradient."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import published
from .base import _Ctx, _n, _plot_line, _ratio, _table, _x


def _all_cores_note(rows: list[dict], cores: Any, ours: str, key: str, unit: str) -> list[str]:
    """What the table says about numpy with every core of the machine: the ratio where the
    results have it, and that they lack it otherwise (the one-thread figure flatters a gang
    that uses every core)."""
    on = f"{cores} cores" if cores else "every core"
    have = [r for r in rows if r.get(key) is not None]
    if not have:
        return [f"**numpy with every core** ({on}, its BLAS threads unlimited) is not in these "
                "results: they compare with numpy on one BLAS thread only, which flatters a "
                f"gang that uses every core. Run the benchmark again to measure it.", ""]
    lo = min(have, key=lambda r: r[key])
    hi = max(have, key=lambda r: r[key])
    return [f"**Against numpy with every core** ({on}, its BLAS threads unlimited), {ours} "
            f"takes {_x(lo[key])} (n = {lo['n']}) to {_x(hi[key])} (n = {hi['n']}) of numpy's "
            f"{unit}; above 1× is slower than numpy. The one-thread columns flatter a gang "
            "that uses every core.", ""]

# -- W5 -----------------------------------------------------------------------------------------

def _w5(doc: dict, ctx: _Ctx) -> list[str]:
    rows = sorted(doc["rows"], key=lambda r: (r["ranks"], r["backend"], r["n"]))
    peers = doc.get("peers") or {}
    lines = ["Cannon's algorithm on a p×p gang, 1 BLAS thread per rank, median of the runs. "
             "Same-run baselines: the shuffle block multiply (Spark MLlib "
             "`BlockMatrix.multiply`'s algorithm, implemented in rayflow) and numpy `A @ B` in "
             "one process on one BLAS thread (the BLAS limit of one core). "
             f"BLAS kernel: {', '.join(map(str, doc.get('blas_kernel') or ['unknown']))}. "
             "Optional peers installed: "
             + (", ".join(f"{k} {'yes' if v else 'no'}" for k, v in peers.items()) or "unknown")
             + ".", "",
             f"Published: {doc.get('published') or published.W5_CANNON}.", ""]
    cores = (doc.get("machine") or {}).get("logical_cores")
    lines += _all_cores_note(rows, cores, "Cannon", "vs_numpy_all_cores_time_ratio", "time")
    every = any(r.get("numpy_all_cores_gflops") is not None for r in rows)
    lines += _table(["n", "ranks", "backend", "Cannon GFLOP/s", "shuffle GFLOP/s",
                     "numpy 1-thread GFLOP/s"]
                    + ["numpy all-cores GFLOP/s", "time / numpy all cores"] * every
                    + ["Cannon / shuffle (speed)",
                     "time saved vs shuffle (Blaze vs MLlib, pub.: 57–68%)", "time / numpy 1 thread",
                     "time / mpi4py", "time / Dask", "Spark MLlib GFLOP/s", "Cannon / Spark (speed)",
                     "rel. error f64", "Σ rank RSS / data"],
                    [[str(r["n"]), r["ranks"], r["backend"], r["cannon_gflops"], r["shuffle_gflops"],
                      r["numpy_gflops"]]
                     + [r.get("numpy_all_cores_gflops"),
                        _x(r.get("vs_numpy_all_cores_time_ratio"))] * every
                     + [_x(r.get("speedup_vs_shuffle")),
                      f"{r['improvement_vs_shuffle_pct']:.0f}%", _x(r.get("vs_numpy_time_ratio")),
                      _x(r.get("vs_mpi4py_time_ratio")), _x(r.get("vs_dask_time_ratio")),
                      r.get("spark_gflops"), _x(r.get("speedup_vs_spark")),
                      r.get("rel_error_f64"), _x(r.get("sum_rank_rss_over_data"))] for r in rows])
    blas = sorted({r["spark_blas"] for r in rows if r.get("spark_blas")})
    if blas:
        lines += ["Spark MLlib (pyspark, `local[p*p]`, one timed run after a warm-up) multiplies "
                  f"its blocks with the JVM's BLAS ({', '.join(blas)}): no system `libblas.so.3` "
                  "is installed here, as on a stock Spark install. That, not the algorithm, is "
                  "most of its gap to the shuffle baseline, which multiplies with numpy's "
                  "OpenBLAS.", ""]
    jm = doc.get("memory") or []
    if jm:
        lines += ["Job memory (the inputs A and B already in the object store, plus what the "
                  "stage added at its peak: the rank processes' USS above an idle Ray and the "
                  "object store's growth), over the bytes of A, B and C:", ""] + _table(
            ["n", "ranks", "backend", "USS above idle MB", "store growth MB", "A+B+C MB",
             "peak / data"],
            [[str(m["n"]), m["ranks"], m["backend"], m["uss_above_idle_mb"],
              m["store_growth_mb"], m["data_mb"], _x(m["peak_over_data"])] for m in jm])
    small = min(r["n"] for r in rows)
    base_rss = [r["max_rank_rss_mib"] for r in rows if r["n"] == small and "max_rank_rss_mib" in r]
    if base_rss:
        lines += ["Σ rank RSS / data is the peak RSS of every rank process (Python, Ray and numpy "
                  "included) over the bytes of A, B and C; at n = "
                  f"{small} each rank peaked at {_n(min(base_rss))}–{_n(max(base_rss))} MiB, "
                  "mostly the process itself, so the ratio overstates at small n.", ""]
    if cores and max(r["ranks"] for r in rows) > cores:
        lines += [f"With more ranks than the machine's {cores} cores, ranks share cores: "
                  "GFLOP/s above numpy's one-thread figure come from using all cores, not "
                  "from one rank being faster than BLAS.", ""]
    gs = doc.get("gang_starts") or []
    if gs:
        lines += ["Gang start-up (placement group and rank actors): "
                  + ", ".join(f"{g['ranks']} {g['backend']} rank(s) in {_n(g['gang_start_s'])} s"
                              for g in gs) + ".", ""]
    rec = doc.get("recovery")
    if rec:
        runs = (f", medians of {len(rec['runs_with_killed_rank_s'])} pairs"
                if rec.get("runs_with_killed_rank_s") else "")
        repl = (f", {rec['ranks_replaced']} rank(s) replaced" if rec.get("ranks_replaced")
                is not None else "")
        when = f", measured {rec['date'][:16].replace('T', ' ')} UTC" if rec.get("date") else ""
        lines += [f"Stage recovery: n = {rec['n']}, {rec['ranks']} ranks, one rank killed: "
                  f"{_n(rec['with_killed_rank_s'])} s vs {_n(rec['failure_free_s'])} s failure-"
                  f"free ({_x(rec.get('ratio'))}{runs}, {rec.get('attempts')} attempts{repl}, "
                  f"max abs diff {_n(rec.get('max_abs_diff'))}{when}; {rec.get('note', '')})."]
        warm = rec.get("warm")
        if warm:
            lines += [f"With warm gangs (the default for a stage without `gang=`), the same pair "
                      f"takes {_n(warm['with_killed_rank_s'])} s vs {_n(warm['failure_free_s'])} "
                      f"s ({_x(warm.get('ratio'))}): the failure-free run reuses an idle gang, "
                      f"the recovery starts the replacement rank."]
        lines += [""]
    lines += _plot_line(ctx, _plot_w5(ctx, rows), "W5 Cannon GFLOP/s vs n")

    top = max(r["ranks"] for r in rows)
    sp = [r["speedup_vs_shuffle"] for r in rows if r["ranks"] == top]
    ctx.check("W5", "Cannon ≥ 3× the shuffle baseline",
              f"{_x(min(sp))}–{_x(max(sp))} at {top} ranks", min(sp) >= 3)
    ssp = [r["speedup_vs_spark"] for r in rows if r["ranks"] == top and r.get("speedup_vs_spark")]
    if ssp:
        ctx.check("W5", "Cannon ≥ 3× Spark MLlib BlockMatrix.multiply (pyspark peer)",
                  f"{_x(min(ssp))}–{_x(max(ssp))} at {top} ranks", min(ssp) >= 3)
    errs = [r["rel_error_f64"] for r in rows if r.get("rel_error_f64") is not None]
    ctx.check("W5", "float64 relative error ≤ 1e-12", f"max {max(errs):.1e}" if errs else "–",
              max(errs) <= 1e-12 if errs else None)
    big = max(r["n"] for r in rows)
    if jm:
        for b in sorted({m["backend"] for m in jm}):
            sel = sorted((m for m in jm if m["backend"] == b), key=lambda m: m["n"])
            txt = ", ".join(f"n = {m['n']}: {_x(m['peak_over_data'])}" for m in sel)
            ctx.check("W5", f"peak memory ≤ 3× the matrix data ({b})",
                      f"job peak / (A+B+C): {txt}", max(m["peak_over_data"] for m in sel) <= 3)
    else:
        mem = [r["sum_rank_rss_over_data"] for r in rows
               if r["n"] == big and r.get("sum_rank_rss_over_data") is not None]
        ctx.check("W5", "peak memory ≤ 3× the matrix data",
                  f"Σ rank RSS / (A+B+C) up to {_x(max(mem))} at n = {big}" if mem else "–",
                  max(mem) <= 3 if mem else None)
    peer_rows = [r for r in rows if r.get("mpi4py_s") or r.get("dask_s")]
    if peer_rows:
        for b in sorted({r["backend"] for r in peer_rows}):
            sel = [r for r in peer_rows if r["backend"] == b and r["n"] >= 2048
                   and r["ranks"] == top]
            worst = [max(x for x in (r.get("vs_mpi4py_time_ratio"), r.get("vs_dask_time_ratio"))
                         if x is not None) for r in sel]
            if worst:
                txt = "; ".join(f"n = {r['n']}: {_x(r.get('vs_mpi4py_time_ratio'))} mpi4py, "
                                f"{_x(r.get('vs_dask_time_ratio'))} Dask" for r in sel)
                ctx.check("W5", f"within 1.2× of mpi4py Cannon and Dask matmul at n ≥ 2048 "
                          f"({b}, {top} ranks)", txt, max(worst) <= 1.2)
    else:
        missing = [p for p in ("mpi4py", "dask") if not peers.get(p)]
        ctx.check("W5", "within 1.2× of mpi4py Cannon and Dask matmul at n ≥ 2048",
                  f"{' and '.join(missing)} not installed" if missing
                  else "peers installed but not in the results", None)
    if rec:
        ctx.check("W5", "stage recovery ≤ 2× the failure-free run", _x(rec.get("ratio")),
                  None if rec.get("ratio") is None else rec["ratio"] <= 2)
    return lines


def _plot_w5(ctx: _Ctx, rows: list[dict]) -> Path | None:
    ns = sorted({r["n"] for r in rows})

    def fill(ax):
        for ranks in sorted({r["ranks"] for r in rows}):
            for backend in sorted({r["backend"] for r in rows}):
                rs = sorted((r for r in rows if r["ranks"] == ranks and r["backend"] == backend),
                            key=lambda r: r["n"])
                if rs:
                    ax.plot([r["n"] for r in rs], [r["cannon_gflops"] for r in rs], "-o",
                            label=f"Cannon, {backend}, {ranks} rank(s)")
            sh = {r["n"]: r["shuffle_gflops"] for r in rows if r["ranks"] == ranks}
            ax.plot(sorted(sh), [sh[n] for n in sorted(sh)], "--x",
                    label=f"shuffle baseline, {ranks} rank(s)")
        # the peers measured in the same run, at the gang sizes they ran (GFLOP/s = 2n³ / t)
        for ranks in sorted({r["ranks"] for r in rows}):
            for key, label, style in (("mpi4py_s", "mpi4py Cannon", "-.v"),
                                      ("dask_s", "Dask matmul", "-.D"),
                                      ("spark_s", "Spark MLlib BlockMatrix", "-.P")):
                pts = {r["n"]: 2.0 * r["n"] ** 3 / r[key] / 1e9 for r in rows
                       if r["ranks"] == ranks and r.get(key)}
                if pts:
                    ax.plot(sorted(pts), [pts[n] for n in sorted(pts)], style,
                            label=f"{label}, {ranks} rank(s)")
        npy = {r["n"]: r["numpy_gflops"] for r in rows}
        ax.plot(sorted(npy), [npy[n] for n in sorted(npy)], "k:s", label="numpy, 1 BLAS thread")
        every = {r["n"]: r["numpy_all_cores_gflops"] for r in rows
                 if r.get("numpy_all_cores_gflops")}
        if every:
            ax.plot(sorted(every), [every[n] for n in sorted(every)], "k-s",
                    label="numpy, every core")
        ax.set(xlabel="n (matrix side)", ylabel="GFLOP/s", title="W5 Cannon's multiplication")
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_ylim(bottom=0)

    return ctx.plots.draw("w5_cannon", 1, fill)


# -- W6 -----------------------------------------------------------------------------------------

def _w6(doc: dict, ctx: _Ctx) -> list[str]:
    rows = sorted(doc["rows"], key=lambda r: (r["backend"], r["n"]))
    lines = ["Conjugate gradient on a dense SPD matrix, row blocks on a gang, 1 BLAS thread per "
             "rank, median ms per iteration. Same-run baselines: driver-broadcast CG (the "
             "study's Spark baseline: matrix cached in workers, vector broadcast every "
             "iteration, driver reduces) and numpy CG in one process on one BLAS thread.", "",
             f"Published: {doc.get('published') or published.W6_CG}.", ""]
    cores = (doc.get("machine") or {}).get("logical_cores")
    lines += _all_cores_note(rows, cores, "rayflow CG", "vs_numpy_all_cores_ratio",
                             "time per iteration")
    every = any(r.get("numpy_all_cores_ms_per_it") is not None for r in rows)
    lines += _table(["n", "ranks", "backend", "rayflow ms/it", "broadcast ms/it", "numpy ms/it"]
                    + ["numpy all-cores ms/it", "time / numpy all cores"] * every + [
                     "rayflow / broadcast (speed)", "time saved vs broadcast (Blaze vs Spark, pub.: 51–94%)",
                     "time / numpy 1 thread", "mpi4py ms/it", "time / mpi4py", "Spark ms/it",
                     "rayflow / Spark (speed)", "rel. diff vs numpy", "max rank RSS MiB",
                     "matrix MiB"],
                    [[str(r["n"]), r["ranks"], r["backend"], r["rayflow_ms_per_it"],
                      r["broadcast_ms_per_it"], r["numpy_ms_per_it"]]
                     + [r.get("numpy_all_cores_ms_per_it"),
                        _x(r.get("vs_numpy_all_cores_ratio"))] * every
                     + [_x(r.get("speedup_vs_broadcast")),
                      f"{r['improvement_vs_broadcast_pct']:.0f}%", _x(r.get("vs_numpy_ratio")),
                      r.get("mpi4py_ms_per_it"), _x(r.get("vs_mpi4py_ratio")),
                      r.get("spark_ms_per_it"), _x(r.get("speedup_vs_spark")),
                      r.get("rel_diff_vs_numpy_x"), r.get("max_rank_rss_mib"),
                      r.get("matrix_mib")] for r in rows])
    lat = doc.get("collective_latency") or []
    if lat:
        lines += ["Allreduce latency on the gang:", ""] + _table(
            ["backend", "ranks", "scalar ms", "8 MiB ms"],
            [[x["backend"], x["ranks"], x["allreduce_scalar_ms"], x["allreduce_8MiB_ms"]]
             for x in lat])
    lines += _plot_line(ctx, _plot_w6(ctx, rows), "W6 CG ms per iteration")

    gloo = [r for r in rows if r["backend"] == "gloo"] or rows
    sp = [r["speedup_vs_broadcast"] for r in gloo]
    ctx.check("W6", "CG (gloo) ≥ 10× faster than the broadcast baseline",
              f"{_x(min(sp))}–{_x(max(sp))} ({gloo[0]['backend']})", min(sp) >= 10)
    ssp = [r["speedup_vs_spark"] for r in gloo if r.get("speedup_vs_spark")]
    if ssp:
        ctx.check("W6", "CG (gloo) ≥ 10× faster than Spark's broadcast CG (pyspark peer)",
                  f"{_x(min(ssp))}–{_x(max(ssp))} ({gloo[0]['backend']})", min(ssp) >= 10)
    goal = {4096: 1.5, 8192: 1.2}
    peer = {r["n"]: r.get("vs_mpi4py_ratio") for r in gloo
            if r.get("vs_mpi4py_ratio") and r["n"] in goal}
    if peer:
        ok = all(v <= goal[n] for n, v in peer.items())
        ctx.check("W6", "CG (gloo) within 1.5× (n = 4096) / 1.2× (n = 8192) of mpi4py CG",
                  ", ".join(f"n = {n}: {_x(v)}" for n, v in sorted(peer.items()))
                  + f" ({gloo[0]['backend']})", ok)
    else:
        ctx.check("W6", "CG (gloo) within 1.5× (n = 4096) / 1.2× (n = 8192) of mpi4py CG",
                  "mpi4py not in the results", None)
    ray_rows = {r["n"]: r for r in rows if r["backend"] == "ray"}
    for n, bound in ((1024, 1.5), (4096, 1.1)):
        v = (ray_rows.get(n) or {}).get("vs_mpi4py_ratio")
        ctx.check("W6", f"CG (Ray-native backend) within {bound}× of mpi4py at n = {n}",
                  _x(v) if v is not None else "not in the results",
                  None if v is None else v <= bound)
    v = (ray_rows.get(8192) or {}).get("vs_numpy_all_cores_ratio")
    ctx.check("W6", "CG (Ray-native backend) at least as fast as numpy with every core at "
              "n = 8192", f"{_x(v)} of numpy's time" if v is not None else "not in the results",
              None if v is None else v <= 1.0)
    by = {(r["backend"], r["n"]): r["rayflow_ms_per_it"] for r in rows}
    gaps = [f"n = {n}: {_x(_ratio(by[('ray', n)], by[('gloo', n)]))}"
            for n in sorted({r["n"] for r in rows}) if ("ray", n) in by and ("gloo", n) in by]
    if gaps:
        sc = {x["backend"]: x["allreduce_scalar_ms"] for x in lat}
        extra = (f"; scalar allreduce {_n(sc['ray'])} vs {_n(sc['gloo'])} ms"
                 if "ray" in sc and "gloo" in sc else "")
        ctx.check("W6", "Ray-native backend: state the gap to gloo (ms/it ray / gloo)",
                  ", ".join(gaps) + extra, None, status="reported")
    return lines


def _plot_w6(ctx: _Ctx, rows: list[dict]) -> Path | None:
    ns = sorted({r["n"] for r in rows})
    backends = sorted({r["backend"] for r in rows})

    def fill(ax):
        series = [(f"rayflow CG, {b}", {r["n"]: r["rayflow_ms_per_it"] for r in rows
                                       if r["backend"] == b}) for b in backends]
        series += [("broadcast baseline", {r["n"]: r["broadcast_ms_per_it"] for r in rows}),
                   ("numpy CG, 1 BLAS thread", {r["n"]: r["numpy_ms_per_it"] for r in rows})]
        # every peer and bound the table shows, where the results have it
        for key, label in (("numpy_all_cores_ms_per_it", "numpy CG, every core"),
                           ("mpi4py_ms_per_it", "mpi4py CG"), ("spark_ms_per_it", "Spark CG")):
            vals = {r["n"]: r[key] for r in rows if r.get(key)}
            if vals:
                series.append((label, vals))
        width = 0.8 / len(series)
        for i, (label, vals) in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(ns))]
            ax.bar(xs, [vals.get(n, float("nan")) for n in ns], width, label=label)
        ax.set_xticks(range(len(ns)), [f"n = {n}" for n in ns])
        ax.set(ylabel="ms per iteration (lower is better)", yscale="log",
               title="W6 conjugate gradient")

    return ctx.plots.draw("w6_cg", 1, fill)




# -- collectives and mpi4py programs ----------------------------------------------------------

def collectives_table(rows: list[dict]) -> list[str]:
    """rayflow beside mpi4py's pickle and buffer APIs, µs per call, one row per case (and
    rayflow's gloo backend where it ran)."""
    if any(r.get("rayflow_gloo_us") is not None for r in rows):
        return _table(["ranks", "op", "bytes", "rayflow µs", "rayflow gloo µs",
                       "mpi4py pickle µs", "mpi4py buffer µs", "÷ pickle", "÷ buffer",
                       "gloo ÷ buffer"],
                      [[r["ranks"], r["op"], r["bytes"], r["rayflow_us"], r.get("rayflow_gloo_us"),
                        r.get("mpi4py_pickle_us"), r.get("mpi4py_buffer_us"),
                        _x(r.get("vs_pickle")), _x(r.get("vs_buffer")),
                        _x(r.get("gloo_vs_buffer"))] for r in rows])
    return _table(["ranks", "op", "bytes", "rayflow µs", "mpi4py pickle µs", "mpi4py buffer µs",
                   "÷ pickle", "÷ buffer"],
                  [[r["ranks"], r["op"], r["bytes"], r["rayflow_us"], r.get("mpi4py_pickle_us"),
                    r.get("mpi4py_buffer_us"), _x(r.get("vs_pickle")), _x(r.get("vs_buffer"))]
                   for r in rows])


def _collectives(doc: dict, ctx: _Ctx) -> list[str]:
    rows = doc["rows"]
    lines = ["The direct rank-to-rank transport (shared-memory rings and segments on one node) "
             "against mpi4py on MPICH under `mpiexec`, the same loop on the same cores: each "
             "rank times every call, the figure is rank 0's median in µs (rayflow "
             "all-reduces arrays into a buffer it keeps, `comm.allreduce(x, out=buf)`, as "
             "MPI's buffer `Allreduce` does); "
             + (f"medians of {doc['rounds']} rounds, rayflow and `mpiexec` alternating. "
                if doc.get("rounds") else "one run of each. ")
             + "4 ranks on a 2-core machine oversubscribe it (rayflow's ranks then yield "
             "their core for 2 ms, then sleep, instead of spinning).", ""]
    lines += collectives_table(rows)
    for key, title in (("allreduce_1MiB_cost_us", "Where a 1 MiB allreduce's time goes (2 ranks, "
                        "one process, no waiting; the \"before\" rows are what the old path "
                        "paid: a new segment per message and a new result array)"),
                       ("small_message_cost_us", "Where a small message's time goes (one "
                        "process, no waiting)"),
                       ("large_message_paths_us", "Large messages on one node, 2 ranks: "
                        "ping-pong round trip by path")):
        part = doc.get(key)
        if part:
            lines += [f"{title}:", ""] + _table(["part", "µs"], [[k, v] for k, v in part.items()])
    starts = doc.get("stage_start_s") or {}
    if starts:
        lines += [f"A stage without `gang=`: {_n(starts.get('cold'))} s cold (a new gang), "
                  f"{_n(1e3 * starts['warm']) if starts.get('warm') is not None else '–'} ms "
                  "on a warm gang of the pool.", ""]

    def one(ranks: int, op: str, nbytes: int) -> dict | None:
        return next((r for r in rows if (r["ranks"], r["op"], r["bytes"]) == (ranks, op, nbytes)),
                    None)

    for ranks, op, nbytes, bound, what in ((2, "allreduce", 8, 50.0, "scalar allreduce"),
                                           (2, "barrier", 0, 30.0, "barrier")):
        r = one(ranks, op, nbytes)
        ctx.check("Collectives", f"{ranks}-rank {what} ≤ {bound:.0f} µs",
                  f"{_n(r['rayflow_us'])} µs" if r else "not in the results",
                  None if r is None else r["rayflow_us"] <= bound)
    for ranks in (2, 4):
        r = one(ranks, "allreduce", 1 << 20)
        v = r.get("vs_buffer") if r else None
        note = " (2 cores oversubscribed)" if ranks == 4 else ""
        ctx.check("Collectives", f"1 MiB allreduce within 1.5× of MPICH's buffer Allreduce, "
                  f"{ranks} ranks{note}",
                  f"{_x(v)} ({_n(r['rayflow_us'])} vs {_n(r['mpi4py_buffer_us'])} µs)" if v else
                  "not in the results", None if v is None else v <= 1.5)
    if starts.get("warm") is not None:
        ctx.check("Collectives", "a stage without `gang=` starts in ≤ 0.5 s on a warm gang",
                  f"{_n(1e3 * starts['warm'])} ms", starts["warm"] <= 0.5)
    return lines


def _mpi_api(doc: dict, ctx: _Ctx) -> list[str]:
    rows = doc["rows"]
    lines = [f"One unmodified mpi4py program (`{doc.get('program', 'bench_mpi_api.py')}`: "
             "`from mpi4py import MPI`, buffer and lowercase calls, and one-sided calls from rank 0 "
             "into rank 1's window under `Lock_all`, each with its `Flush`, and an "
             "`MPICommExecutor` of mpi4py.futures at rank 0 mapping `abs` over the others, "
             "one call or 100 per message, timed per call; on one rank, an "
             "`MPIPoolExecutor` that spawns two workers mapping `abs` the same way) run by "
             "`rayflow mpirun -n N` "
             f"and by `mpiexec -n N` ({doc.get('mpi_library') or 'MPICH'}), the same "
             "repetitions; rank 0's median µs per call, median over "
             f"{doc.get('rounds', '?')} alternating runs of each. Every result is checked "
             "against the value MPI defines. 4 ranks on a 2-core machine oversubscribe it.", ""]
    lines += _table(["ranks", "call", "bytes", "rayflow mpirun µs", "mpiexec µs", "÷ mpiexec"],
                    [[r["ranks"], r["op"], r["bytes"], r["rayflow_us"], r["mpi4py_us"],
                      _x(r.get("vs_mpi4py"))] for r in rows])
    for ranks in sorted({r["ranks"] for r in rows}):
        mine = {(r["op"], r["bytes"]): r.get("vs_mpi4py") for r in rows if r["ranks"] == ranks}
        ctx.check("mpi4py programs", f"the same program's calls under `rayflow mpirun -n "
                  f"{ranks}` ÷ `mpiexec -n {ranks}`",
                  ", ".join(f"{op} {b} B {_x(v)}" for (op, b), v in mine.items()), None,
                  status="reported")
    return lines
