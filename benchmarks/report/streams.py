"""The stream workloads' sections: W1 images, W2 identity, W3 sleep, W4 word count and
W7 Nexmark."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import published
from .base import _Ctx, _n, _plot_line, _ratio, _table, _x

# -- W1 -----------------------------------------------------------------------------------------

def _w1_published(doc: dict) -> dict[int, tuple]:
    pub = doc.get("published")
    if isinstance(pub, dict) and pub:
        return {int(k): tuple(v) for k, v in pub.items()}
    return published.W1_IMAGES


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
        rs = [x for r in rows if sides(r["side"])
              if (x := _ratio(r[c]["throughput_img_s"], r["loop"]["img_s"])) is not None]
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
        two = [x for r in rows if r["side"] >= 400
               if (x := _ratio(r["loop"].get("two_process_img_s"), r["loop"]["img_s"]))
               is not None]
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

_SAME_CLOCK = ("Every system reads the same pre-filled topic and writes records carrying "
               "their own stamps: inTime when the record's batch was consumed (entry), outTime "
               "when it was handed to the producer (exit). From the output read back: **rec/s** "
               "= records / (last outTime − first inTime); **delivered** = records / (the "
               "final flush or commit returned − first inTime); start-up (first inTime − "
               "launch) apart. Systems run in interleaved rounds (A B A B …): medians, with the "
               "min–max over the rounds.")


def _mm(s: dict | None, digits: bool = False) -> str:
    """``median (min–max)`` of a summary."""
    if not s or s.get("median") is None:
        return "–"
    if s["rounds"] == 1:
        return _n(s["median"])
    return f"{_n(s['median'])} ({_n(s['min'])}–{_n(s['max'])})"


def _med(s: dict | None) -> float | None:
    return None if not s else s.get("median")


def _w2(doc: dict, ctx: _Ctx) -> list[str]:
    pub = {**published.W2_IDENTITY, **(doc.get("published") or {})}
    mem = doc["in_memory"]
    rounds = doc.get("rounds", 1)
    lines = ["Identity: each record `msgId,eventTime` gets an inTime stamp at entry and an "
             "outTime stamp at exit. Same-run baselines: a bare single-process Python loop "
             "doing the same two stamps, and a plain single-process consume → stamp → produce "
             "loop with the same Kafka client and settings (rayflow's: 16,384 records a batch, "
             "linger 5 ms), in a fresh process of its own, as the job's steps run. Published "
             f"(single thread): Storm {_n(pub['storm_rec_s'])} rec/s, Flink "
             f"{_n(pub['flink_rec_s'])} rec/s.", ""]
    lines += [f"In memory, parallelism 1 ({rounds} interleaved rounds; the job's span, first "
              "source batch to last write):", ""] + _table(
        ["variant", "rayflow rec/s", "bare loop rec/s", "rayflow / loop", "vs Flink (pub.)"],
        [["per-record Python function", _mm(mem["per_record_rec_s"]),
          _mm(mem["bare_loop_rec_s"]), _x(mem.get("per_record_vs_loop")),
          _x(_ratio(_med(mem["per_record_rec_s"]), pub["flink_rec_s"]))]])
    lines += ["No columnar figure: a columnar identity that hands one numpy array by reference "
              "down a chain of steps measures nothing.", ""]
    startup = _med(mem.get("startup_s"))
    if startup is not None:
        lines += [f"Job start-up on a running local Ray: {_n(startup)} s (median).", ""]
    kafka = doc.get("kafka") or []
    lines += ["Through Kafka (embedded broker), parallelism 1. " + _SAME_CLOCK, ""]
    rows = []
    for k in kafka:
        for r in k["systems"]:
            rows.append([k["client"], k["partitions"], k.get("records"), r["system"],
                         _mm(r.get("rec_s")), _x(r.get("vs_loop")), _mm(r.get("delivered_rec_s")),
                         _x(r.get("delivered_vs_loop")), _n(_med(r.get("startup_s"))),
                         _x(_ratio(_med(r.get("rec_s")), pub["flink_rec_s"]))])
    lines += _table(["client", "partitions", "records", "system", "rec/s", "vs plain loop",
                     "delivered rec/s", "delivered vs plain loop", "start-up s",
                     "vs Flink (pub.)"], rows)
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

    pr = mem.get("per_record_vs_loop")
    ctx.check("W2", "in memory, per-record function: ≥ 50% of the bare loop", _x(pr),
              None if pr is None else pr >= 0.5)
    for client in dict.fromkeys(k["client"] for k in kafka):
        ks = [(k, next(r for r in k["systems"] if r["system"] == "rayflow"))
              for k in kafka if k["client"] == client]
        for key, what in (("vs_loop", "last outTime"), ("delivered_vs_loop", "delivered")):
            rs = [r.get(key) for _, r in ks if r.get(key) is not None]
            ctx.check("W2", f"Kafka ({client}): ≥ 1.0× the plain loop, same client ({what})",
                      ", ".join(f"{_x(r.get(key))} ({k['partitions']} part.)" for k, r in ks),
                      min(rs) >= 1.0 if rs else None)
        best = max((_med(r.get("rec_s")) or 0) for _, r in ks)
        ctx.check("W2", f"Kafka ({client}): ≥ 100,000 rec/s", f"{_n(best)} rec/s (best median)",
                  best >= 100_000)
    for k in kafka:
        ours = next(r for r in k["systems"] if r["system"] == "rayflow")
        for r in k["systems"]:
            if r["system"] not in ("rayflow", "plain loop"):
                ctx.check("W2", f"beside {r['system']} ({k['client']}, {k['partitions']} "
                          "part.), same measurement",
                          f"{_x(_ratio(_med(ours.get('rec_s')), _med(r.get('rec_s'))))} rec/s, "
                          f"{_x(_ratio(_med(ours.get('delivered_rec_s')), _med(r.get('delivered_rec_s'))))}"
                          " delivered", None, status="reported")
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
    if startup is not None:
        ctx.check("W2", "job start-up on a running local Ray: a few seconds, reported",
                  f"{_n(startup)} s", None, status="reported")
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
    pub = {**published.W2_IDENTITY, **(doc.get("published") or {})}
    per_thread = pub["sleep_rec_s_per_thread"]
    rows = sorted(doc["sleep"], key=lambda r: r["parallelism"])
    lines = [f"Identity plus a 1 ms sleep per record: `source -> rebalance() -> map(sleep, "
             f"parallelism=p) -> sink`. Published: ~{per_thread} rec/s per thread for Storm "
             "and Flink, linear in parallelism. Sleeping does not need a core, so scaling is "
             "meaningful on a small machine.", ""]
    if doc.get("settings") == "defaults":
        lines += ["**At default settings**: no stream option is set (`batch_size` stays "
                  "16,384). A slow step scales because a channel sizes each batch by the "
                  "receiver's measured time per call (`stream.batch_target_s`, 0.1 s) and a "
                  "rebalance sends each part to the instance with the fewest records in "
                  "flight, a large batch's last part too.", ""]
    lines += ["`rec/s` is the job's own figure, records / (last write − first source batch), "
              "start-up excluded; `wall rec/s` is records / (job end − job start), start-up "
              "and teardown included.", ""]
    sleep_ms = doc.get("sleep_call_ms")
    if sleep_ms:
        lines += [f"On this machine one `time.sleep(0.001)` took {_n(sleep_ms)} ms (a bare "
                  f"loop, same run): at most {_n(1000 / sleep_ms)} rec/s per instance.", ""]
    lines += _table(["parallelism", "records", "rayflow rec/s", "per instance", "wall rec/s",
                     "start-up s", "published (~900 × p)", "per instance / 900",
                     "scaling efficiency"],
                    [[r["parallelism"], r.get("records"), r["rec_s"], r["rec_s_per_instance"],
                      r.get("wall_rec_s"), r.get("startup_s"), per_thread * r["parallelism"],
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
        ax.plot(ps, [r["rec_s"] for r in rows], "-o", label="rayflow (job figure)")
        if all(r.get("wall_rec_s") is not None for r in rows):
            ax.plot(ps, [r["wall_rec_s"] for r in rows], "-^", color="tab:orange",
                    label="rayflow, job start to end (start-up included)")
        ax.plot(ps, [rows[0]["rec_s_per_instance"] * p for p in ps], "k--",
                label="linear from parallelism 1")
        ax.plot(ps, [per_thread * p for p in ps], ":s", color="gray",
                label=f"published ~{per_thread} rec/s per thread")
        ax.set(xlabel="parallelism", ylabel="records/s",
               title="W3 sleep 1 ms: scaling, default settings")
        ax.set_xticks(ps, [str(p) for p in ps])
        ax.set_ylim(bottom=0)

    return ctx.plots.draw("w3_sleep", 1, fill)


# -- W4 -----------------------------------------------------------------------------------------

def _w4(doc: dict, ctx: _Ctx) -> list[str]:
    pub = {**published.W4_WORDCOUNT, **(doc.get("published") or {})}
    flink, storm = pub["flink_rec_s"], pub["storm_rec_s"]
    lines = [f"Windowed word count, Kafka to Kafka, {_n(doc.get('sentences'))} sentences of "
             f"{doc.get('data', 'text')}; throughput counts input sentences. Every system "
             "writes the same windows (count windows of 10 per word; the open ones close at the "
             "end of the input) and every word is counted once (checked from the output). "
             "Baseline: a plain single-process confluent-kafka loop (consume → parse → count "
             "→ produce) with rayflow's client settings. " + _SAME_CLOCK + " Published "
             f"(single thread, the study's own data): Storm {_n(storm)} rec/s, Flink "
             f"{_n(flink)} rec/s.", ""]

    def table(rows: list[dict], base: str) -> list[str]:
        return _table(["system", "processes", "rec/s", f"vs {base}", "delivered rec/s",
                       f"delivered vs {base}", "start-up s", "checkpoint ms (median)",
                       "vs Flink (pub.)"],
                      [[r["system"], _n(_med(r.get("processes"))) if r.get("processes") else
                        "1", _mm(r.get("rec_s")), _x(r.get("vs_base")),
                        _mm(r.get("delivered_rec_s")), _x(r.get("delivered_vs_base")),
                        _n(_med(r.get("startup_s"))), _n(_med(r.get("checkpoint_ms_median"))),
                        _x(_ratio(_med(r.get("rec_s")), flink))] for r in rows])

    scaling = doc.get("scaling") or []
    lines += ["Throughput and scaling (processes: the job's step actors; the plain loop and "
              "the peers are one process):", ""] + table(scaling, "plain loop")
    if doc.get("peers_note"):
        lines += [f"Peers: {doc['peers_note']}.", ""]
    if doc.get("machine_note"):
        lines += [f"This run's machine: {doc['machine_note']}", ""]
    guar = doc.get("guarantees") or []
    lines += ["Guarantees and state backends, parallelism 1, checkpoints every 0.5 s (the "
              "exactly-once sink's records are visible at its commits: its delivered figure "
              "holds them):", ""] + table(guar, "at-least-once")
    glong = doc.get("guarantees_long") or []
    long_n = doc.get("long_sentences")
    by_g, by_long = {r["system"]: r for r in guar}, {r["system"]: r for r in glong}
    if glong:
        lines += [f"Exactly-once and at-least-once again on {_n(long_n)} sentences: the "
                  "exactly-once sink writes each epoch once its checkpoint is durable, so "
                  "the epochs not yet written when the input ends are written after it: its "
                  f"delivered figure carries that end ({_end(by_g.get('exactly-once'))} s "
                  "after the last record "
                  f"left, at-least-once's final flush {_end(by_g.get('at-least-once'))} s, "
                  f"in the runs of {_n(doc.get('sentences'))} sentences above), which a run "
                  f"of {_n(_med((by_g.get('exactly-once') or {}).get('span_s')))} s cannot "
                  f"amortize and one of {_n(_med((by_long.get('exactly-once') or {}).get('span_s')))} "
                  "s does:", ""] + table(glong, "at-least-once")
    big = doc.get("million_words") or []
    if big:
        lines += ["A 10⁶-word vocabulary (Zipf): nearly every record reads and writes a key's "
                  "state:", ""] + table(big, "memory")
    kp = doc.get("kafka_python") or []
    if kp:
        lines += ["The pure-Python client, beside its own plain loop:", ""] + \
            table(kp, "plain loop (kafka-python)")
    eos, amo = doc.get("eos_vs_alo"), doc.get("amo_vs_alo")
    eos_long = doc.get("eos_vs_alo_long")
    rdb, fs = doc.get("rocksdb_vs_memory_1m_words"), doc.get("filesystem_vs_memory")
    flink_eos = f"Flink {_x(1 - pub['flink_eos_vs_alo_slowdown'])}"
    lines += _table(["ratio (medians)", "rayflow", "published"], [
        [f"exactly-once / at-least-once (delivered, {_n(doc.get('sentences'))} sentences)",
         _x(eos), flink_eos],
        *([[f"exactly-once / at-least-once (delivered, {_n(long_n)} sentences)",
            _x(eos_long), flink_eos]] if eos_long is not None else []),
        ["at-most-once / at-least-once", _x(amo),
         f"Storm {_x(1 + pub['storm_amo_vs_alo_speedup'])}"],
        ["RocksDB / memory state (10⁶ words)", _x(rdb),
         f"Flink ~{_x(pub['flink_rocksdb_vs_memory'])}"],
        ["filesystem / memory state", _x(fs), "Flink ~1.00×"]])
    by = {r["system"]: r for r in scaling}
    p1 = by.get("rayflow p1")
    if p1:
        ctx.check("W4", "parallelism 1 (one process): ≥ 1.0× the plain confluent loop",
                  f"{_x(p1.get('vs_base'))} ({_n(_med(p1.get('rec_s')))} rec/s), delivered "
                  f"{_x(p1.get('delivered_vs_base'))}",
                  None if p1.get("vs_base") is None else p1["vs_base"] >= 1.0)
        ps = [(int(name.split("p")[-1]), r) for name, r in by.items()
              if name.startswith("rayflow p") and name.split("p")[-1].isdigit()]
        ps.sort(key=lambda x: x[0])
        ok = all((_med(b.get("rec_s")) or 0) > (_med(a.get("rec_s")) or 0)
                 for (_, a), (_, b) in zip(ps, ps[1:]))
        ctx.check("W4", "throughput grows with parallelism", ", ".join(
            f"p{p}: {_n(_med(r.get('rec_s')))}" for p, r in ps), ok if len(ps) > 1 else None)
        ctx.check("W4", f"parallelism 1 beside Flink's published {_n(flink)} rec/s",
                  _x(_ratio(_med(p1.get("rec_s")), flink)), None, status="reported")
    for name, r in by.items():
        if not name.startswith(("rayflow", "plain")) and p1:
            ctx.check("W4", f"beside {name}, same measurement",
                      f"{_x(_ratio(_med(p1.get('rec_s')), _med(r.get('rec_s'))))} rec/s, "
                      f"{_x(_ratio(_med(p1.get('delivered_rec_s')), _med(r.get('delivered_rec_s'))))}"
                      " delivered (rayflow p1 / peer)", None, status="reported")
    if eos_long is None:
        ctx.check("W4", "exactly-once within 6.3% of at-least-once (delivered)", f"{_x(eos)}",
                  None if eos is None else eos >= 1 - 0.063)
    else:  # judged where the end of the input is not most of the difference
        ctx.check("W4", f"exactly-once within 6.3% of at-least-once (delivered, "
                  f"{_n(long_n)} sentences)",
                  f"{_x(eos_long)} ({_n(doc.get('sentences'))} sentences: {_x(eos)}, with "
                  f"{_end(by_g.get('exactly-once'))} s of commit after the last record)",
                  eos_long >= 1 - 0.063)
    ctx.check("W4", "RocksDB within 3× of the memory backend (10⁶ words)", f"{_x(rdb)}",
              None if rdb is None else rdb >= 1 / 3)
    rec = _find_number(doc, "recovery")
    ctx.check("W4", "back to full rate within 10 s after a failure",
              f"{_n(rec)} s" if rec is not None else "not in the benchmark's results",
              None if rec is None else rec <= 10)
    return lines


def _end(row: dict | None) -> str:
    """The median time from a run's last record out to its final flush or commit."""
    v = _med((row or {}).get("end_s"))
    return "–" if v is None else f"{v:.2f}"


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




