"""Streams + MPI stages: windows of sensor rows solved by CG on a gang (jobs/stream_solve.py).

    python benchmarks/bench_stream_solve.py [--quick]

Reports windows/s, the latency of a window (last row read -> fit written), and the cost split
between the stream and the stage, with the gang reused across windows and rebuilt per window,
beside the same fits done in one process with numpy (the floor).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import click  # noqa: E402
import numpy as np  # noqa: E402
from _common import print_table, ratio, write_result  # noqa: E402

import rayflow as rf  # noqa: E402
from rayflow._raycontext import ensure_ray  # noqa: E402
from rayflow.examples.stream_solve import build_flow, reference_fits


def run(windows: int, rows: int, features: int, reuse: bool) -> dict:
    job = rf.run(build_flow(rf.CollectSink(), windows, rows, features, reuse_gang=reuse,
                            name=f"ss-{reuse}"), stream={"latency_sample_every": 1})
    out = [json.loads(v) for v in job.collect("out")]
    ref = reference_fits(windows, rows, features)
    ok = all(np.allclose(r["beta"], ref[(r["sensor"], r["window"])], rtol=1e-6, atol=1e-8)
             for r in out) and len(out) == windows
    span = job.finished_at - job.ready_at
    stage = np.array([r["stage_ms"] for r in out])
    m = job.metrics()
    lat = job.latency()
    return {"reuse_gang": reuse, "windows": len(out), "correct": ok,
            "windows_per_s": round(windows / span, 2),
            "latency_p50_ms": lat["p50_ms"], "latency_p99_ms": lat["p99_ms"],
            "stage_ms_median": round(float(np.median(stage)), 1),
            "stage_share": round(float(stage.sum()) / 1000 / span, 3),
            "stream_busy_s": round(sum(c["busy_s"] for s, c in m.items() if s != "solve"), 2),
            "startup_s": round(job.startup_s, 2)}


@click.command()
@click.option("--quick", is_flag=True)
def main(quick: bool) -> None:
    windows, rows, features = (8, 200, 16) if quick else (32, 1000, 64)
    ensure_ray(None, num_cpus=4)
    t0 = time.perf_counter()
    reference_fits(windows, rows, features)
    floor = windows / (time.perf_counter() - t0)
    rows_out = [run(windows, rows, features, True), run(windows, rows, features, False)]
    for r in rows_out:
        r["vs_numpy_loop"] = ratio(r["windows_per_s"], floor)
    reuse_gain = ratio(rows_out[0]["windows_per_s"], rows_out[1]["windows_per_s"])
    print_table(f"stream -> CG stage, {windows} windows of {rows} x {features} "
                f"(numpy in one process: {floor:.1f} windows/s)",
                ["gang", "windows/s", "p50 ms", "p99 ms", "stage ms", "stage share",
                 "correct"],
                [["reused" if r["reuse_gang"] else "per window", r["windows_per_s"],
                  r["latency_p50_ms"], r["latency_p99_ms"], r["stage_ms_median"],
                  r["stage_share"], r["correct"]] for r in rows_out])
    print(f"reusing the gang: {reuse_gain}x the windows/s of a gang per window")
    path = write_result("stream_solve_quick" if quick else "stream_solve", {
        "quick": quick, "windows": windows, "rows": rows, "features": features,
        "numpy_loop_windows_per_s": round(floor, 2), "runs": rows_out,
        "reuse_vs_rebuild": reuse_gain, "published": {}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
