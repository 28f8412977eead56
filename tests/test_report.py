"""The benchmark report (benchmarks/report/, run by ``rayflow report`` from a checkout):
sections, ratios, machine lines, plots and missing results (no Ray)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from rayflow.cli import checkout_report, main
from rayflow.errors import RayflowError

ROOT = Path(__file__).resolve().parents[1]
REPORT = checkout_report(ROOT)
generate = REPORT.generate

MACHINE = {"cpu_model": "AMD EPYC", "logical_cores": 2, "physical_cores": 2, "memory_gib": 23.5,
           "loadavg_1m": 3.5, "python": "3.11.7", "platform": "Linux"}
DATE = "2026-11-30T15:30:04+00:00"


def _doc(name: str, **payload) -> dict:
    return {"benchmark": name, "date": DATE, "machine": MACHINE, **payload}


def _images() -> dict:
    def run(img_s: float, uss: float) -> dict:
        return {"images_written": 10, "throughput_img_s": img_s, "ceiling_img_s": 2 * img_s,
                "vs_loop": None, "step_ms_per_image": {"read": 0.1, "decode": 1.0, "blur": 0.5,
                                                       "write": 1.0},
                "memory": {"uss_peak_above_idle_mb": uss, "object_store_peak_mb": 12.0}}

    rows = [{"side": 50, "n": 10, "loop": {"img_s": 3000.0, "ms": {}},
             "p1": run(2400.0, 100.0), "both": run(4000.0, 110.0)},
            {"side": 1200, "n": 10, "loop": {"img_s": 17.5, "ms": {}},
             "p1": run(18.0, 120.0), "both": run(34.0, 130.0)}]
    return _doc("images", n=10, sizes=[50, 1200], rows=rows,
                configs={"p1": {"readers": 1, "blur_parallelism": 1, "writers": 1},
                         "both": {"readers": 2, "blur_parallelism": 2, "writers": 2}},
                published={"50": [220, 165, 1002, 1186], "1200": [580, 200, 14.4, 5.91]})


def _summary(median: float, lo: float, hi: float) -> dict:
    return {"median": median, "min": lo, "max": hi, "rounds": 3}


def _identity(quick: bool = False) -> dict:
    lat = [{"path": path, "load": load, "rate": 1000, "samples": 100, "p50_ms": p50,
            "p90_ms": p50, "p99_ms": 2 * p50, "max_ms": 3 * p50, "achieved_rec_s": 990}
           for path in ("memory", "kafka/confluent") for load, p50 in ((0.5, 5.0), (0.9, 80.0))]
    return _doc("identity_quick" if quick else "identity", quick=quick,
                published={"storm_rec_s": 87000, "flink_rec_s": 350000,
                           "storm_latency_ms": {"p50": 100, "p99": 700},
                           "flink_latency_ms": {"p50": 50, "p99": 300},
                           "sleep_rec_s_per_thread": 900},
                rounds=3,
                in_memory={"per_record_rec_s": _summary(862_369, 850_000, 870_000),
                           "bare_loop_rec_s": _summary(1_669_836, 1_600_000, 1_700_000),
                           "per_record_vs_loop": 0.516, "startup_s": _summary(2.74, 2.5, 3.0)},
                kafka=[{"client": "confluent", "partitions": 1, "records": 600000, "systems": [
                    {"system": "plain loop", "rec_s": _summary(183_451, 180_000, 190_000),
                     "delivered_rec_s": _summary(170_000, 160_000, 175_000),
                     "startup_s": _summary(0.3, 0.2, 0.4), "vs_loop": 1.0,
                     "delivered_vs_loop": 1.0},
                    {"system": "rayflow", "rec_s": _summary(194_665, 190_000, 199_000),
                     "delivered_rec_s": _summary(161_500, 150_000, 170_000),
                     "startup_s": _summary(1.2, 1.1, 1.3), "vs_loop": 1.061,
                     "delivered_vs_loop": 0.95},
                    {"system": "bytewax (1 worker)", "rec_s": _summary(97_332, 90_000, 99_000),
                     "delivered_rec_s": _summary(80_750, 80_000, 81_000),
                     "startup_s": _summary(1.0, 0.9, 1.1), "vs_loop": 0.53,
                     "delivered_vs_loop": 0.475}]}],
                latency=lat,
                sleep=[{"parallelism": p, "records": 100, "rec_s": 880 * p,
                        "rec_s_per_instance": 880, "scaling_efficiency": 1.0} for p in (1, 8)])


def _cannon() -> dict:
    rows = [{"n": n, "ranks": 4, "backend": "ray", "cannon_s": 1.0, "cannon_gflops": g,
             "shuffle_s": 1.5, "shuffle_gflops": g / 1.5, "numpy_1thread_s": 1.0,
             "numpy_gflops": 50.0, "speedup_vs_shuffle": 1.5, "improvement_vs_shuffle_pct": 33.3,
             "vs_numpy_time_ratio": 0.8, "rel_error_f64": 1e-15, "max_rank_rss_mib": 350.0,
             "sum_rank_rss_over_data": 10.0} for n, g in ((1024, 30.0), (2048, 60.0))]
    return _doc("cannon", rows=rows, gang_starts=[{"gang_start_s": 4.4, "backend": "ray",
                                                   "ranks": 4}],
                recovery={"n": 1024, "ranks": 4, "failure_free_s": 8.7,
                          "with_killed_rank_s": 12.1, "ratio": 1.393, "attempts": 2,
                          "max_abs_diff": 0.0, "note": "fresh gangs"},
                blas_kernel=["SkylakeX"], peers={"mpi4py": False, "dask": False},
                published="Blaze Cannon 57-68% faster than Spark MLlib")


def _cg() -> dict:
    rows = [{"n": n, "ranks": 2, "backend": b, "iterations": 30, "rayflow_ms_per_it": ms,
             "broadcast_ms_per_it": 12.6, "numpy_ms_per_it": 6.3,
             "speedup_vs_broadcast": round(12.6 / ms, 3),
             "improvement_vs_broadcast_pct": round(100 * (12.6 - ms) / 12.6, 1),
             "vs_numpy_ratio": ms / 6.3, "rel_diff_vs_numpy_x": 3e-16, "max_rank_rss_mib": 400.0,
             "matrix_mib": 128.0} for n in (4096,) for b, ms in (("ray", 12.0), ("gloo", 10.0))]
    return _doc("cg", rows=rows, published="Blaze CG 51-94% faster",
                collective_latency=[{"backend": b, "ranks": 2, "allreduce_scalar_ms": s,
                                     "allreduce_8MiB_ms": 10 * s}
                                    for b, s in (("ray", 1.9), ("gloo", 0.7))])


def _sleep() -> dict:
    return _doc("sleep", published={"sleep_rec_s_per_thread": 900}, settings="defaults",
                sleep_call_ms=1.08,
                sleep=[{"parallelism": p, "records": 100, "rec_s": 880 * p,
                        "rec_s_per_instance": 880, "wall_rec_s": 500 * p, "startup_s": 2.0,
                        "scaling_efficiency": 1.0} for p in (1, 8)])


def _write(d: Path, docs: list[dict]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (d / f"{doc['benchmark']}.json").write_text(json.dumps(doc))
    return d


def _section(md: str, title_start: str) -> str:
    m = re.search(rf"^## {re.escape(title_start)}.*?(?=^## |\Z)", md, re.S | re.M)
    assert m, f"no section {title_start!r}"
    return m.group(0)


@pytest.fixture(scope="module")
def full_report(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("repo")
    results = _write(root / "benchmarks" / "results",
                     [_images(), _identity(), _sleep(), _cannon(), _cg()])
    out = generate(results, root / "BENCHMARKS.md", results / "plots")
    return root, out.read_text()


def test_sections_ratios_and_machine_lines(full_report):
    _, md = full_report
    for w in ("W1", "W2", "W3", "W4", "W5", "W6"):
        assert f"\n## {w} " in md
    assert "## Targets at a glance" in md
    assert "Autoscaling" not in md and "Streams + MPI stages" not in md
    w1 = _section(md, "W1")
    assert "p1 / loop" in w1 and "Storm (pub.)" in w1 and "1,002" in w1
    assert "0.80×" in w1  # 2400 / 3000 at 50 px
    w2 = _section(md, "W2")
    assert "rayflow / loop" in w2 and "vs Flink" in w2 and "1.06×" in w2
    assert "p99 / Flink p99" in w2
    # medians with the min-max of the interleaved rounds, the same measurement for all
    assert ("| confluent | 1 | 600,000 | rayflow | 194,665 (190,000–199,000) | 1.06× | "
            "161,500 (150,000–170,000) | 0.95× | 1.2 | 0.56× |") in w2
    assert "| bytewax (1 worker) | 97,332 (90,000–99,000) | 0.53× |" in w2
    w3 = _section(md, "W3")
    assert "results/sleep.json`" in w3 and "**At default settings**" in w3
    assert "| 8 | 100 | 7,040 | 880 | 4,000 | 2 | 7,200 | 0.98× | 100% |" in w3
    assert "took 1.08 ms" in w3 and "at most 926 rec/s per instance" in w3
    w5 = _section(md, "W5")
    assert "Cannon / shuffle" in w5 and "57–68%" in w5 and "1.50×" in w5
    assert "SkylakeX" in w5 and "1.39×" in w5
    w6 = _section(md, "W6")
    assert "rayflow / broadcast" in w6 and "1.26×" in w6  # 12.6 / 10.0 with gloo
    for w in ("W1", "W2", "W3", "W5", "W6"):
        sec = _section(md, w)
        assert "**Machine:** 2 logical cores (2 physical), AMD EPYC" in sec
        assert "load average 3.5" in sec and "2026-11-30 15:30 UTC" in sec
        assert "above the core count" in sec  # 3.5 > 2 cores: the run shared the machine


def test_targets_are_judged(full_report):
    _, md = full_report
    glance = _section(md, "Targets at a glance")
    assert re.search(r"\| W3 \| ≥ 900 rec/s per instance \| min 880 rec/s \| \*\*missed\*\* \|",
                     glance)
    # a columnar identity that hands one array down a chain measures nothing: no such target
    assert "columnar" not in glance
    assert "No columnar figure" in _section(md, "W2")
    assert "columnar (numpy) batches" not in _section(md, "W2")
    assert re.search(r"\| W6 \| CG \(gloo\) ≥ 10× faster [^|]+ \| 1.26×–1.26× \(gloo\) \| "
                     r"\*\*missed\*\* \|", glance)
    assert re.search(r"\| W1 \| peak memory at 1200 px ≤ 1.5× that at 50 px \(p1\) \| 1.20× "
                     r"[^|]+ \| met \|", glance)
    assert "mpi4py and dask not installed" in glance
    assert "**Targets:** 1 met, 1 missed. Missed: ≥ 900 rec/s per instance." in _section(md, "W3")


def test_missing_workload_says_not_yet_measured(full_report):
    _, md = full_report
    w4 = _section(md, "W4")
    assert "Not yet measured: run `rayflow bench wordcount`" in w4
    assert "not yet measured: `rayflow bench wordcount`" in _section(md, "Targets at a glance")


def test_plots_are_written_and_linked(full_report):
    root, md = full_report
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert {Path(p).name for p in links} == {"w1_images.png", "w2_latency.png", "w3_sleep.png",
                                             "w5_cannon.png", "w6_cg.png"}
    for link in links:
        assert not Path(link).is_absolute() and link.startswith("benchmarks/results/plots/")
        png = root / link
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_empty_results_dir_and_existing_w1_plot(tmp_path):
    results = _write(tmp_path / "results", [])
    md = generate(results, tmp_path / "B.md", results / "plots").read_text()
    for bench in ("images", "identity", "sleep", "wordcount", "cannon", "cg"):
        assert f"Not yet measured: run `rayflow bench {bench}`" in md
    assert not (results / "plots").exists()

    doc = {**_images(), "plot": "images.png"}
    _write(results, [doc])
    (results / "images.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    md = generate(results, tmp_path / "B.md", results / "plots").read_text()
    assert "](results/images.png)" in _section(md, "W1")
    assert not (results / "plots" / "w1_images.png").exists()


def test_quick_only_when_full_missing(tmp_path):
    results = _write(tmp_path, [_identity(quick=True)])
    md = generate(results, tmp_path / "B.md", tmp_path / "plots").read_text()
    assert "Source: `identity_quick.json`" in _section(md, "W2")
    assert "From a `--quick` run" in _section(md, "W2")
    _write(results, [_identity()])
    md = generate(results, tmp_path / "B.md", tmp_path / "plots").read_text()
    assert "Source: `identity.json`" in _section(md, "W2")
    assert "--quick" not in _section(md, "W2")


def test_odd_files_do_not_stop_the_report(tmp_path):
    results = _write(tmp_path, [_doc("cg", rows=[{"n": 1}]),
                                _doc("autoscale", idle_timeout_s=60, scale_down_s=71.5,
                                     timeline=[{"t_s": 0, "nodes": 1}, {"t_s": 30, "nodes": 3}]),
                                _doc("tiling", peak_mb=512)])
    (results / "wordcount.json").write_text("{not json")
    md = generate(results, tmp_path / "B.md", tmp_path / "plots").read_text()
    assert "has an unexpected shape" in _section(md, "W6")
    assert "Could not read `wordcount.json`" in _section(md, "W4")
    auto = _section(md, "Autoscaling")
    assert "scale_down_s: 71.5" in auto and "| t_s | nodes |" in auto
    assert "peak_mb: 512" in _section(md, "Other results")


def test_generate_raises_on_missing_dir(tmp_path):
    with pytest.raises(RayflowError, match="no results directory"):
        generate(tmp_path / "nope", tmp_path / "B.md", tmp_path / "plots")


def test_cli_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner()
    res = r.invoke(main, ["report"])  # not a checkout: no benchmarks/report/ here
    assert res.exit_code == 1
    assert f"{tmp_path} is not one: run it from the checkout's root" in res.output
    assert "Traceback" not in res.output
    shutil.copytree(ROOT / "benchmarks" / "report", tmp_path / "benchmarks" / "report")
    res = r.invoke(main, ["report"])
    assert res.exit_code == 1
    assert "error: no results directory benchmarks/results" in res.output
    assert "Traceback" not in res.output
    _write(tmp_path / "benchmarks" / "results", [_identity()])
    res = r.invoke(main, ["report"])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "BENCHMARKS.md").read_text()
    assert "Source: `benchmarks/results/identity.json`" in md
    assert (tmp_path / "benchmarks" / "results" / "plots" / "w2_latency.png").exists()
    res = r.invoke(main, ["report", "--results", "benchmarks/results", "--out", "x/R.md"])
    assert res.exit_code == 0 and (tmp_path / "x" / "R.md").exists()
    assert "report" in r.invoke(main, ["--help"]).output


def test_wordcount_section(tmp_path):
    def row(system, rec, delivered, vs, dvs, **kw):
        return {"system": system, "rec_s": _summary(rec, 0.9 * rec, 1.1 * rec),
                "delivered_rec_s": _summary(delivered, 0.9 * delivered, 1.1 * delivered),
                "startup_s": _summary(1.5, 1.4, 1.6), "vs_base": vs, "delivered_vs_base": dvs,
                **kw}
    scaling = [row("plain loop", 40_000, 39_000, 1.0, 1.0),
               row("rayflow p1", 30_000, 29_000, 0.75, 0.744,
                   processes=_summary(1, 1, 1)),
               row("rayflow p2", 50_000, 48_000, 1.25, 1.23, processes=_summary(3, 3, 3)),
               row("bytewax (1 worker)", 20_000, 19_000, 0.5, 0.49)]
    guar = [row("at-least-once", 30_000, 29_000, 1.0, 1.0),
            row("exactly-once", 29_000, 27_840, 0.967, 0.96,
                checkpoint_ms_median=_summary(12.5, 10, 15))]
    doc = _doc("wordcount", quick=False, sentences=1000, rounds=3, data="Zipf text",
               scaling=scaling, guarantees=guar, million_words=[
                   row("memory", 20_000, 19_000, 1.0, 1.0),
                   row("rocksdb", 6_000, 5_700, 0.3, 0.3)],
               published={"storm_rec_s": 12000, "flink_rec_s": 43000,
                          "flink_eos_vs_alo_slowdown": 0.063, "storm_amo_vs_alo_speedup": 0.168,
                          "flink_rocksdb_vs_memory": 0.1},
               eos_vs_alo=0.96, amo_vs_alo=None, rocksdb_vs_memory_1m_words=0.3,
               filesystem_vs_memory=None, recovery={"failure_free_s": 9.0,
                                                    "back_to_full_rate_s": 4.5})
    results = _write(tmp_path, [doc])
    md = generate(results, tmp_path / "B.md", tmp_path / "plots").read_text()
    w4 = _section(md, "W4")
    assert "plain single-process confluent-kafka loop" in w4 and "interleaved rounds" in w4
    assert ("| rayflow p1 | 1 | 30,000 (27,000–33,000) | 0.75× | 29,000 (26,100–31,900) | "
            "0.74× | 1.5 | – | 0.70× |") in w4
    assert "| exactly-once / at-least-once (delivered, 1,000 sentences) | 0.96× | Flink 0.94× |" \
        in w4
    glance = _section(md, "Targets at a glance")
    assert re.search(r"\| W4 \| parallelism 1 \(one process\): ≥ 1.0× the plain confluent loop "
                     r"\| 0.75× \(30,000 rec/s\), delivered 0.74× \| \*\*missed\*\* \|", glance)
    assert re.search(r"\| W4 \| throughput grows with parallelism \| p1: 30,000, p2: 50,000 \| "
                     r"met \|", glance)
    assert re.search(r"\| W4 \| beside bytewax \(1 worker\), same measurement \| 1.50× rec/s, "
                     r"1.53× delivered", glance)
    assert re.search(r"\| W4 \| exactly-once within 6.3% [^|]+ \| 0.96× \| met \|", glance)
    assert re.search(r"\| W4 \| RocksDB within 3× [^|]+ \| 0.30× \| \*\*missed\*\* \|", glance)
    assert re.search(r"\| W4 \| back to full rate within 10 s [^|]+ \| 4.5 s \| met \|", glance)


def test_wordcount_exactly_once_is_judged_on_the_long_runs_beside_the_short(tmp_path):
    """With the longer runs in the results, the exactly-once target is judged on them and the
    short runs' ratio and end (the last commit after the last record) stand beside it."""
    def row(system, delivered, dvs, span, end):
        return {"system": system, "rec_s": _summary(delivered, delivered, delivered),
                "delivered_rec_s": _summary(delivered, delivered, delivered),
                "startup_s": _summary(1.5, 1.4, 1.6), "vs_base": dvs, "delivered_vs_base": dvs,
                "span_s": _summary(span, span, span), "end_s": _summary(end, end, end)}
    doc = _doc("wordcount", quick=False, sentences=1000, rounds=3, data="Zipf text",
               scaling=[], guarantees=[row("at-least-once", 30_000, 1.0, 1.5, 0.03),
                                       row("exactly-once", 27_000, 0.9, 1.5, 0.25)],
               long_sentences=5000,
               guarantees_long=[row("at-least-once", 30_000, 1.0, 8.0, 0.03),
                                row("exactly-once", 29_400, 0.98, 8.0, 0.24)],
               eos_vs_alo=0.9, eos_vs_alo_long=0.98)
    results = _write(tmp_path, [doc])
    md = generate(results, tmp_path / "B.md", tmp_path / "plots").read_text()
    w4 = _section(md, "W4")
    assert "again on 5,000 sentences" in w4 and "(0.25 s after the last record left" in w4
    assert "at-least-once's final flush 0.03 s" in w4 and "run of 1.5 s cannot amortize" in w4
    assert "| exactly-once / at-least-once (delivered, 5,000 sentences) | 0.98× |" in w4
    assert "| exactly-once / at-least-once (delivered, 1,000 sentences) | 0.90× |" in w4
    glance = _section(md, "Targets at a glance")
    assert re.search(r"\| W4 \| exactly-once within 6.3% of at-least-once \(delivered, 5,000 "
                     r"sentences\) \| 0.98× \(1,000 sentences: 0.90×, with 0.25 s of commit "
                     r"after the last record\) \| met \|", glance)
    doc["eos_vs_alo_long"] = 0.93
    md = generate(_write(tmp_path, [doc]), tmp_path / "B.md", tmp_path / "plots").read_text()
    assert re.search(r"\| W4 \| exactly-once within 6.3% [^|]+ \| 0.93× [^|]+ \| \*\*missed\*\* \|",
                     _section(md, "Targets at a glance"))


