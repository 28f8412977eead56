"""The benchmark report: ``benchmarks/results/*.json`` into ``BENCHMARKS.md`` with PNG plots.

    rayflow report [--results benchmarks/results] [--out BENCHMARKS.md]

One section per reference workload (W1–W6, described in ``docs/workloads.md``), plus "Autoscaling"
and "Streams + MPI stages" when their results exist, and "Other results" for any file this
module does not know. Each section shows our figures, the baselines and peers measured in the
same run, the published figures, the ratios, the machine and date of the run, and which of
the project's targets are met. A missing result file gives a section that says how to
measure it; a file of an unexpected shape gives a section that says so. Neither stops the
report. Plots use matplotlib's Agg canvas (no display, no pyplot state); without matplotlib
the report is written without them.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayflow.errors import RayflowError

__all__ = ["generate"]

# W1 Tables 2 and 3 (after tuning): side px -> (Storm MB, Streams MB, Storm img/s, Streams img/s)
_W1_PUBLISHED = {
    50: (220, 165, 1002, 1186), 100: (250, 166, 730, 611), 200: (284, 166, 202, 210),
    400: (310, 166, 108, 42.3), 600: (320, 169, 49.6, 23.6), 800: (400, 170, 32.5, 14.5),
    1000: (460, 178, 24, 9.51), 1200: (580, 200, 14.4, 5.91),
}
_W2_PUBLISHED = {"storm_rec_s": 87_000, "flink_rec_s": 350_000,
                 "storm_latency_ms": {"p50": 100, "p99": 700},
                 "flink_latency_ms": {"p50": 50, "p99": 300}, "sleep_rec_s_per_thread": 900}
_W4_PUBLISHED = {"storm_rec_s": 12_000, "flink_rec_s": 43_000, "flink_eos_vs_alo_slowdown": 0.063,
                 "storm_amo_vs_alo_speedup": 0.168, "flink_rocksdb_vs_memory": 0.1}
_META_KEYS = {"benchmark", "date", "machine", "published", "quick", "plot"}


@dataclass
class _Check:
    """One target, judged on one result file."""

    workload: str
    target: str
    measured: str
    status: str  # "met", "missed", "not measured" or "reported"


@dataclass
class _Ctx:
    """What a section renderer needs besides its document."""

    results_dir: Path
    out_dir: Path
    plots_dir: Path
    plots: _Plotter
    checks: list[_Check] = field(default_factory=list)

    def link(self, path: Path) -> str:
        """``path`` relative to the report's directory, with forward slashes."""
        return Path(os.path.relpath(path.resolve(), self.out_dir.resolve())).as_posix()

    def check(self, workload: str, target: str, measured: str, ok: bool | None,
              status: str | None = None) -> None:
        if status is None:
            status = "not measured" if ok is None else ("met" if ok else "missed")
        self.checks.append(_Check(workload, target, measured, status))


# -- formatting -------------------------------------------------------------------------------

def _n(x: Any) -> str:
    """A number as a reader wants it: thousands separators, three significant digits."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        a = abs(x)
        if a >= 1000:
            return f"{x:,.0f}"
        if a >= 100:
            return f"{x:.0f}"
        if a >= 10:
            return f"{x:.1f}"
        if a >= 0.01:
            return f"{x:.3g}"
        return "0" if x == 0 else f"{x:.1e}"
    return str(x)


def _x(r: float | None) -> str:
    return "–" if r is None else f"{r:.2f}×"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_n(c) for c in r) + " |" for r in rows]
    return out + [""]


def _date(doc: dict) -> str:
    raw = doc.get("date")
    try:
        d = _dt.datetime.fromisoformat(str(raw))
    except ValueError:
        return str(raw or "unknown date")
    if d.tzinfo is not None:
        d = d.astimezone(_dt.timezone.utc)
    return d.strftime("%Y-%m-%d %H:%M UTC")


def _machine_line(doc: dict) -> str:
    m = doc.get("machine") or {}
    cores = m.get("logical_cores")
    phys = m.get("physical_cores")
    load = m.get("loadavg_1m")
    parts = [f"{cores if cores is not None else '?'} logical cores"
             + (f" ({phys} physical)" if phys else ""),
             m.get("cpu_model") or "unknown CPU"]
    if m.get("memory_gib") is not None:
        parts.append(f"{m['memory_gib']} GiB RAM")
    parts.append(f"load average {load if load is not None else '?'} (1 min, at the end of the run)")
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    line = f"**Machine:** {', '.join(parts)}. **Date:** {_date(doc)}."
    if load is not None and cores and load > cores:
        line += (" The load was above the core count: it counts the benchmark's own "
                 "processes and anything else that ran, so absolute figures may be "
                 "pessimistic; the same-run ratios hold better.")
    return line


# -- plots ------------------------------------------------------------------------------------

class _Plotter:
    """Draws PNGs on matplotlib's Agg canvas; does nothing when matplotlib is missing."""

    def __init__(self, plots_dir: Path):
        self.plots_dir = plots_dir
        try:
            from matplotlib.figure import Figure
        except ImportError:  # matplotlib is in the bench/dev extras only
            self._figure = None
        else:
            self._figure = Figure

    @property
    def available(self) -> bool:
        return self._figure is not None

    def draw(self, name: str, ncols: int, fn: Callable[..., None]) -> Path | None:
        """Create a figure with ``ncols`` axes, let ``fn(*axes)`` fill it, save ``name``.png."""
        if self._figure is None:
            return None
        fig = self._figure(figsize=(6.2 * ncols, 4.4))
        axes = fig.subplots(1, ncols, squeeze=False)[0]
        fn(*axes)
        for ax in axes:
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        fig.tight_layout()
        self.plots_dir.mkdir(parents=True, exist_ok=True)
        path = self.plots_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        return path


