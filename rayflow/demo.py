"""``rayflow demo``: every capability end to end on embedded defaults, with a summary.

1. an exactly-once windowed word count from Kafka to Kafka (W4), optionally with an injected
   actor failure, checked against plain Python;
2. an image stream blurred with flat memory (W1), checked against OpenCV;
3. Cannon's multiplication and a CG solve (W5, W6), checked against numpy;
4. the stream-to-stage job: windows of sensor rows solved by CG on a reused gang.

The workload flows live in the repository's ``jobs/`` folder (run the demo from a checkout).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import rayflow as rf
from rayflow.errors import RayflowError

JOBS = Path(__file__).resolve().parent.parent / "jobs"


def _jobs() -> None:
    if not (JOBS / "wordcount.py").exists():
        raise RayflowError(f"the demo runs the workloads in {JOBS}, which is missing; run it "
                           f"from a rayflow checkout (pip install -e .)")
    if str(JOBS) not in sys.path:
        sys.path.insert(0, str(JOBS))


class _Steps:
    """A spinner per step on a terminal; plain log lines otherwise (e.g. ``ray job submit``)."""

    def __init__(self, console: Console):
        self.console = console

    @contextlib.contextmanager
    def step(self, title: str):
        t0 = time.time()
        if self.console.is_terminal:
            with self.console.status(f"[bold]{title}…"):
                yield
        else:
            print(f"[rayflow demo] {title} ...", flush=True)
            yield
        self.console.log(f"{title}: done in {time.time() - t0:.1f} s")


def wordcount(bootstrap: str, n: int, inject_failure: bool) -> dict[str, Any]:
    import ray
    from wordcount import build_flow, sentences

    from rayflow.connectors.kafka import create_topic, produce, read_values
    from rayflow.testing import wait_for

    t_in, t_out = f"demo-wc-in-{time.time_ns()}", f"demo-wc-out-{time.time_ns()}"
    create_topic(bootstrap, t_in, 1)
    create_topic(bootstrap, t_out, 1)
    data = list(sentences(n))
    produce(bootstrap, t_in, data + [b"{broken json", b'{"msgId": 7}'])
    job = rf.run(build_flow(t_in, t_out, bootstrap, name=f"demo-wc-{time.time_ns()}"),
                 background=True, stream={"batch_size": 200},
                 checkpoint={"processing_guarantee": "exactly_once", "interval_s": 0.5})
    if inject_failure:
        wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
        ray.kill(job.hosts[("count", 0)], no_restart=True)
    job.wait(300)
    got = [json.loads(v) for v in read_values(bootstrap, t_out)]
    words = Counter(w for s in data for w in json.loads(s)["sentence"].split())
    expected = sum(-(-c // 10) for c in words.values())  # full windows + one partial per word
    ok = len(got) == expected and sum(r["count"] for r in got) == sum(words.values())
    m = job.metrics()
    lat = job.latency()
    span = m["sink"]["last_out_time"] - (m["sink"]["first_in_time"] or 0)
    return {"demo": "W4 word count (exactly-once)", "records": n,
            "rate": f"{n / span:,.0f} rec/s" if span > 0 else "-",
            "latency p50/p99": f"{lat['p50_ms']:.0f}/{lat['p99_ms']:.0f} ms",
            "extra": f"{len(job.checkpoints())} checkpoints, {len(job.recoveries)} recoveries, "
                     f"{m['parse']['dead_letters']} dead letters",
            "check": "ok" if ok else f"MISMATCH ({len(got)} windows, expected {expected})"}


def images(count: int, size: int) -> dict[str, Any]:
    import cv2
    import numpy as np
    from image_blur import run_w1

    from rayflow.connectors.images import write_image_set

    with tempfile.TemporaryDirectory(prefix="rayflow-demo-") as d:
        src, out = Path(d) / "in", Path(d) / "out"
        paths = write_image_set(src, count, size)
        (src / "corrupt.png").write_bytes(b"\x89PNG not really")
        res = run_w1(str(src), measure_memory=True, output_dir=str(out))
        first = sorted(paths)[0]
        want = cv2.GaussianBlur(cv2.imread(str(first), cv2.IMREAD_UNCHANGED), (5, 5), 3, 3)
        got = cv2.imread(str(out / first.name), cv2.IMREAD_UNCHANGED)
        ok = got is not None and np.array_equal(got, want) and res["images_written"] == count
    mem = res.get("memory") or {}
    peak = mem.get("uss_peak_above_idle_mb")
    return {"demo": f"W1 image blur {size} px", "records": count,
            "rate": f"{res['throughput_img_s']:,.1f} img/s", "latency p50/p99": "-",
            "extra": (f"peak USS +{peak:.0f} MB, store {mem.get('object_store_peak_mb')} MB, "
                      if isinstance(peak, (int, float)) else "")
                     + f"{res['dead_letters']} dead letters",
            "check": "ok" if ok and res["dead_letters"] == 1 else "MISMATCH"}


def hpc(n: int) -> list[dict[str, Any]]:
    import numpy as np

    from rayflow.hpc import cannon_matmul, cg_solve

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(n, n)), rng.normal(size=(n, n))
    t0 = time.perf_counter()
    cds = cannon_matmul(a, b, grid=2)
    c = cds.to_numpy()
    wall = time.perf_counter() - t0
    stage_s = max(cds.stage.rank_wall_s) if cds.stage and cds.stage.rank_wall_s else wall
    err = float(np.abs(c - a @ b).max() / np.abs(a @ b).max())
    m = rng.normal(size=(n, n))
    spd = m @ m.T + n * np.eye(n)
    rhs = rng.normal(size=n)
    res = cg_solve(spd, rhs, ranks=2, tol=1e-10)
    cg_err = float(np.abs(res.x - np.linalg.solve(spd, rhs)).max())
    return [
        {"demo": f"W5 Cannon {n}x{n}, 2x2 gang", "records": "-",
         "rate": f"{2 * n**3 / stage_s / 1e9:.1f} GFLOP/s in the stage ({wall:.1f} s with "
                 f"gang start)",
         "latency p50/p99": "-", "extra": f"rel. error {err:.1e}",
         "check": "ok" if err < 1e-12 else "MISMATCH"},
        {"demo": f"W6 CG {n}x{n}, 2 ranks", "records": "-",
         "rate": f"{res.ms_per_iteration:.2f} ms/iteration", "latency p50/p99": "-",
         "extra": f"{res.iterations} iterations, max error {cg_err:.1e}",
         "check": "ok" if cg_err < 1e-8 else "MISMATCH"},
    ]


def stream_solve(windows: int) -> dict[str, Any]:
    import numpy as np
    from stream_solve import build_flow, reference_fits

    rows, features = 200, 16
    job = rf.run(build_flow(rf.CollectSink(), windows, rows, features, name="demo-solve"),
                 checkpoint={"processing_guarantee": "exactly_once"})
    got = {(r["sensor"], r["window"]): r for r in map(json.loads, job.collect("out"))}
    ref = reference_fits(windows, rows, features)
    ok = set(got) == set(ref) and all(
        np.allclose(got[k]["beta"], ref[k], rtol=1e-6, atol=1e-8) for k in ref)
    stage_ms = sorted(r["stage_ms"] for r in got.values())
    span = job.finished_at - job.ready_at
    return {"demo": "stream -> CG stage per window",
            "records": windows, "rate": f"{windows / span:.1f} windows/s",
            "latency p50/p99": "-",
            "extra": f"stage {stage_ms[len(stage_ms) // 2]:.0f} ms/window (median)",
            "check": "ok" if ok else "MISMATCH"}


def run_demo(quick: bool = False, address: str | None = None, bootstrap: str | None = None,
             inject_failure: bool = False) -> list[dict[str, Any]]:
    """Run every demo and print a table; returns the rows."""
    from rayflow._raycontext import ensure_ray

    _jobs()
    console = Console()
    steps = _Steps(console)
    broker = None
    rows: list[dict[str, Any]] = []
    with steps.step("starting Ray and the embedded Kafka broker"):
        ray = ensure_ray(address, num_cpus=None if address else 4)
        if bootstrap is None:
            broker = rf.EmbeddedBroker().start()
            bootstrap = broker.bootstrap
    try:
        with steps.step("W4 word count, exactly-once" + (" (with a failure)" if inject_failure
                                                         else "")):
            rows.append(wordcount(bootstrap, 6000 if quick else 20_000, inject_failure))
        with steps.step("W1 image blur"):
            rows.append(images(40 if quick else 200, 200 if quick else 600))
        with steps.step("W5 Cannon and W6 CG"):
            rows += hpc(256 if quick else 1024)
        with steps.step("stream -> MPI stage"):
            rows.append(stream_solve(4 if quick else 16))
    finally:
        if broker:
            broker.stop()
    table = Table(title="rayflow demo")
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
    try:
        url = ray.worker.get_dashboard_url()
    except Exception:  # noqa: BLE001 - no dashboard
        url = None
    console.print(f"Ray dashboard: {'http://' + url if url else 'not running (local Ray)'}")
    return rows