def test_spark_peer_columns_and_checks(tmp_path):
    cannon, cg = _cannon(), _cg()
    for r in cannon["rows"]:
        r.update(spark_s=8.0, spark_gflops=r["cannon_gflops"] / 8, speedup_vs_spark=8.0,
                 spark_blas="dev.ludovic.netlib.blas.Java11BLAS")
    cannon["rows"][0]["speedup_vs_spark"] = 2.5  # one size under 3x: the check is missed
    for r in cg["rows"]:
        r.update(spark_ms_per_it=200.0, speedup_vs_spark=round(200.0 / r["rayflow_ms_per_it"], 3))
    results = _write(tmp_path / "benchmarks" / "results", [cannon, cg])
    md = generate(results, tmp_path / "BENCHMARKS.md", results / "plots").read_text()
    w5, w6 = _section(md, "W5"), _section(md, "W6")
    assert "Cannon / Spark (speed)" in w5 and "Java11BLAS" in w5
    assert "rayflow / Spark (speed)" in w6 and "20.00×" in w6  # 200 / 10.0 with gloo
    glance = _section(md, "Targets at a glance")
    assert re.search(r"\| W5 \| Cannon ≥ 3× Spark MLlib [^|]+ \| 2.50×–8.00× at 4 ranks \| "
                     r"\*\*missed\*\* \|", glance)
    assert re.search(r"\| W6 \| CG \(gloo\) ≥ 10× faster than Spark[^|]+ \| 20.00×–20.00× "
                     r"\(gloo\) \| met \|", glance)