def _plot_line(ctx: _Ctx, path: Path | None, what: str) -> list[str]:
    if path is None:
        return [f"_Plot of {what} skipped: matplotlib is not installed "
                "(`pip install -e '.[bench]'`)._", ""]
    return [f"![{what}]({ctx.link(path)})", ""]


# -- W1 -----------------------------------------------------------------------------------------

def _w1_published(doc: dict) -> dict[int, tuple]:
    pub = doc.get("published")
    if isinstance(pub, dict) and pub:
        return {int(k): tuple(v) for k, v in pub.items()}
    return _W1_PUBLISHED


def _w1(doc: dict, ctx: _Ctx) -> list[str]:
    rows = sorted(doc["rows"], key=lambda r: r["side"])
    pub = _w1_published(doc)
    configs = [c for c in (doc.get("configs") or {"p1": 0, "blur2": 0, "both": 0})
               if all(c in r for r in rows)]
    best = "both" if "both" in configs else configs[-1]
    n = doc.get("n", rows[0].get("n"))
    lines = [f"N = {_n(n)} synthetic PNG images per size. Configurations: "
             + "; ".join(f"`{c}` = {_n(v.get('readers'))} reader(s), blur ×"
                         f"{_n(v.get('blur_parallelism'))}, {_n(v.get('writers'))} writer(s)"
                         for c, v in (doc.get("configs") or {}).items() if c in configs)
             + ". Baseline: a plain single-process OpenCV loop (read, decode, blur, encode) on "
               "the same files, same run. Published: Storm and IBM Streams after tuning "
               "(Tables 2, 3).", ""]
    header = (["side px", "OpenCV loop", "loop, 2 processes"] + [f"rayflow {c}" for c in configs]
              + [f"{c} / loop" for c in configs] + [f"ceiling ({best})", "Storm (pub.)",
                                                   "Streams (pub.)", f"{best} / Storm"])
    table = []
    for r in rows:
        p = pub.get(r["side"], (None,) * 4)
        loop = r["loop"]["img_s"]
        table.append([str(r["side"]), loop, r["loop"].get("two_process_img_s")]
                     + [r[c]["throughput_img_s"] for c in configs]
                     + [_x(_ratio(r[c]["throughput_img_s"], loop)) for c in configs]
                     + [r[best].get("ceiling_img_s"), p[2], p[3],
                        _x(_ratio(r[best]["throughput_img_s"], p[2]))])
    lines += ["Throughput, images/s:", ""] + _table(header, table)
    mem_h = (["side px"] + [f"USS {c}" for c in configs] + [f"store {c}" for c in configs]
             + ["Storm (pub.)", "Streams (pub.)"])
    mem = [[str(r["side"])] + [r[c]["memory"]["uss_peak_above_idle_mb"] for c in configs]
           + [r[c]["memory"]["object_store_peak_mb"] for c in configs]
           + list(pub.get(r["side"], (None, None))[:2]) for r in rows]
    runs = doc.get("memory_runs", 1)
    probed = (f" They come from separate runs of each configuration on {_n(doc['memory_images'])} "
              "of the images, with the memory probe sampling"
              + (f" (the median of {runs} runs)" if runs > 1 else "")
              + "; the throughput runs above have no probe, like the loop."
              if doc.get("memory_images") else "")
    lines += ["Peak memory, MB: USS of all rayflow processes above an idle Ray, and the object "
              "store's peak (published: whole job)." + probed, ""] + _table(mem_h, mem)
    first, last = rows[0], rows[-1]
    growth = {c: _ratio(last[c]["memory"]["uss_peak_above_idle_mb"],
                        first[c]["memory"]["uss_peak_above_idle_mb"]) for c in configs}
    lines += [f"Memory growth {first['side']} → {last['side']} px (USS above idle): "
              + ", ".join(f"{c} {_x(g)}" for c, g in growth.items())
              + " (Streams 1.2×, Storm 2.6× over 50 → 1200 px).", ""]
    existing = doc.get("plot")
    if existing and (ctx.results_dir / existing).exists():
        lines += [f"![W1 throughput and memory vs image size]"
                  f"({ctx.link(ctx.results_dir / existing)})", ""]
    else:
        lines += _plot_line(ctx, _plot_w1(ctx, rows, configs, pub),
                            "W1 throughput and memory vs image size")

    def vs_loop(c: str, sides: Callable[[int], bool]) -> tuple[float | None, str]:
        rs = [_ratio(r[c]["throughput_img_s"], r["loop"]["img_s"]) for r in rows
              if sides(r["side"])]
        rs = [x for x in rs if x is not None]
        return (min(rs) if rs else None), (f"min {_x(min(rs))}" if rs else "no such sizes")

    if "p1" in configs:
        lo, txt = vs_loop("p1", lambda s: s >= 200)
        ctx.check("W1", "parallelism 1: ≥ 1.0× the loop from 200 px up", txt,
                  None if lo is None else lo >= 1.0)
        lo, txt = vs_loop("p1", lambda s: s <= 100)
        ctx.check("W1", "parallelism 1: ≥ 0.7× the loop at 50–100 px", txt,
                  None if lo is None else lo >= 0.7)
    if "both" in configs:
        lo, txt = vs_loop("both", lambda s: s >= 400)
        two = [_ratio(r["loop"].get("two_process_img_s"), r["loop"]["img_s"]) for r in rows
               if r["side"] >= 400]
        two = [x for x in two if x is not None]
        if two:
            txt += f" (the plain loop in two processes: min {_x(min(two))})"
        ctx.check("W1", "both cores: ≥ 1.8× the loop from 400 px up", txt,
                  None if lo is None else lo >= 1.8)
    for c in configs:
        g = growth.get(c)
        ctx.check("W1", f"peak memory at 1200 px ≤ 1.5× that at 50 px ({c})",
                  f"{_x(g)} ({first['side']} → {last['side']} px)",
                  None if g is None or first["side"] > 50 or last["side"] < 1200 else g <= 1.5)
    return lines


