"""The many-core section: what ``bench_scaling.py`` measured on a machine with more cores
than the 2-core one of the other sections (collectives on 8 ranks, Cannon and CG to 16,
Nexmark at parallelism 8, W3 to 16)."""

from __future__ import annotations

from . import published
from .base import _Ctx, _n, _table, _x
from .hpc import collectives_table

WHERE = "Many cores"


def _machine(section: dict) -> str:
    m = section.get("machine") or {}
    return (f"{m.get('usable_cores', m.get('logical_cores', '?'))} usable cores, "
            f"{m.get('cpu_model') or 'unknown CPU'}, {m.get('memory_gib', '?')} GiB")


def _scaling(doc: dict, ctx: _Ctx) -> list[str]:
    s = doc["sections"]
    lines = ["`benchmarks/bench_scaling.py` on a machine with more cores than the 2-core one "
             "of the sections above, each section beside its peers and baselines measured in "
             "the same run. \"numpy, every core\" is numpy with its BLAS on every usable core; "
             "ranks run one BLAS thread each. Rows whose `source` is `log` were read from the "
             "log of a run that reached its time limit in that section before writing its "
             "file; `measured` gives each row's time.", ""]
    if "collectives" in s:
        lines += _collectives(s["collectives"], ctx)
    if "cannon" in s:
        lines += _cannon(s["cannon"], ctx)
    if "cg" in s:
        lines += _cg(s["cg"], ctx)
    if "nexmark" in s:
        lines += _nexmark(s["nexmark"], ctx)
    if "sleep" in s:
        lines += _sleep(s["sleep"], ctx)
    return lines


def _collectives(sec: dict, ctx: _Ctx) -> list[str]:
    rows = sec["rows"]
    out = [f"### Collectives, 2 to 8 ranks ({_machine(sec)})", "",
           "Median µs per call on rank 0, rayflow's Ray-native backend against mpi4py on "
           "MPICH under `mpiexec`, on the same cores, no rank sharing a core.", ""]
    out += collectives_table(rows)

    def one(ranks: int, op: str, nbytes: int) -> dict | None:
        return next((r for r in rows if (r["ranks"], r["op"], r["bytes"]) == (ranks, op, nbytes)),
                    None)

    for ranks in (2, 4, 8):
        r = one(ranks, "allreduce", 1 << 20)
        if r and r.get("vs_buffer"):
            ctx.check(WHERE, f"1 MiB allreduce within 1.5× MPICH, {ranks} ranks",
                      f"{_x(r['vs_buffer'])}", r["vs_buffer"] <= 1.5)
    return out


def _cannon(sec: dict, ctx: _Ctx) -> list[str]:
    rows = sorted(sec["rows"], key=lambda r: (r["n"], r["ranks"]))
    out = [f"### Cannon to 16 ranks ({_machine(sec)})", "",
           "Median of 3 runs on a started gang, inputs already in the object store; mpi4py's "
           "Cannon (MPICH) on the same grid and data (n = 4096 only: it builds both matrices "
           "and a one-thread reference in every rank).", ""]
    out += _table(["n", "ranks", "rayflow s", "GF/s", "numpy 1 thread s", "× 1 thread",
                   "numpy, every core s", "÷ numpy every core", "mpi4py s", "÷ mpi4py"],
                  [[r["n"], r["ranks"], r["cannon_s"], r["cannon_gflops"], r.get("numpy_1thread_s"),
                    _x(r.get("speedup_vs_1thread")), r["numpy_all_cores_s"],
                    _x(r.get("vs_numpy_all_cores_time_ratio")), r.get("mpi4py_s"),
                    _x(r.get("vs_mpi4py_time_ratio"))] for r in rows])
    rec = sec.get("recovery")
    if rec:
        out += [f"A rank killed after its first GEMM (n = {rec['n']}, {rec['ranks']} ranks, "
                f"both runs starting their own gang): {_n(rec['with_killed_rank_s'])} s against "
                f"{_n(rec['failure_free_s'])} s failure-free ({_x(rec['ratio'])}), "
                f"{rec.get('ranks_replaced')} rank replaced. Note: {rec.get('note', '')}.", ""]
    for r in rows:
        if r.get("vs_mpi4py_time_ratio"):
            ctx.check(WHERE, f"Cannon n = {r['n']} on {r['ranks']} ranks within 1.1× mpi4py",
                      _x(r["vs_mpi4py_time_ratio"]), r["vs_mpi4py_time_ratio"] <= 1.1)
    big = [r for r in rows if r["ranks"] == max(x["ranks"] for x in rows)]
    for r in big:
        ctx.check(WHERE, f"Cannon n = {r['n']}, {r['ranks']} ranks, against numpy on every core",
                  f"{_x(r['vs_numpy_all_cores_time_ratio'])} numpy's time", None,
                  status="reported")
    return out