def _nexmark() -> dict:
    rows = [{"query": "q0", "events": 1000, "backend": "memory", "guarantee": "exactly_once",
             "path": "arrow", "events_s": 300_000.0, "cores": 0.9, "per_core": 310_000.0,
             "plain_per_core": 620_000.0, "flink_per_core": 155_000.0,
             "bytewax_per_core": 124_000.0},
            {"query": "q5", "events": 1000, "backend": "rocksdb", "guarantee": "exactly_once",
             "path": "rows", "events_s": 17_000.0, "cores": 0.8, "per_core": 11_050.0,
             "plain_per_core": 100_000.0, "flink_per_core": 22_100.0},
            # the checkpoint cost's baseline: not set beside Flink's exactly-once figures
            {"query": "q5", "events": 1000, "backend": "memory", "guarantee": "at_least_once",
             "path": "rows", "events_s": 20_000.0, "cores": 0.8, "per_core": 13_000.0,
             "plain_per_core": 100_000.0, "flink_per_core": 22_100.0}]
    long = [{"query": "q5", "events": 1000, "long_events": 10_000, "event_time_s": 40.0,
             "peak_rss_mib": 200.0, "long_peak_rss_mib": 210.0, "growth": 1.05}]
    return _doc("nexmark", quick=True, runs_per_config=3, rows=rows,
                flink_per_core={"q0": 155_000.0, "q5": 22_100.0}, long_factor=10, long=long)


