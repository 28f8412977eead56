"""W3 Sleep (seed 003: Flink vs Storm): identity plus a 1 ms sleep per record, at default settings.

    python benchmarks/bench_sleep.py [--quick] [--seconds 6]

``source(MemorySource) -> rebalance() -> map("sleep", parallelism=p) -> DiscardSink`` for
p = 1, 2, 4, 8 on a private local Ray, with no stream setting changed: a slow step must scale
without hand tuning. Each run holds about ``seconds`` of work per instance (900 records per
second per instance). Two figures per run:

- ``rec_s``: the job's own, records / (last outTime - first inTime) at the sink
  (``job.throughput()``), start-up excluded;
- ``wall_rec_s``: records / (the job's end - its start), start-up and teardown included.

Beside them, the same run's cost of one ``time.sleep(0.001)`` in a bare loop (``sleep_call_ms``):
it bounds what one instance can do. Sleeping needs no core, so the scaling is meaningful on a
small machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import click  # noqa: E402
from _common import print_table, ratio, write_result  # noqa: E402
from report.published import W2_IDENTITY as PUBLISHED  # noqa: E402

import rayflow as rf  # noqa: E402
from rayflow._raycontext import ensure_ray  # noqa: E402

SLEEP_S = 0.001
PARALLELISM = (1, 2, 4, 8)


def nap(record: bytes) -> bytes:
    """The per-record work of W3: sleep 1 ms, pass the record on."""
    time.sleep(SLEEP_S)
    return record


def messages(n: int) -> list[bytes]:
    now = int(time.time() * 1000)
    return [b"%d,%d" % (i, now) for i in range(n)]


def sleep_call_ms(calls: int = 1000) -> float:
    """Milliseconds one ``time.sleep(0.001)`` takes here (a timer's slack and the load)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        time.sleep(SLEEP_S)
    return 1000 * (time.perf_counter() - t0) / calls


def sleep_flow(parallelism: int, n: int) -> rf.Dataflow:
    flow = rf.Dataflow(f"w3-sleep-{parallelism}")
    (flow.source("source", rf.MemorySource(messages(n)))
         .rebalance()
         .map("sleep", nap, parallelism=parallelism)
         .sink("sink", rf.DiscardSink()))
    return flow


def sleep_run(parallelism: int, seconds: float) -> dict:
    """One run at default settings: about ``seconds`` of work for each instance."""
    n = int(PUBLISHED["sleep_rec_s_per_thread"] * parallelism * seconds)
    job = rf.run(sleep_flow(parallelism, n))
    rate = job.throughput()
    wall = job.finished_at - job.started_at
    got = job.metrics()["sink"]["records_in"]
    if got != n:
        raise AssertionError(f"parallelism {parallelism}: {got} records at the sink, {n} sent")
    return {"parallelism": parallelism, "records": n, "rec_s": round(rate),
            "rec_s_per_instance": round(rate / parallelism),
            "wall_s": round(wall, 2), "wall_rec_s": round(n / wall),
            "startup_s": round(job.startup_s, 2)}


@click.command()
@click.option("--quick", is_flag=True, help="Small sizes for a check.")
@click.option("--seconds", default=6.0, show_default=True,
              help="Seconds of work per instance in each run.")
def main(quick: bool, seconds: float) -> None:
    if quick:
        seconds = min(seconds, 2.0)
    ensure_ray(None)
    before = sleep_call_ms()
    rows = [sleep_run(p, seconds) for p in PARALLELISM]
    call_ms = (before + sleep_call_ms()) / 2
    base = rows[0]["rec_s"]
    for r in rows:
        r["scaling_efficiency"] = ratio(r["rec_s"], base * r["parallelism"])
    print_table(f"W3 Sleep 1 ms per record, default settings (published "
                f"~{PUBLISHED['sleep_rec_s_per_thread']} rec/s per thread; one sleep here: "
                f"{call_ms:.3f} ms)",
                ["parallelism", "records", "rec/s", "per instance", "efficiency",
                 "wall rec/s", "wall s", "startup s"],
                [[r["parallelism"], r["records"], r["rec_s"], r["rec_s_per_instance"],
                  r["scaling_efficiency"], r["wall_rec_s"], r["wall_s"], r["startup_s"]]
                 for r in rows])
    path = write_result("sleep_quick" if quick else "sleep",
                        {"published": PUBLISHED, "quick": quick, "settings": "defaults",
                         "seconds_per_instance": seconds,
                         "sleep_call_ms": round(call_ms, 4), "sleep": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