def _plot_w1(ctx: _Ctx, rows: list[dict], configs: list[str], pub: dict) -> Path | None:
    sides = [r["side"] for r in rows]

    def fill(a, b):
        a.plot(sides, [r["loop"]["img_s"] for r in rows], "k--o", label="OpenCV loop (same run)")
        for c in configs:
            a.plot(sides, [r[c]["throughput_img_s"] for r in rows], "-o", label=f"rayflow {c}")
        a.plot(sides, [pub.get(s, (None,) * 4)[2] for s in sides], ":s", label="Storm (published)")
        a.plot(sides, [pub.get(s, (None,) * 4)[3] for s in sides], ":^",
               label="Streams (published)")
        a.set(xlabel="image side (px)", ylabel="images/s", yscale="log", title="W1 throughput")
        for c in configs:
            b.plot(sides, [r[c]["memory"]["uss_peak_above_idle_mb"] for r in rows], "-o",
                   label=f"rayflow {c}: USS above idle")
        b.plot(sides, [r[configs[0]]["memory"]["object_store_peak_mb"] for r in rows], "-x",
               label=f"rayflow {configs[0]}: object store peak")
        b.plot(sides, [pub.get(s, (None,) * 4)[0] for s in sides], ":s", label="Storm (published)")
        b.plot(sides, [pub.get(s, (None,) * 4)[1] for s in sides], ":^",
               label="Streams (published)")
        b.set(xlabel="image side (px)", ylabel="MB", title="W1 peak memory")
        b.set_ylim(bottom=0)

    return ctx.plots.draw("w1_images", 2, fill)


# -- W2 -----------------------------------------------------------------------------------------