def _nexmark_kafka() -> dict:
    rows = [{"query": "q1", "events": 2000, "backend": "memory", "guarantee": "exactly_once",
             "path": "rows", "source": "kafka", "events_s": 50_000.0, "cores": 1.25,
             "per_core": 40_000.0, "plain_per_core": 50_000.0, "flink_per_core": 157_900.0}]
    return _doc("nexmark_kafka", quick=False, runs_per_config=3, client="confluent", rows=rows)


def test_nexmark_section(tmp_path):
    results = _write(tmp_path, [_nexmark(), _nexmark_kafka()])
    md = generate(results, tmp_path / "B.md", tmp_path / "plots").read_text()
    w7 = _section(md, "W7")
    # 310,000 / 620,000 = 0.50x the floor and / 155,000 = 2.00x Flink; 11,050 / 22,100 = 0.50x
    # and / 124,000 = 2.50x Bytewax
    assert "| q0 | memory | exactly_once | arrow | 1,000 | 300,000 | 0.9 | 310,000 | 620,000 " \
           "| 0.50× | 155,000 | 2.00× | 124,000 | 2.50× |" in w7
    assert "| q5 | rocksdb | exactly_once | rows |" in w7 and "| 22,100 | 0.50× |" in w7
    assert "From a `--quick` run" in w7
    # 11,050 / 13,000 = 0.85x: below the 0.9x target
    assert "| q5 | 11,050 | 13,000 | 0.85× |" in w7
    assert "| q5 | 1,000 | 40.0 | 200 | 10,000 | 210 | 1.05× |" in w7
    # through Kafka: 40,000 / 50,000 = 0.80x the plain loop, / 157,900 = 0.25x Flink
    kafka = _section(md, "W7 — Nexmark through Kafka")
    assert "| q1 | 2,000 | 50,000 | 1.25 | 40,000 | 50,000 | 0.80× | 157,900 | 0.25× |" in kafka
    assert "| q1 |" not in w7
    glance = _section(md, "Targets at a glance")
    assert re.search(r"\| W7 \| exactly-once on RocksDB within 10% [^|]* \| q5 0.85× \| "
                     r"\*\*missed\*\* \|", glance)
    assert re.search(r"\| W7 \| state bounded[^|]* \| q5 1.05× \| reported \|", glance)
    assert re.search(r"\| W7 \| [^|]*Flink[^|]* \| 1 of 2 at or above Flink; below: q5 "
                     r"\(rocksdb\): 0.50× \| reported \|", glance)
    assert re.search(r"\| W7 \| [^|]*floor[^|]* \| 0.11×–0.50× of the floor \| reported \|",
                     glance)
    assert re.search(r"\| W7 Kafka \| [^|]*same topic \| q1 0.80× \| reported \|", glance)