def _cg(sec: dict, ctx: _Ctx) -> list[str]:
    rows = sorted(sec["rows"], key=lambda r: (r["n"], r["ranks"]))
    out = [f"### Conjugate gradient to 16 ranks ({_machine(sec)})", "",
           "ms per iteration over 50 iterations (tolerance 0), median of 3 solves on a started "
           "gang, beside mpi4py's CG (MPICH, `Allgatherv` + `allreduce`) on the same ranks and "
           "numpy's CG in one process.", ""]
    out += _table(["n", "ranks", "rayflow ms/it", "mpi4py ms/it", "÷ mpi4py", "numpy 1 thread",
                   "numpy, every core", "÷ numpy every core", "source"],
                  [[r["n"], r["ranks"], r["rayflow_ms_per_it"], r.get("mpi4py_ms_per_it"),
                    _x(r.get("vs_mpi4py_ratio")), r["numpy_1thread_ms_per_it"],
                    r["numpy_all_cores_ms_per_it"], _x(r.get("vs_numpy_all_cores_ratio")),
                    r.get("source", "file")] for r in rows])

    def one(n: int, ranks: int) -> dict | None:
        return next((r for r in rows if (r["n"], r["ranks"]) == (n, ranks)), None)

    for n, bound in ((4096, 1.1), (1024, 1.5)):
        r = one(n, 2)
        if r and r.get("vs_mpi4py_ratio"):
            ctx.check(WHERE, f"CG n = {n}, 2 ranks, within {bound}× mpi4py",
                      _x(r["vs_mpi4py_ratio"]), r["vs_mpi4py_ratio"] <= bound)
    big = [r for r in rows if r["n"] == 8192]
    if big:
        best = min(big, key=lambda r: r["rayflow_ms_per_it"])
        ctx.check(WHERE, "CG n = 8192 at least as fast as numpy on every core",
                  f"best {_n(best['rayflow_ms_per_it'])} ms/it ({best['ranks']} ranks) vs "
                  f"{_n(best['numpy_all_cores_ms_per_it'])}",
                  best["rayflow_ms_per_it"] <= best["numpy_all_cores_ms_per_it"])
    return out


def _nexmark(sec: dict, ctx: _Ctx) -> list[str]:
    rows = sorted(sec["rows"], key=lambda r: (int(r["query"][1:]), r["parallelism"]))
    out = [f"### Nexmark at parallelism 8 ({_machine(sec)})", "",
           "Exactly-once checkpoints every second, memory backend, a generator source of the "
           "same parallelism. Per core = events ÷ CPU seconds of the driver and every Ray "
           "worker of the job. Flink's published per-core figures came from 8 TaskManagers of "
           "one slot.", ""]
    out += _table(["query", "parallelism", "events/s", "× parallelism 1", "cores", "per core",
                   "Flink per core", "÷ Flink", "÷ plain loop"],
                  [[r["query"], r["parallelism"], r["events_s"], _x(r.get("speedup_vs_p1")),
                    r["cores"], r["per_core"], r.get("flink_per_core"), _x(r.get("vs_flink")),
                    _x(r.get("vs_plain"))] for r in rows])
    for r in rows:
        if r["parallelism"] > 1 and r.get("vs_flink"):
            ctx.check(WHERE, f"Nexmark {r['query']} per core ≥ Flink's at parallelism "
                      f"{r['parallelism']}", _x(r["vs_flink"]), r["vs_flink"] >= 1.0)
    return out


def _sleep(sec: dict, ctx: _Ctx) -> list[str]:
    rows = sorted(sec["rows"], key=lambda r: r["parallelism"])
    per_thread = published.W2_IDENTITY["sleep_rec_s_per_thread"]
    call = sec.get("sleep_call_ms")
    out = [f"### W3 sleep to parallelism 16 ({_machine(sec)})", "",
           "`source -> rebalance() -> map(sleep 1 ms, parallelism=p) -> sink` at default "
           f"settings, {_n(sec.get('seconds_per_instance'))} s of work per instance"
           + (f"; one `time.sleep(0.001)` took {_n(call)} ms here, so one instance does at "
              f"most {_n(1000 / call)} rec/s" if call else "") + ".", ""]
    out += _table(["parallelism", "rec/s", "per instance", "scaling efficiency", "start-up s"],
                  [[r["parallelism"], r["rec_s"], r["rec_s_per_instance"],
                    f"{100 * r['scaling_efficiency']:.0f}%", r.get("startup_s")] for r in rows])
    for r in rows:
        if r["parallelism"] >= 8:
            ctx.check(WHERE, f"W3 ≥ {per_thread} rec/s per instance at parallelism "
                      f"{r['parallelism']}", f"{_n(r['rec_s_per_instance'])}",
                      r["rec_s_per_instance"] >= per_thread)
    return out