def _w2(doc: dict, ctx: _Ctx) -> list[str]:
    pub = {**_W2_PUBLISHED, **(doc.get("published") or {})}
    mem = doc["in_memory"]
    lines = ["Identity: each record `msgId,eventTime` gets inTime/outTime stamps. Same-run "
             "baselines: a bare single-process Python loop doing the same per-record work, and "
             "a plain single-process consume → stamp → produce loop with the same Kafka client. "
             f"Published (single thread): Storm {_n(pub['storm_rec_s'])} rec/s, Flink "
             f"{_n(pub['flink_rec_s'])} rec/s.", ""]
    lines += ["In memory, parallelism 1:", ""] + _table(
        ["variant", "rayflow rec/s", "bare loop rec/s", "rayflow / loop", "vs Flink (pub.)"],
        [["columnar (numpy) batches", mem["columnar_rec_s"], mem["bare_loop_rec_s"],
          _x(_ratio(mem["columnar_rec_s"], mem["bare_loop_rec_s"])),
          _x(_ratio(mem["columnar_rec_s"], pub["flink_rec_s"]))],
         ["per-record Python function", mem["per_record_rec_s"], mem["bare_loop_rec_s"],
          _x(mem.get("per_record_vs_loop")
             or _ratio(mem["per_record_rec_s"], mem["bare_loop_rec_s"])),
          _x(_ratio(mem["per_record_rec_s"], pub["flink_rec_s"]))]])
    if mem.get("startup_s") is not None:
        lines += [f"Job start-up on a running local Ray: {_n(mem['startup_s'])} s.", ""]
    kafka = doc.get("kafka") or []
    lines += ["Through Kafka (embedded broker), parallelism 1, reading a pre-filled topic:", ""]
    lines += _table(["client", "partitions", "records", "rayflow rec/s", "plain loop rec/s",
                     "rayflow / loop", "Storm (pub.)", "Flink (pub.)", "vs Storm", "vs Flink"],
                    [[k["client"], k["partitions"], k.get("records"), k["ours_rec_s"],
                      k["plain_loop_rec_s"], _x(k.get("ratio_vs_loop")), pub["storm_rec_s"],
                      pub["flink_rec_s"], _x(_ratio(k["ours_rec_s"], pub["storm_rec_s"])),
                      _x(_ratio(k["ours_rec_s"], pub["flink_rec_s"]))] for k in kafka])
    lat = doc.get("latency") or []
    fl, st = pub["flink_latency_ms"], pub["storm_latency_ms"]
    lines += ["Latency outTime − eventTime at a fraction of the measured capacity (published, "
              f"near full throughput: Flink p50 {fl['p50']} / p99 {fl['p99']} ms, Storm p50 "
              f"{st['p50']} / p99 {st['p99']} ms):", ""]
    lines += _table(["path", "load", "target rec/s", "achieved rec/s", "p50 ms", "p99 ms",
                     "p50 / Flink p50", "p99 / Flink p99"],
                    [[r["path"], f"{round(100 * r['load'])}%", r.get("rate"),
                      r.get("achieved_rec_s"), r["p50_ms"], r["p99_ms"],
                      _x(_ratio(r["p50_ms"], fl["p50"])), _x(_ratio(r["p99_ms"], fl["p99"]))]
                     for r in lat])
    if lat:
        lines += _plot_line(ctx, _plot_w2(ctx, lat, fl), "W2 latency p50/p99 vs load")

    ctx.check("W2", "in memory, columnar: ≥ 1,000,000 rec/s", f"{_n(mem['columnar_rec_s'])} rec/s",
              mem["columnar_rec_s"] >= 1_000_000)
    pr = mem.get("per_record_vs_loop") or _ratio(mem["per_record_rec_s"], mem["bare_loop_rec_s"])
    ctx.check("W2", "in memory, per-record function: ≥ 50% of the bare loop", _x(pr),
              None if pr is None else pr >= 0.5)
    for client in dict.fromkeys(k["client"] for k in kafka):
        ks = [k for k in kafka if k["client"] == client]
        rs = [k["ratio_vs_loop"] for k in ks if k.get("ratio_vs_loop") is not None]
        ctx.check("W2", f"Kafka ({client}): ≥ 1.0× the plain loop, same client",
                  ", ".join(f"{_x(k.get('ratio_vs_loop'))} ({k['partitions']} part.)" for k in ks),
                  min(rs) >= 1.0 if rs else None)
        best = max(k["ours_rec_s"] for k in ks)
        ctx.check("W2", f"Kafka ({client}): ≥ 100,000 rec/s", f"{_n(best)} rec/s (best)",
                  best >= 100_000)
    for path in dict.fromkeys(r["path"] for r in lat):
        half = [r for r in lat if r["path"] == path and abs(r["load"] - 0.5) < 1e-6]
        if path == "memory":
            target, ok = "latency at 50% load, in memory: p99 ≤ 50 ms", None
            if half:
                ok = half[0]["p99_ms"] <= 50
        else:
            target, ok = f"latency at 50% load, {path}: p50 ≤ 50 ms and p99 ≤ 300 ms", None
            if half:
                ok = half[0]["p50_ms"] <= 50 and half[0]["p99_ms"] <= 300
        ctx.check("W2", target, (f"p50 {_n(half[0]['p50_ms'])} ms, p99 {_n(half[0]['p99_ms'])} ms"
                                 if half else "no 50% point"), ok)
    if mem.get("startup_s") is not None:
        ctx.check("W2", "job start-up on a running local Ray: a few seconds, reported",
                  f"{_n(mem['startup_s'])} s", None, status="reported")
    return lines


def _plot_w2(ctx: _Ctx, lat: list[dict], flink: dict) -> Path | None:
    def fill(ax):
        for i, path in enumerate(dict.fromkeys(r["path"] for r in lat)):
            rs = sorted((r for r in lat if r["path"] == path), key=lambda r: r["load"])
            xs = [100 * r["load"] for r in rs]
            color = f"C{i}"
            ax.plot(xs, [r["p50_ms"] for r in rs], "-o", color=color, label=f"{path} p50")
            ax.plot(xs, [r["p99_ms"] for r in rs], "--^", color=color, label=f"{path} p99")
        ax.axhline(flink["p50"], color="gray", ls=":", label=f"Flink p50 (pub.) {flink['p50']} ms")
        ax.axhline(flink["p99"], color="k", ls=":", label=f"Flink p99 (pub.) {flink['p99']} ms")
        ax.set(xlabel="input rate, % of measured capacity", ylabel="latency (ms)", yscale="log",
               title="W2 identity latency, outTime − eventTime")

    return ctx.plots.draw("w2_latency", 1, fill)