def test_nexmark_checkpoint_cost_from_its_own_longer_runs(tmp_path):
    """Where the result has runs made for the checkpoint cost (longer, with checkpoints in
    them), the verdict and its table come from those, not from the main table's rows."""
    doc = _nexmark()
    cost = [{"query": "q5", "events": 5000, "backend": b, "guarantee": g, "per_core": pc,
             "events_s": pc, "checkpoints": 6.0}
            for b, g, pc in (("rocksdb", "exactly_once", 9_200.0),
                             ("memory", "exactly_once", 9_500.0),
                             ("memory", "at_least_once", 10_000.0))]
    doc["checkpoint_cost"] = {"factor": 5, "interval_s": 1.0, "rows": cost}
    md = generate(_write(tmp_path, [doc]), tmp_path / "B.md", tmp_path / "plots").read_text()
    w7 = _section(md, "W7")
    # 9,200 / 10,000 = 0.92x: the target met on the long runs, where the main table's
    # 400 k-event-like rows (11,050 / 13,000 = 0.85x) would have missed it
    assert "| q5 | 5,000 | 6 | 9,200 | 9,500 | 10,000 | 0.92× | 0.95× |" in w7
    assert "runs of 5× the events of the table's stateful runs" in w7
    glance = _section(md, "Targets at a glance")
    assert re.search(r"\| W7 \| exactly-once on RocksDB within 10% [^|]* \| q5 0.92× \(runs "
                     r"of 5,000 events\) \| met \|", glance)
    # and missed where the long runs miss it
    cost[0]["per_core"] = 8_900.0
    md = generate(_write(tmp_path, [doc]), tmp_path / "B.md", tmp_path / "plots").read_text()
    assert re.search(r"\| W7 \| exactly-once on RocksDB within 10% [^|]* \| q5 0.89× \(runs "
                     r"of 5,000 events\) \| \*\*missed\*\* \|",
                     _section(md, "Targets at a glance"))