# -- W7 -----------------------------------------------------------------------------------------

def _w7_flink(doc: dict) -> dict:
    """Flink's published per-core figures, as the result recorded them where it did."""
    return {**published.W7_FLINK_PER_CORE, **(doc.get("flink_per_core") or {})}


def _checkpoints(rows: list[dict]) -> str:
    """How many checkpoints the runs of ``rows`` completed: "1 checkpoint", "1-2
    checkpoints"."""
    got = [x["checkpoints"] for r in rows for x in r.get("runs", ()) if "checkpoints" in x]
    if not got:
        return "an unrecorded number of checkpoints"
    lo, hi = min(got), max(got)
    span = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"{span} checkpoint{'' if span == '1' else 's'}"


def _w7(doc: dict, ctx: _Ctx) -> list[str]:
    flink = _w7_flink(doc)
    rows = doc["rows"]
    lines = ["Nexmark queries behind a generator source (events made inside the job, as Flink's "
             "Nexmark source makes them), parallelism 1, exactly-once checkpoints every second, "
             f"into a discarding sink (a run of the table completed {_checkpoints(rows)}, the "
             "one at the end of the input included: what checkpoints cost is measured on "
             "longer runs, below). "
             "Per core = events / CPU seconds of the driver and every "
             "worker process of the job. Same-run baseline: the same events and query in one "
             "plain Python process (the COST floor; its CPU includes freeing its events, as "
             "the job's includes freeing each batch). Published: Flink 1.13 per core (the "
             "Nexmark suite's README, 8 cores × 3 workers, 100 M events per query, with its "
             "network stack and serialization in the path). The CPU counted is that of the "
             "driver and the job's workers (its actors' processes and theirs), not of Ray's "
             "raylet, GCS, object store, agents or the idle workers Ray keeps in its pool, nor "
             "that of the meter's own sampling thread in the driver."
             + (f" Figures are medians of {doc['runs_per_config']} interleaved rounds (each "
                "round runs the plain loop and every configuration of the query once)."
                if doc.get("runs_per_config") else ""), ""]

    def start_up(r: dict) -> float | None:  # median over the runs, when they say
        ts = sorted(x["start_s"] for x in r.get("runs") or () if isinstance(x, dict)
                    and x.get("start_s") is not None)
        return ts[len(ts) // 2] if ts else None

    bytewax = any(r.get("bytewax_per_core") for r in rows)
    lines += _table(["query", "state", "guarantee", "path", "events", "events/s", "cores",
                     "rayflow per core", "plain per core", "rayflow / plain",
                     "Flink per core (pub.)", "rayflow / Flink"]
                    + (["Bytewax per core", "rayflow / Bytewax"] if bytewax else [])
                    + ["start-up s", "peak MiB"],
                    [[r["query"], r.get("backend"), _guarantee(r), r.get("path"),
                      r.get("events"), r.get("events_s"), r.get("cores"), r["per_core"],
                      r.get("plain_per_core"),
                      _x(_ratio(r["per_core"], r.get("plain_per_core"))),
                      flink.get(r["query"]),
                      _x(_ratio(r["per_core"], flink.get(r["query"])))]
                     + ([r.get("bytewax_per_core"),
                         _x(_ratio(r["per_core"], r.get("bytewax_per_core")))]
                        if bytewax else [])
                     + [start_up(r), r.get("peak_rss_mib")]
                     for r in rows])
    if bytewax:
        lines += ["", "Bytewax: the same events and the query with its own operators and "
                  "rayflow's functions, one worker in a process of its own, in the same rounds. "
                  "q0-q2 run record by record there, on Arrow batches in rayflow; q18 and q19 "
                  "run the same per-key function once per key and batch in both (Bytewax's "
                  "`stateful_batch`, rayflow's `stateful_map_batches`)."]
    # Flink's figures are exactly-once runs: the at-least-once rows are the checkpoint
    # cost's baseline, not a configuration to set beside them
    rows = [r for r in rows if _guarantee(r) == "exactly_once"]
    lines += _plot_line(ctx, _plot_w7(ctx, rows, flink), "W7 Nexmark events/s per core")
    lines += _w7_checkpoint_cost(doc, ctx) + _w7_long(doc, ctx)
    vs = [(r["query"], r.get("backend"), _ratio(r["per_core"], flink.get(r["query"])))
          for r in rows]
    vs = [v for v in vs if v[2] is not None]
    if vs:
        below = [f"{q} ({b}): {_x(x)}" for q, b, x in vs if x < 1]
        ctx.check("W7", "events/s per core beside Flink's published per-core figures",
                  f"{len(vs) - len(below)} of {len(vs)} at or above Flink"
                  + (f"; below: {', '.join(below)}" if below else ""), None, status="reported")
    floor = [(r["query"], _ratio(r["per_core"], r.get("plain_per_core"))) for r in rows]
    floor = [f for f in floor if f[1] is not None]
    if floor:
        ctx.check("W7", "events/s per core beside the one-process plain floor (COST)",
                  f"{_x(min(x for _, x in floor))}–{_x(max(x for _, x in floor))} of the floor",
                  None, status="reported")
    return lines


def _guarantee(r: dict) -> str:
    return r.get("guarantee") or "exactly_once"


def _w7_checkpoint_cost(doc: dict, ctx: _Ctx) -> list[str]:
    """Exactly-once on RocksDB beside at-least-once on the memory backend, per query that
    ran both: what checkpoints and the durable state cost. From the runs made for it
    (``checkpoint_cost``: longer, with several checkpoints each) where the result has them,
    else from the table's rows."""
    cost = doc.get("checkpoint_cost") or {}
    rows = cost.get("rows") or doc["rows"]

    def find(q: str, backend: str, guarantee: str) -> dict | None:
        return next((r for r in rows if r["query"] == q and r.get("backend") == backend
                     and _guarantee(r) == guarantee), None)

    found = []
    for q in dict.fromkeys(r["query"] for r in rows):
        eo, alo = find(q, "rocksdb", "exactly_once"), find(q, "memory", "at_least_once")
        if eo is not None and alo is not None:
            found.append((q, eo, find(q, "memory", "exactly_once"), alo))
    if not found:
        return []
    ratios = [(q, _ratio(eo["per_core"], alo["per_core"])) for q, eo, _, alo in found]
    short = [r for r in doc["rows"] if r["query"] in {q for q, *_ in found}]
    ctx.check("W7", "exactly-once on RocksDB within 10% of at-least-once on memory (per core)",
              ", ".join(f"{q} {_x(x)}" for q, x in ratios)
              + (f" (runs of {found[0][1].get('events'):,} events)" if cost.get("rows")
                 else ""),
              all(x is not None and x >= 0.9 for _, x in ratios))
    if not cost.get("rows"):
        return ["", "What checkpoints cost, per core: exactly-once with RocksDB ÷ "
                "at-least-once with the memory backend (the target is 0.9× or more).",
                ""] + _table(["query", "exactly-once, RocksDB", "at-least-once, memory",
                              "ratio"],
                             [[q, eo["per_core"], alo["per_core"],
                               _x(_ratio(eo["per_core"], alo["per_core"]))]
                              for q, eo, _, alo in found])
    return ["", f"What checkpoints cost, per core, on runs of {cost.get('factor')}× the "
            "events of the table's stateful runs (checkpoints every "
            f"{cost.get('interval_s', 1.0):g} s; a run of these queries in the table "
            f"completed {_checkpoints(short)}): exactly-once with RocksDB ÷ "
            "at-least-once with the "
            "memory backend (the target is 0.9× or more), and exactly-once with the memory "
            "backend beside them. Checkpoints: the median number a run completed, the one at "
            "the end of the input included.", ""] + _table(
        ["query", "events", "checkpoints", "exactly-once, RocksDB", "exactly-once, memory",
         "at-least-once, memory", "RocksDB EO ÷ memory ALO", "memory EO ÷ memory ALO"],
        [[q, eo.get("events"), eo.get("checkpoints"), eo["per_core"],
          meo and meo["per_core"], alo["per_core"],
          _x(_ratio(eo["per_core"], alo["per_core"])),
          _x(_ratio(meo and meo["per_core"], alo["per_core"]))]
         for q, eo, meo, alo in found])


def _w7_long(doc: dict, ctx: _Ctx) -> list[str]:
    """Peak memory of the windowed queries on a run ``long_factor`` times longer."""
    long_rows, factor = doc.get("long") or [], doc.get("long_factor")
    if not long_rows:
        return []
    growth = [(r["query"], r.get("growth")) for r in long_rows]
    ctx.check("W7", f"state bounded: peak memory on {factor}× the events (q5, q8, q11)",
              ", ".join(f"{q} {_x(g)}" for q, g in growth), None, status="reported")
    return ["", f"State over a run {factor}× longer (memory backend, exactly-once), on events "
            "that span many windows (10 k events per second of event time, where the runs "
            "above span under a second of it, inside one 10-second window): the peak "
            "resident memory of the job's worker processes, summed (psutil, sampled every "
            "50 ms; each process's interpreter included, Ray's idle pooled workers not). "
            "State that grew with the events would show as growth.", ""] + _table(
        ["query", "events", "event time s", "peak MiB", f"events ×{factor}", "peak MiB",
         "growth"],
        [[r["query"], r["events"], r.get("event_time_s"), r["peak_rss_mib"], r["long_events"],
          r["long_peak_rss_mib"], _x(r.get("growth"))] for r in long_rows])


def _w7_kafka(doc: dict, ctx: _Ctx) -> list[str]:
    """The queries through Kafka, beside a plain loop reading the same topic."""
    rows, flink = doc["rows"], _w7_flink(doc)
    floor = [(r["query"], _ratio(r["per_core"], r.get("plain_per_core"))) for r in rows]
    floor = [(q, x) for q, x in floor if x is not None]
    if floor:
        ctx.check("W7 Kafka", "events/s per core beside a plain loop reading the same topic",
                  ", ".join(f"{q} {_x(x)}" for q, x in floor), None, status="reported")
    return ["The W7 queries on the same events, pre-filled as JSON into a Kafka topic of one "
            "partition on the embedded broker, read to its end by a bounded KafkaSource "
            "(confluent-kafka) and decoded to event dicts (the rows path), parallelism 1, "
            "exactly-once checkpoints every second on the memory backend. Per core as in W7. "
            "Baseline: one plain process that reads the same topic with the same client and "
            "settings, decodes the same JSON and runs the query's plain-Python reference (which "
            "also sorts its output; its CPU includes freeing the events), in interleaved rounds. Flink's published figures read "
            "from an in-process generator, not from Kafka.", ""] + _table(
        ["query", "events", "events/s", "cores", "rayflow per core", "plain per core",
         "rayflow / plain", "Flink per core (pub.)", "rayflow / Flink"],
        [[r["query"], r.get("events"), r.get("events_s"), r.get("cores"), r["per_core"],
          r.get("plain_per_core"), _x(_ratio(r["per_core"], r.get("plain_per_core"))),
          flink.get(r["query"]), _x(_ratio(r["per_core"], flink.get(r["query"])))]
         for r in rows])


def _plot_w7(ctx: _Ctx, rows: list[dict], flink: dict) -> Path | None:
    labels = [f"{r['query']}" + (f" ({r['backend']})" if r.get("backend") != "memory" else "")
              for r in rows]

    def fill(ax):
        series = [("rayflow", [r["per_core"] for r in rows]),
                  ("plain Python, one process", [r.get("plain_per_core") or float("nan")
                                                 for r in rows]),
                  ("Bytewax, one worker", [r.get("bytewax_per_core") or float("nan")
                                           for r in rows]),
                  ("Flink 1.13 (published)", [flink.get(r["query"], float("nan"))
                                              for r in rows])]
        width = 0.8 / len(series)
        for i, (label, vals) in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
            ax.bar(xs, vals, width, label=label)
        ax.set_xticks(range(len(rows)), labels, rotation=45, ha="right")
        ax.set(ylabel="events/s per core", yscale="log", title="W7 Nexmark per core")

    return ctx.plots.draw("w7_nexmark", 1, fill)


# the RocksDB backend as a job runs it keeps recently used entries in memory: 1 k keys fit
# its cache, 1 M do not; without the cache every batch reads and writes RocksDB
_KEYS_BACKEND_LABEL = {"rocksdb": "rocksdb with its entry cache (1 k keys fit it, 1 M do not)",
                       "rocksdb-nocache": "rocksdb, cache off",
                       "memory-arrow": "memory, Arrow batches (windows kept as columns)",
                       "filesystem-arrow": "filesystem, Arrow batches (windows kept as "
                                           "columns)",
                       "rocksdb-arrow": "rocksdb, Arrow batches (windows kept as columns, "
                                        "written at checkpoints)"}


def other_checks(name: str, doc: dict, ctx: _Ctx) -> None:
    """Targets of the results that have no section of their own: keyed state at scale
    (``keys``) and checkpoint duration (``checkpoint``)."""
    if name == "keys" and not doc.get("quick"):
        rows = [r for r in doc.get("rows", []) if r.get("series") == "same density"]
        for backend in dict.fromkeys(r["backend"] for r in rows):
            mine = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["keys"])
            if len(mine) < 2 or mine[0]["keys"] > 1000 or mine[-1]["keys"] < 1_000_000:
                continue
            lo, hi = mine[0], mine[-1]
            ratio = hi["records_s"] / lo["records_s"]
            # the plain loop's own slope over the same keys: what the machine's caches cost
            plain = _ratio(hi.get("plain_records_s"), lo.get("plain_records_s"))
            rounds = f", medians of {lo['rounds']} rounds" if lo.get("rounds") else ""
            label = _KEYS_BACKEND_LABEL.get(backend, backend)
            ctx.check("Keyed state", f"tumbling windows, {label}: records/s at 1 M keys "
                      f"within 2× of 1 k keys (same density)",
                      f"{ratio:.3f}× ({_n(lo['records_s'])} → {_n(hi['records_s'])} rec/s"
                      f"{rounds}; the plain loop: {_x(plain)})", ratio >= 0.5)
    if name == "checkpoint" and isinstance(doc.get("aligned"), dict):
        med, p90 = doc["aligned"].get("median_s"), doc["aligned"].get("p90_s")
        interval = doc.get("interval_s")
        if med is not None and interval:
            ctx.check("Checkpoints", f"exactly-once word count at full load, defaults: median "
                      f"checkpoint under the {interval} s interval",
                      f"median {med:.2f} s, p90 {p90:.2f} s", med < interval)