# -- W3 -----------------------------------------------------------------------------------------

def _w3(doc: dict, ctx: _Ctx) -> list[str]:
    pub = {**_W2_PUBLISHED, **(doc.get("published") or {})}
    per_thread = pub["sleep_rec_s_per_thread"]
    rows = sorted(doc["sleep"], key=lambda r: r["parallelism"])
    lines = [f"Identity plus a 1 ms sleep per record. Published: ~{per_thread} rec/s per thread "
             "for Storm and Flink, linear in parallelism. Sleeping does not need a core, so "
             "scaling is meaningful on a small machine.", ""]
    lines += _table(["parallelism", "records", "rayflow rec/s", "per instance",
                     "published (~900 × p)", "per instance / 900", "scaling efficiency"],
                    [[r["parallelism"], r.get("records"), r["rec_s"], r["rec_s_per_instance"],
                      per_thread * r["parallelism"],
                      _x(_ratio(r["rec_s_per_instance"], per_thread)),
                      f"{100 * r['scaling_efficiency']:.0f}%"] for r in rows])
    lines += _plot_line(ctx, _plot_w3(ctx, rows, per_thread), "W3 sleep scaling")
    lo = min(r["rec_s_per_instance"] for r in rows)
    ctx.check("W3", f"≥ {per_thread} rec/s per instance", f"min {_n(lo)} rec/s", lo >= per_thread)
    top = rows[-1]
    ctx.check("W3", "≥ 90% linear scaling to parallelism 8",
              f"{100 * top['scaling_efficiency']:.0f}% at {top['parallelism']}",
              None if top["parallelism"] < 8 else top["scaling_efficiency"] >= 0.9)
    return lines


def _plot_w3(ctx: _Ctx, rows: list[dict], per_thread: float) -> Path | None:
    ps = [r["parallelism"] for r in rows]

    def fill(ax):
        ax.plot(ps, [r["rec_s"] for r in rows], "-o", label="rayflow")
        ax.plot(ps, [rows[0]["rec_s_per_instance"] * p for p in ps], "k--",
                label="linear from parallelism 1")
        ax.plot(ps, [per_thread * p for p in ps], ":s", color="gray",
                label=f"published ~{per_thread} rec/s per thread")
        ax.set(xlabel="parallelism", ylabel="records/s", title="W3 sleep 1 ms: scaling")
        ax.set_xticks(ps, [str(p) for p in ps])
        ax.set_ylim(bottom=0)

    return ctx.plots.draw("w3_sleep", 1, fill)


# -- W4 -----------------------------------------------------------------------------------------

def _w4(doc: dict, ctx: _Ctx) -> list[str]:
    pub = {**_W4_PUBLISHED, **(doc.get("published") or {})}
    loop = doc.get("plain_loop_rec_s")
    runs = doc["runs"]
    lines = [f"Windowed word count, Kafka to Kafka, {_n(doc.get('sentences'))} sentences; "
             "throughput counts input sentences/s. Same-run baseline: a plain single-process "
             f"Python word count (the per-record floor): **{_n(loop)} rec/s**. Published (single "
             f"thread): Storm {_n(pub['storm_rec_s'])} rec/s, Flink {_n(pub['flink_rec_s'])} "
             "rec/s.", ""]
    lines += _table(["parallelism", "guarantee", "state", "rayflow rec/s", "vs loop",
                     "vs Flink (pub.)", "vs Storm (pub.)", "p50 ms", "p99 ms", "checkpoints",
                     "checkpoint ms (median)", "checkpoint bytes"],
                    [[r["parallelism"], r["guarantee"], r["state_backend"], r["rec_s"],
                      _x(_ratio(r["rec_s"], loop)), _x(_ratio(r["rec_s"], pub["flink_rec_s"])),
                      _x(_ratio(r["rec_s"], pub["storm_rec_s"])), r.get("p50_ms"),
                      r.get("p99_ms"), r.get("checkpoints"), r.get("checkpoint_ms_median"),
                      r.get("checkpoint_handle_bytes")] for r in runs])
    eos, amo = doc.get("eos_vs_alo"), doc.get("amo_vs_alo")
    rdb, fs = doc.get("rocksdb_vs_memory"), doc.get("filesystem_vs_memory")
    lines += _table(["ratio", "rayflow", "published"], [
        ["exactly-once / at-least-once", _x(eos),
         f"Flink {_x(1 - pub['flink_eos_vs_alo_slowdown'])}"],
        ["at-most-once / at-least-once", _x(amo),
         f"Storm {_x(1 + pub['storm_amo_vs_alo_speedup'])}"],
        ["RocksDB / memory state", _x(rdb), f"Flink ~{_x(pub['flink_rocksdb_vs_memory'])}"],
        ["filesystem / memory state", _x(fs), "Flink ~1.00×"]])
    base = next((r for r in runs if r["parallelism"] == 1 and r["guarantee"] == "at_least_once"
                 and r["state_backend"] == "memory"), None)
    if base and base.get("rec_s") is not None:
        goal = min(pub["flink_rec_s"], 0.8 * loop) if loop else pub["flink_rec_s"]
        ctx.check("W4", "parallelism 1: ≥ min(43,000 rec/s, 80% of the plain loop)",
                  f"{_n(base['rec_s'])} rec/s (goal {_n(float(goal))})", base["rec_s"] >= goal)
    ctx.check("W4", "exactly-once within 6.3% of at-least-once", f"{_x(eos)}",
              None if eos is None else eos >= 1 - 0.063)
    ctx.check("W4", "RocksDB within 3× of the memory backend", f"{_x(rdb)}",
              None if rdb is None else rdb >= 1 / 3)
    rec = _find_number(doc, "recovery")
    ctx.check("W4", "back to full rate within 10 s after a failure",
              f"{_n(rec)} s" if rec is not None else "not in the benchmark's results",
              None if rec is None else rec <= 10)
    return lines