def test_published_figures_live_in_one_module():
    pub = REPORT.published
    assert pub.W1_IMAGES[1200] == (580, 200, 14.4, 5.91)
    assert pub.W2_IDENTITY["flink_rec_s"] == 350_000 and pub.W4_WORDCOUNT["flink_rec_s"] == 43_000
    assert pub.W7_FLINK_PER_CORE["q5"] == 22_100.0
    # the benchmark scripts import them instead of restating them
    for script in (ROOT / "benchmarks").glob("bench_*.py"):
        text = script.read_text()
        assert "PUBLISHED = {" not in text and "PUBLISHED = (" not in text, script.name
        assert "FLINK_PER_CORE = {" not in text, script.name


def test_numpy_with_every_core_is_stated(tmp_path):
    results = _write(tmp_path, [_cannon(), _cg()])
    md = generate(results, tmp_path / "B.md", tmp_path / "plots").read_text()
    for w in ("W5", "W6"):
        assert "**numpy with every core** (2 cores, its BLAS threads unlimited) is not in " \
               "these results" in _section(md, w)
    cannon, cg = _cannon(), _cg()
    for r, ratio in zip(cannon["rows"], (1.2, 0.82)):
        r.update(numpy_all_cores_s=1.0 / ratio, numpy_all_cores_gflops=99.0,
                 vs_numpy_all_cores_time_ratio=ratio)
    for r in cg["rows"]:
        r.update(numpy_all_cores_ms_per_it=6.0,
                 vs_numpy_all_cores_ratio=r["rayflow_ms_per_it"] / 6.0)
    _write(results, [cannon, cg])
    md = generate(results, tmp_path / "B.md", tmp_path / "plots").read_text()
    w5, w6 = _section(md, "W5"), _section(md, "W6")
    assert "Cannon takes 0.82× (n = 2048) to 1.20× (n = 1024) of numpy's time" in w5
    assert "| numpy all-cores GFLOP/s | time / numpy all cores |" in w5
    assert "numpy all-cores" not in _section(generate(_write(tmp_path / "b", [_cannon()]), tmp_path / "C.md", tmp_path / "p").read_text(), "W5")
    assert "| 99.0 | 0.82× |" in w5
    # 10.0 / 6.0 (gloo) and 12.0 / 6.0 (ray)
    assert "rayflow CG takes 1.67× (n = 4096) to 2.00× (n = 4096) of numpy's time per " \
           "iteration" in w6
    assert "| 6 | 2.00× |" in w6


