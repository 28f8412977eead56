"""``rayflow demo``: every capability end to end on embedded defaults, with a summary.

1. an exactly-once windowed word count from Kafka to Kafka (W4), optionally with an injected
   actor failure, checked against plain Python;
2. an image stream blurred with flat memory (W1), checked against OpenCV;
3. Cannon's multiplication and a CG solve (W5, W6), checked against numpy;
4. the stream-to-stage job: windows of sensor rows solved by CG on a reused gang.

The workload flows are those of :mod:`rayflow.examples`, which ``jobs/`` runs from the command
line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

import rayflow as rf


class _Steps:
    """Progress of the demo: on a terminal, rich progress bars (the demo's steps, and the
    records of a step that counts them); otherwise (``ray job submit``, a pipe) plain lines,
    one when a step starts and one when it ends, with its time."""

    def __init__(self, console: Console, total: int):
        self.console = console
        self.progress: Progress | None = None
        if console.is_terminal:
            self.progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=24),
                MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
            self.overall = self.progress.add_task("rayflow demo", total=total)

    def __enter__(self) -> _Steps:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()

    @contextlib.contextmanager
    def step(self, title: str):
        """A step; yields ``update(done, total)`` for a step that counts its records."""
        t0 = time.time()
        if self.progress is None:
            print(f"[rayflow demo] {title} ...", flush=True)

            def ignore(done: int, total: int) -> None:
                pass

            yield ignore
            print(f"[rayflow demo] {title}: done in {time.time() - t0:.1f} s", flush=True)
            return
        progress = self.progress
        task = progress.add_task(f"  {title}", total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            yield update
        finally:
            progress.remove_task(task)
        progress.advance(self.overall)
        progress.console.print(f"[green]✓[/green] {title} ({time.time() - t0:.1f} s)")


def wordcount(bootstrap: str, n: int, inject_failure: bool,
              progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    import ray

    from rayflow.connectors.kafka import create_topic, produce, read_values
    from rayflow.examples.wordcount import build_flow, sentences
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
    deadline = time.monotonic() + 300
    while job.state in ("RUNNING", "STOPPING") and time.monotonic() < deadline:
        if progress is not None:  # records the parser took, of those produced
            progress(min(job.metrics().get("parse", {}).get("records_in", 0), n + 2), n + 2)
        time.sleep(0.5)
    job.wait(max(1.0, deadline - time.monotonic()))
    got = [json.loads(v) for v in read_values(bootstrap, t_out)]
    words = Counter(w for s in data for w in json.loads(s)["sentence"].split())
    expected = sum(-(-c // 10) for c in words.values())  # full windows + one partial per word
    ok = len(got) == expected and sum(r["count"] for r in got) == sum(words.values())
    m = job.metrics()
    lat = job.latency()
    sink = m.get("sink", {})
    span = (sink.get("last_out_time") or 0) - (sink.get("first_in_time") or 0)
    return {"demo": "W4 word count (exactly-once)", "records": f"{n:,}",
            "rate": f"{n / span:,.0f} rec/s" if span > 0 else "-",
            # (none sampled: a recovery near the end leaves few records for the sink)
            "latency p50/p99": f"{lat['p50_ms']:.0f}/{lat['p99_ms']:.0f} ms"
            if lat["samples"] else "-",
            "checkpoints": len(job.checkpoints()), "recoveries": len(job.recoveries),
            "dead letters": m.get("parse", {}).get("dead_letters", 0),
            "check": "ok" if ok else f"MISMATCH ({len(got)} windows, expected {expected})"}


def images(count: int, size: int) -> dict[str, Any]:
    import cv2
    import numpy as np

    from rayflow.connectors.images import write_image_set
    from rayflow.examples.image_blur import run_w1

    with tempfile.TemporaryDirectory(prefix="rayflow-demo-") as d:
        src, out = Path(d) / "in", Path(d) / "out"
        paths = write_image_set(src, count, size)
        (src / "corrupt.png").write_bytes(b"\x89PNG not really")
        res = run_w1(str(src), measure_memory=True, output_dir=str(out))
        first = sorted(paths)[0]
        img = cv2.imread(str(first), cv2.IMREAD_UNCHANGED)
        if img is None:
            raise RuntimeError(f"demo: cannot read back the input {first}")
        want = cv2.GaussianBlur(img, (5, 5), 3, sigmaY=3)
        got = cv2.imread(str(out / first.name), cv2.IMREAD_UNCHANGED)
        ok = got is not None and np.array_equal(got, want) and res["images_written"] == count
    mem = res.get("memory") or {}
    peak, store = mem.get("uss_peak_above_idle_mb"), mem.get("object_store_peak_mb")
    return {"demo": f"W1 image blur {size} px", "records": f"{count:,} images",
            "rate": f"{res['throughput_img_s']:,.1f} img/s",
            "peak USS above idle": f"{peak:.0f} MB" if isinstance(peak, (int, float)) else "-",
            "object store peak": f"{store} MB" if store is not None else "-",
            "dead letters": res["dead_letters"],
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
        {"demo": f"W5 Cannon {n}x{n}, 2x2 gang",
         "rate in the stage": f"{2 * n**3 / stage_s / 1e9:.3g} GFLOP/s",
         "wall with gang start": f"{wall:.1f} s", "relative error": f"{err:.1e}",
         "check": "ok" if err < 1e-12 else "MISMATCH"},
        {"demo": f"W6 CG {n}x{n}, 2 ranks",
         "time per iteration": f"{res.ms_per_iteration:.2f} ms",
         "iterations": res.iterations, "max error": f"{cg_err:.1e}",
         "check": "ok" if cg_err < 1e-8 else "MISMATCH"},
    ]


def stream_solve(windows: int) -> dict[str, Any]:
    import numpy as np

    from rayflow.examples.stream_solve import build_flow, reference_fits

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
            "windows": windows, "rate": f"{windows / span:.1f} windows/s",
            "stage per window (median)": f"{stage_ms[len(stage_ms) // 2]:.0f} ms",
            "check": "ok" if ok else "MISMATCH"}


def summary_table(rows: list[dict[str, Any]]) -> Table:
    """The demo's summary: one row per figure under a title row per demo (with its check),
    two narrow columns, so that it reads at 80 columns."""
    table = Table(title="rayflow demo", show_lines=False)
    table.add_column("demo / figure", overflow="fold")
    table.add_column("value", overflow="fold")
    for n, row in enumerate(rows):
        check = str(row.get("check", ""))
        table.add_row(f"[bold]{row['demo']}[/bold]",
                      f"[green]{check}[/green]" if check == "ok" else f"[red]{check}[/red]")
        figures = [(k, v) for k, v in row.items() if k not in ("demo", "check") and v != "-"]
        for i, (key, value) in enumerate(figures):
            table.add_row(f"  {key}", str(value),
                          end_section=i == len(figures) - 1 and n < len(rows) - 1)
    return table


def run_demo(quick: bool = False, address: str | None = None, bootstrap: str | None = None,
             inject_failure: bool = False, console: Console | None = None
             ) -> list[dict[str, Any]]:
    """Run every demo and print a table; returns the rows."""
    from rayflow._raycontext import dashboard_available, dashboard_url, ensure_ray
    from rayflow.config import load_config

    console = console or Console()
    steps = _Steps(console, total=5)
    broker = None
    rows: list[dict[str, Any]] = []
    with steps:
        with steps.step("starting Ray and the embedded Kafka broker"):
            # a private Ray with its dashboard when this Python can run it (ray[default])
            if address is None:
                # the demo's own terminal: Ray's start-up lines (the token notice, "Started
                # a local Ray instance") and the actors' INFO lines stay out of it
                ensure_ray(None, num_cpus=4, include_dashboard=dashboard_available(),
                           logging_level=logging.ERROR,
                           runtime_env={"env_vars": {"RAYFLOW_LOG_LEVEL": "WARNING"}})
            else:
                ensure_ray(address)
            if bootstrap is None:
                broker = rf.EmbeddedBroker(
                    timeout_s=load_config().kafka.startup_timeout_s).start()
                bootstrap = broker.bootstrap
        try:
            with steps.step("W4 word count, exactly-once" + (
                    " (with a failure)" if inject_failure else "")) as update:
                rows.append(wordcount(bootstrap, 6000 if quick else 20_000, inject_failure,
                                      update))
            with steps.step("W1 image blur"):
                rows.append(images(40 if quick else 200, 200 if quick else 600))
            with steps.step("W5 Cannon and W6 CG"):
                rows += hpc(256 if quick else 1024)
            with steps.step("stream -> MPI stage"):
                rows.append(stream_solve(4 if quick else 16))
        finally:
            if broker:
                broker.stop()
    console.print(summary_table(rows))
    url = dashboard_url()
    if url:
        console.print(f"Ray dashboard: {url}")
    else:
        console.print("Ray dashboard: not running" + ("" if dashboard_available() else
                      " (install ray[default] for it)"))
    return rows