def _find_number(doc: dict, word: str) -> float | None:
    """Seconds under a key like ``<word>_s`` / ``<word>_time_s`` or ``<word>: {..._s}``.

    Inside a ``<word>`` dict only keys naming the time back to full rate count, so that e.g.
    a failure-free run time is never taken for the recovery time.
    """
    def num(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    for k, v in doc.items():
        if word in k and k.endswith("_s") and num(v):
            return float(v)
        if k == word and isinstance(v, dict):
            for k2, v2 in v.items():
                if k2.endswith("_s") and num(v2) and (word in k2 or "full_rate" in k2):
                    return float(v2)
    return None


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
             f"Published: {doc.get('published') or 'Blaze Cannon 57–68% faster than MLlib'}.", ""]
    lines += _table(["n", "ranks", "backend", "Cannon GFLOP/s", "shuffle GFLOP/s",
                     "numpy 1-thread GFLOP/s", "Cannon / shuffle (speed)",
                     "time saved vs shuffle (Blaze vs MLlib, pub.: 57–68%)", "time / numpy",
                     "time / mpi4py", "time / Dask", "Spark MLlib GFLOP/s", "Cannon / Spark (speed)",
                     "rel. error f64", "Σ rank RSS / data"],
                    [[str(r["n"]), r["ranks"], r["backend"], r["cannon_gflops"], r["shuffle_gflops"],
                      r["numpy_gflops"], _x(r.get("speedup_vs_shuffle")),
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
    cores = (doc.get("machine") or {}).get("logical_cores")
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
                  f"max abs diff {_n(rec.get('max_abs_diff'))}{when}; {rec.get('note', '')}).",
                  ""]
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
        npy = {r["n"]: r["numpy_gflops"] for r in rows}
        ax.plot(sorted(npy), [npy[n] for n in sorted(npy)], "k:s", label="numpy, 1 BLAS thread")
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
             f"Published: {doc.get('published') or 'Blaze CG 51–94% faster than Spark'}.", ""]
    lines += _table(["n", "ranks", "backend", "rayflow ms/it", "broadcast ms/it", "numpy ms/it",
                     "rayflow / broadcast (speed)", "time saved vs broadcast (Blaze vs Spark, pub.: 51–94%)",
                     "time / numpy", "mpi4py ms/it", "time / mpi4py", "Spark ms/it",
                     "rayflow / Spark (speed)", "rel. diff vs numpy", "max rank RSS MiB",
                     "matrix MiB"],
                    [[str(r["n"]), r["ranks"], r["backend"], r["rayflow_ms_per_it"],
                      r["broadcast_ms_per_it"], r["numpy_ms_per_it"],
                      _x(r.get("speedup_vs_broadcast")),
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
    peer = {r["n"]: r.get("vs_mpi4py_ratio") for r in gloo if r.get("vs_mpi4py_ratio")}
    if peer:
        goal = {4096: 1.5, 8192: 1.2}
        ok = all(v <= goal.get(n, 1.5) for n, v in peer.items())
        ctx.check("W6", "CG (gloo) within 1.5× (n = 4096) / 1.2× (n = 8192) of mpi4py CG",
                  ", ".join(f"n = {n}: {_x(v)}" for n, v in sorted(peer.items())), ok)
    else:
        ctx.check("W6", "CG (gloo) within 1.5× (n = 4096) / 1.2× (n = 8192) of mpi4py CG",
                  "mpi4py not in the results", None)
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
        width = 0.8 / len(series)
        for i, (label, vals) in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(ns))]
            ax.bar(xs, [vals.get(n, 0) for n in ns], width, label=label)
        ax.set_xticks(range(len(ns)), [f"n = {n}" for n in ns])
        ax.set(ylabel="ms per iteration (lower is better)", title="W6 conjugate gradient")

    return ctx.plots.draw("w6_cg", 1, fill)


# -- sections without a fixed shape -----------------------------------------------------------

def _flat(row: dict) -> dict:
    out: dict = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update({f"{k}.{k2}": v2 for k2, v2 in v.items() if not isinstance(v2, dict | list)})
        elif not isinstance(v, list):
            out[k] = v
    return out


def _generic(doc: dict, ctx: _Ctx) -> list[str]:
    lines: list[str] = []
    if doc.get("published"):
        lines += [f"Published: {doc['published']}", ""]
    scalars = {k: v for k, v in doc.items()
               if k not in _META_KEYS and not isinstance(v, dict | list)}
    lines += [f"- {k}: {_n(v)}" for k, v in scalars.items()]
    for k, v in doc.items():
        if k in _META_KEYS:
            continue
        if isinstance(v, dict):
            lines.append(f"- {k}: " + ", ".join(f"{k2} = {_n(v2)}" for k2, v2 in _flat(v).items()))
    lines.append("")
    for k, v in doc.items():
        if k not in _META_KEYS and isinstance(v, list) and v and all(isinstance(x, dict)
                                                                       for x in v):
            flat = [_flat(x) for x in v]
            cols = list(dict.fromkeys(c for f in flat for c in f))
            lines += [f"{k}:", ""] + _table(cols, [[f.get(c) for c in cols] for f in flat[:50]])
            if len(flat) > 50:
                lines += [f"({len(flat) - 50} more rows in the JSON.)", ""]
    name = str(doc.get("benchmark") or "")
    pngs = [ctx.results_dir / doc["plot"]] if doc.get("plot") else []
    pngs += sorted(p for p in ctx.results_dir.glob(f"{name}*.png") if p not in pngs) if name else []
    lines += [f"![{p.stem}]({ctx.link(p)})" for p in pngs if p.exists()]
    return lines + [""]


def _autoscale(doc: dict, ctx: _Ctx) -> list[str]:
    ctx.check("Autoscaling", "scale up to the needed nodes and back to the minimum within the "
              "idle timeout; no data lost across rescale", "see the section", None,
              status="reported")
    return _generic(doc, ctx)


def _stream_solve(doc: dict, ctx: _Ctx) -> list[str]:
    ctx.check("Streams + MPI stages", "exactly-once under failure, backpressure through the "
              "stage, gang reused across windows where faster", "see the section", None,
              status="reported")
    return _generic(doc, ctx)


# -- assembling ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    key: str  # the workload label used in the targets table
    title: str
    bench: str  # results/<bench>.json, `rayflow bench <bench>`
    render: Callable[[dict, _Ctx], list[str]]
    optional: bool = False  # only shown when results exist


_SPECS = [
    _Spec("W1", "W1 — Image stream, Gaussian blur (Storm vs IBM Streams)", "images", _w1),
    _Spec("W2", "W2 — Identity (Flink vs Storm)", "identity", _w2),
    _Spec("W3", "W3 — Sleep (Flink vs Storm)", "identity", _w3),
    _Spec("W4", "W4 — Windowed word count (Flink vs Storm)", "wordcount", _w4),
    _Spec("W5", "W5 — Cannon's matrix multiplication (Blaze: Spark + MPI)", "cannon", _w5),
    _Spec("W6", "W6 — Conjugate gradient (Blaze: Spark + MPI)", "cg", _w6),
    _Spec("Autoscaling", "Autoscaling", "autoscale", _autoscale, optional=True),
    _Spec("Streams + MPI stages", "Streams + MPI stages", "stream_solve", _stream_solve,
          optional=True),
]


def _load(results_dir: Path, bench: str) -> tuple[dict | None, Path | None, str | None]:
    """The full result if present, else the quick one: (doc, path, error)."""
    for name in (bench, f"{bench}_quick"):
        path = results_dir / f"{name}.json"
        if path.exists():
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                return None, path, f"{type(exc).__name__}: {exc}"
            if not isinstance(doc, dict):
                return None, path, "not a JSON object"
            return doc, path, None
    return None, None, None


def _section(spec: _Spec, ctx: _Ctx) -> list[str]:
    lines = [f"## {spec.title}", ""]
    doc, path, err = _load(ctx.results_dir, spec.bench)
    how = f"run `rayflow bench {spec.bench}`"
    if path is None:
        ctx.check(spec.key, "all targets", f"not yet measured: `rayflow bench {spec.bench}`", None)
        return lines + [f"_Not yet measured: {how}, then `rayflow report`._", ""]
    if err is not None:
        ctx.check(spec.key, "all targets", f"unreadable {path.name}", None)
        return lines + [f"_Could not read `{path.name}` ({err}); {how} again._", ""]
    lines += [f"Source: `{ctx.link(path)}`. " + _machine_line(doc), ""]
    if path.stem.endswith("_quick") or doc.get("quick"):
        lines += [f"> From a `--quick` run (small sizes, indicative only): {how} for the full "
                  "figures.", ""]
    before = len(ctx.checks)
    try:
        body = spec.render(doc, ctx)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as exc:
        del ctx.checks[before:]
        ctx.check(spec.key, "all targets", f"unexpected shape of {path.name}", None)
        return lines + [f"_`{path.name}` has an unexpected shape ({type(exc).__name__}: {exc}); "
                        f"{how} again with this version of rayflow._", ""]
    lines += body
    mine = ctx.checks[before:]
    met = [c.target for c in mine if c.status == "met"]
    missed = [c.target for c in mine if c.status == "missed"]
    open_ = [c.target for c in mine if c.status == "not measured"]
    if met or missed or open_:
        verdict = (f"**Targets:** {len(met)} met, {len(missed)} missed"
                   + (f", {len(open_)} not measured" if open_ else "") + ".")
        if missed:
            verdict += " Missed: " + "; ".join(missed) + "."
        if open_:
            verdict += " Not measured: " + "; ".join(open_) + "."
        lines += [verdict, ""]
    return lines


def _other_sections(ctx: _Ctx) -> list[str]:
    known = {s.bench for s in _SPECS} | {f"{s.bench}_quick" for s in _SPECS}
    paths = sorted(p for p in ctx.results_dir.glob("*.json") if p.stem not in known)
    full = {p.stem for p in paths}
    paths = [p for p in paths if not (p.stem.endswith("_quick") and p.stem[:-6] in full)]
    if not paths:
        return []
    lines = ["## Other results", ""]
    for path in paths:
        lines += [f"### {path.stem}", ""]
        try:
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            lines += [f"_Could not read `{path.name}` ({exc})._", ""]
            continue
        lines += [f"Source: `{ctx.link(path)}`. " + _machine_line(doc), ""]
        lines += _generic(doc, ctx)
    return lines


def generate(results_dir: Path, out_path: Path, plots_dir: Path) -> Path:
    """Write the benchmark report from the result files in ``results_dir``.

    Args:
        results_dir: the directory of ``<benchmark>.json`` files written by
            ``benchmarks/_common.py::write_result`` (``<name>_quick.json`` is used only when
            the full ``<name>.json`` is missing, and flagged as such).
        out_path: the Markdown file to write (``BENCHMARKS.md``).
        plots_dir: where the PNG plots go; the report links them by relative path.

    Returns:
        ``out_path``.

    Raises:
        RayflowError: ``results_dir`` does not exist.

    Example:
        >>> from pathlib import Path
        >>> generate(Path("benchmarks/results"), Path("BENCHMARKS.md"),
        ...          Path("benchmarks/results/plots"))  # doctest: +SKIP
        PosixPath('BENCHMARKS.md')
    """
    results_dir, out_path, plots_dir = Path(results_dir), Path(out_path), Path(plots_dir)
    if not results_dir.is_dir():
        raise RayflowError(f"no results directory {results_dir}: run `rayflow bench <name>` "
                           "first, or pass --results DIR")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    ctx = _Ctx(results_dir, out_path.parent, plots_dir, _Plotter(plots_dir))
    body: list[str] = []
    for spec in _SPECS:
        if spec.optional and _load(results_dir, spec.bench)[1] is None:
            continue
        body += _section(spec, ctx)
    body += _other_sections(ctx)

    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        "# rayflow benchmarks", "",
        f"Generated by `rayflow report` on {now} from `{ctx.link(results_dir)}/*.json`; "
        "regenerate it with `rayflow bench <name>` then `rayflow report`. The workloads are "
        "those of three published studies (W1–W6, described in [docs/workloads.md](docs/workloads.md)). Published figures "
        "came from other hardware: compare shapes and ratios with them, and read absolute "
        "figures against the baselines measured in the same run. Ratios are rayflow ÷ the "
        "other (for speeds: higher is better for rayflow; for times and latencies: lower). "
        "Targets are the project's own: the published figures, and peers and baselines "
        "measured in the same run.", "",
        "## Targets at a glance", "",
    ]
    mark = {"met": "met", "missed": "**missed**", "not measured": "not measured",
            "reported": "reported"}
    head += _table(["workload", "target", "measured", "status"],
                   [[c.workload, c.target, c.measured, mark[c.status]] for c in ctx.checks])
    counts = {s: sum(c.status == s for c in ctx.checks) for s in mark}
    head += [f"{counts['met']} met, {counts['missed']} missed, {counts['not measured']} not "
             f"measured, {counts['reported']} reported without a pass/fail bound.", ""]
    if not ctx.plots.available:
        head += ["_matplotlib is not installed: plots were skipped._", ""]
    out_path.write_text("\n".join(head + body).rstrip() + "\n")
    return out_path