def test_plots_show_every_peer_the_tables_show(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    labels: dict[str, list[str]] = {}

    def draw(self, name, ncols, fn):  # the plot's legend, not its pixels
        axes = Figure().subplots(1, ncols, squeeze=False)[0]
        fn(*axes)
        labels[name] = [lb for ax in axes for lb in ax.get_legend_handles_labels()[1]]
        return None

    monkeypatch.setattr(REPORT.base._Plotter, "draw", draw)
    cannon, cg = _cannon(), _cg()
    for r in cannon["rows"]:
        r.update(mpi4py_s=0.9, dask_s=1.1, spark_s=8.0, numpy_all_cores_gflops=90.0,
                 vs_mpi4py_time_ratio=1.11, vs_dask_time_ratio=0.91)
    for r in cg["rows"]:
        r.update(mpi4py_ms_per_it=9.0, spark_ms_per_it=200.0, numpy_all_cores_ms_per_it=4.0)
    md = generate(_write(tmp_path, [cannon, cg]), tmp_path / "B.md", tmp_path / "plots")
    assert "unexpected shape" not in md.read_text()
    assert {"mpi4py Cannon, 4 rank(s)", "Dask matmul, 4 rank(s)",
            "Spark MLlib BlockMatrix, 4 rank(s)", "numpy, every core",
            "numpy, 1 BLAS thread"} <= set(labels["w5_cannon"])
    assert {"mpi4py CG", "Spark CG", "numpy CG, every core",
            "broadcast baseline"} <= set(labels["w6_cg"])
    generate(_write(tmp_path / "bare", [_cannon(), _cg()]), tmp_path / "C.md", tmp_path / "p2")
    assert not any("mpi4py" in lb or "every core" in lb
                   for lb in labels["w5_cannon"] + labels["w6_cg"])  # only what was measured


def test_benchmarks_md_is_what_the_report_writes(tmp_path):
    """BENCHMARKS.md is the report's output over the checked-in results, not a hand edit."""
    pytest.importorskip("matplotlib")  # without it the report says the plots were skipped
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for path in (ROOT / "benchmarks" / "results").iterdir():
        if path.is_file():  # copies: the report resolves links to where they point
            shutil.copy(path, results / path.name)
    got = generate(results, tmp_path / "BENCHMARKS.md", results / "plots").read_text()

    def undated(text: str) -> str:
        return re.sub(r"Generated by `rayflow report` on [^`]+ from", "Generated from", text)

    assert undated(got) == undated((ROOT / "BENCHMARKS.md").read_text()), \
        "BENCHMARKS.md is stale or edited by hand: run `rayflow report`"


def test_collectives_and_mpi_api_sections_judge_their_targets(tmp_path):
    """The MPI-stage collectives and the mpi4py-program comparison get sections of their
    own, with the ratios to MPICH and the transport's targets judged from the figures."""
    def row(ranks, op, nbytes, ours, buf):
        return {"ranks": ranks, "op": op, "bytes": nbytes, "rayflow_us": ours,
                "mpi4py_pickle_us": 2 * buf, "mpi4py_buffer_us": buf,
                "vs_pickle": round(ours / (2 * buf), 3), "vs_buffer": round(ours / buf, 3)}

    coll = _doc("collectives", rows=[row(2, "allreduce", 8, 40.0, 10.0),
                                     row(2, "barrier", 0, 31.0, 5.0),
                                     row(2, "allreduce", 1 << 20, 300.0, 400.0),
                                     row(4, "allreduce", 1 << 20, 900.0, 500.0)],
                allreduce_1MiB_cost_us={"refill a reused segment": 38.0},
                stage_start_s={"cold": 3.7, "warm": 0.022})
    api = _doc("mpi_api", rounds=2, mpi_library="MPICH Version: 5.0.2",
               rows=[{"ranks": 2, "op": "Allreduce", "bytes": 1 << 20, "reps": 40,
                      "rayflow_us": 330.0, "mpi4py_us": 300.0, "vs_mpi4py": 1.1}])
    md = generate(_write(tmp_path / "r", [coll, api]), tmp_path / "B.md",
                  tmp_path / "p").read_text()
    checks = {m.group(1): m.group(3) for m in re.finditer(
        r"^\| (?:Collectives|mpi4py programs) \| (.+?) \| (.+?) \| (.+?) \|$", md, re.M)}
    assert checks["2-rank scalar allreduce ≤ 50 µs"] == "met"
    assert checks["2-rank barrier ≤ 30 µs"] == "**missed**"  # 31 µs
    assert checks["1 MiB allreduce within 1.5× of MPICH's buffer Allreduce, 2 ranks"] == "met"
    assert checks["1 MiB allreduce within 1.5× of MPICH's buffer Allreduce, 4 ranks "
                  "(2 cores oversubscribed)"] == "**missed**"  # 1.8×
    assert checks["a stage without `gang=` starts in ≤ 0.5 s on a warm gang"] == "met"
    assert "`mpiexec -n 2`" in next(k for k in checks if "rayflow mpirun -n 2" in k)
    sec = _section(md, "MPI-stage collectives")
    assert "| 2 | allreduce | 1,048,576 | 300 | 800 | 400 | 0.38× | 0.75× |" in sec
    assert "| refill a reused segment | 38.0 |" in sec
    assert "| 2 | Allreduce | 1,048,576 | 330 | 300 | 1.10× |" in _section(md, "mpi4py programs")


def test_keyed_state_check_sets_the_plain_loops_slope_beside_ours(tmp_path):
    def row(keys: int, rec_s: float, plain: float, backend: str = "memory") -> dict:
        return {"series": "same density", "backend": backend, "keys": keys,
                "records_s": rec_s, "plain_records_s": plain, "rounds": 3}
    doc = _doc("keys", quick=False, rounds=3,
               rows=[row(1000, 1_000_000.0, 4_000_000.0), row(1_000_000, 450_000.0, 1_600_000.0),
                     row(1000, 200_000.0, 4_000_000.0, "rocksdb-nocache"),
                     row(1_000_000, 120_000.0, 1_600_000.0, "rocksdb-nocache")])
    md = generate(_write(tmp_path, [doc]), tmp_path / "B.md", tmp_path / "plots").read_text()
    glance = _section(md, "Targets at a glance")
    # 450,000 / 1,000,000 = 0.45x: missed; the plain loop's 1.6 M / 4 M = 0.40x beside it
    assert re.search(r"\| Keyed state \| tumbling windows, memory: [^|]* \| 0.450× \(1,000,000 → "
                     r"450,000 rec/s, medians of 3 rounds; the plain loop: 0.40×\) \| "
                     r"\*\*missed\*\* \|", glance)
    assert re.search(r"\| Keyed state \| tumbling windows, rocksdb, cache off: [^|]* \| 0.600× "
                     r"\(200,000 → 120,000 rec/s, [^|]*\) \| met \|", glance)
