"""W7 Nexmark: events/s per core of each query, beside a same-run plain Python baseline and
the published Flink per-core figures.

    python benchmarks/bench_nexmark.py [--quick] [--runs 3]

Each query runs on a private local Ray behind a generator source (parallelism 1, events
made inside the job as Flink's Nexmark source makes them) into a discarding sink, with
exactly-once checkpoints every second on the memory backend; q5 (a sliding window), q13 (a
lookup join) and q20 (a keyed join) also run exactly-once on RocksDB, and at-least-once on
the memory backend. What checkpoints cost is measured apart, on ``CHECKPOINT_FACTOR`` times
as many events (runs of several seconds, so several checkpoints each; the number completed
is recorded): exactly-once on RocksDB within 10% of at-least-once on the memory backend is
the target, and exactly-once on the memory backend stands beside them. Every query of
:data:`rayflow.nexmark.QUERIES` runs by default (q0-q5, q7-q9 and q11-q22);
Flink's published figure is given where the suite's README has one. Per core = events / CPU seconds, where the CPU seconds
are those of the driver and of every Ray worker process of the job (psutil, sampled while
it runs, from the moment the job runs to its end: start-up is reported apart), so cores =
CPU seconds / wall seconds. The plain baseline (the COST floor) makes the same events and
runs the query in this one process: the Arrow function for the stateless queries, the
plain-Python reference for the others. Where Bytewax (the ``peers`` extra) can express the
query with its own operators (q0-q2, q18, q19), it runs the same events in a process of its
own, one worker (:mod:`peers_nexmark`). Medians of ``--runs`` interleaved rounds: each
round runs the plain loop, Bytewax and every configuration of the query once.

The same queries through Kafka: :mod:`bench_nexmark_kafka`.

Memory: the peak of the job's worker processes' resident memory, summed (psutil, sampled
with the CPU). q5, q8 and q11 (windows and a window join) also run once on events at 10 k
per second of event time (``LONG_CONFIG``), and once on ``LONG_FACTOR`` times as many:
their state must not grow with the events once windows close, so the peak of the long
run should stay near that of the short one.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import click  # noqa: E402
import numpy as np  # noqa: E402
import peers_nexmark  # noqa: E402
import psutil  # noqa: E402
from _common import print_table, ratio, write_result  # noqa: E402
from report.published import W7_FLINK_PER_CORE as FLINK_PER_CORE  # noqa: E402

import rayflow as rf  # noqa: E402
from rayflow._raycontext import ensure_ray  # noqa: E402
from rayflow.nexmark import QUERIES, NexmarkConfig, NexmarkGenerator, nexmark_flow  # noqa: E402

# the Flink suite's event-time rate: 10 M events per second of event time
CONFIG = NexmarkConfig(seed=42, first_event_rate=10_000_000.0)
STATEFUL = ("q5", "q13", "q20")
# what checkpoints cost is measured on runs this many times longer than the stateful
# queries' (2 M events, 4-6 s at parallelism 1 on the 2-core VM): a run of 400 k events
# ends within the first second, before the first periodic checkpoint, so its only
# checkpoint is the empty one at the end of the input and the comparison would show the
# state backend's cost without any checkpoint's
CHECKPOINT_FACTOR = 5
# windows and joins whose state must stay bounded however long the stream runs, on events
# that span many of their windows: at the suite's 10 M events per second of event time the
# 4 M events of a long run span 0.4 s, inside q5's first 10-second window, and every
# window's state rightly grows all run long. At 10 k events per second, the short run
# spans 40 s and the long one 400 s.
LONG = ("q5", "q8", "q11")
LONG_FACTOR = 10
LONG_CONFIG = NexmarkConfig(seed=42, first_event_rate=10_000.0)
CHUNK = 16_384
WARM_UP_EVENTS = 50_000


def is_actor_title(title: str) -> bool:
    """Whether a Ray worker's process title (``ray::<actor class>[.<method>]``) is that of
    an actor: the job's processes. Ray's agents, the idle workers it keeps in its pool (and
    starts ahead of need, after a job's actors exit too) and a worker still starting (its
    title is then its interpreter's command line) are not."""
    words = title.split()  # (Ray pads a worker's title with spaces)
    name = words[0] if words else ""
    return name.startswith("ray::") and name.split(".")[0] != "ray::IDLE" and "Agent" not in name


class CpuMeter:
    """CPU seconds of this process and of the actor processes of our own raylet (the job's
    workers) and their children, sampled every ``every_s`` so that actors which exit
    before the end still count; and the peak of their resident memory, summed
    (``peak_rss``, bytes). Ray's idle pooled workers are left out of both: how many Ray
    keeps, and when it starts them, is its own business, and it differs from one job to
    the next. So is the meter itself: the CPU of its sampling thread (``own_s``), which
    runs in this process, is taken off this process's (about 3% of a one-second job's
    CPU, measured on the 2-core VM)."""

    def __init__(self, every_s: float = 0.05):
        import ray

        node = ray._private.worker._global_node
        self._raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        self._every = every_s
        self._first: dict = {}
        self._last: dict = {}
        self.peak_rss = 0
        self.peak_procs: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _procs(self) -> list[tuple[Any, str]]:
        """``(process, its title)``: this one, and the job's."""
        out = [(psutil.Process(), "driver")]
        for p in self._raylet.children(recursive=True):
            try:
                title = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if is_actor_title(title):
                out.append((p, title.split()[0]))
                try:  # an actor's own processes (an exactly-once sink's commit process)
                    out.extend((c, f"{title.split()[0]} child") for c in
                               p.children(recursive=True))
                except psutil.Error:
                    pass
        return out

    def _sample(self, first: bool = False) -> None:
        me, rss, each = psutil.Process().pid, 0, []
        for p, title in self._procs():
            try:
                key = (p.pid, p.create_time())
                t = p.cpu_times()
                if p.pid != me:
                    mem = p.memory_info().rss
                    rss += mem
                    each.append((title, p.pid, round(mem / 2**20)))
            except psutil.Error:
                continue
            s = t.user + t.system
            if first:
                self._first[key] = s
            self._last[key] = s
        if rss > self.peak_rss:  # which processes made the peak: (title, pid, MiB)
            self.peak_rss, self.peak_procs = rss, sorted(each)

    def _loop(self):
        t0 = time.thread_time()
        while not self._stop.wait(self._every):
            self._sample()
        self.own_s = time.thread_time() - t0

    def __enter__(self):
        self._sample(first=True)
        self.t0 = time.perf_counter()
        self.own_s = 0.0
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.wall_s = time.perf_counter() - self.t0
        self._stop.set()
        self._thread.join()  # first: its CPU is all in the last sample of this process
        self._sample()
        self.cpu_s = sum(v - self._first.get(k, 0.0) for k, v in self._last.items()) \
            - self.own_s


def rayflow_run(query: str, n: int, backend: str, parallelism: int = 1,
                guarantee: str = "exactly_once", config: NexmarkConfig = CONFIG) -> dict:
    """One run; the meter starts once the job runs (its actors are up), so start-up is
    reported apart (``start_s``) and not in the per-core figure."""
    flow = nexmark_flow(query, config, n, sink=rf.DiscardSink(), parallelism=parallelism,
                        name=f"nexmark-{query}-{time.time_ns()}")
    return metered_run(flow, n, backend, guarantee)[0]


def metered_run(flow: Any, n: int, backend: str = "memory",
                guarantee: str = "exactly_once") -> tuple[dict, Any]:
    """Run ``flow`` (``n`` events) with checkpoints every second: its figures, and the job.
    The meter starts once the job runs, so start-up is reported apart (``start_s``)."""
    t0 = time.perf_counter()
    job = flow.run(checkpoint={"processing_guarantee": guarantee, "state_backend": backend,
                               "interval_s": 1.0}, background=True)
    start_s = time.perf_counter() - t0
    with CpuMeter() as m:
        job.wait(600)
    return {"start_s": start_s, "wall_s": m.wall_s, "cpu_s": m.cpu_s,
            "cores": m.cpu_s / m.wall_s, "events_s": n / m.wall_s, "per_core": n / m.cpu_s,
            "peak_rss_mib": m.peak_rss / 2**20, "peak_procs": m.peak_procs,
            "meter_cpu_s": m.own_s,
            # (the one at the end of the input, which no record follows, counted too)
            "checkpoints": sum(c.get("status") == "completed" for c in job.checkpoints())}, job


def plain_run(query: str, n: int) -> dict:
    """The query in this process: events made in chunks as the source makes them. Its CPU
    includes freeing the events and the output (0.04-0.07 s of 400 k events on the 2-core
    VM), as a job's includes freeing each batch once its steps are done with it."""
    q, gen = QUERIES[query], NexmarkGenerator(CONFIG)
    t0, c0 = time.perf_counter(), time.process_time()
    if q.arrow is not None:
        out = 0
        for lo in range(0, n, CHUNK):
            out += q.arrow(gen.batch(np.arange(lo, min(n, lo + CHUNK)))).num_rows
    else:
        events: list = []
        for lo in range(0, n, CHUNK):
            events.extend(gen.rows(np.arange(lo, min(n, lo + CHUNK))))
        result = q.reference(events)
        out = len(result)
        del events, result  # (freed inside the clock)
    cpu = time.process_time() - c0
    return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu, "per_core": n / cpu,
            "outputs": out}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def checkpoint_cost(names: list[str], runs: int, n: int) -> list[dict]:
    """What checkpoints cost: each query of ``names`` on ``n`` events, exactly-once on
    RocksDB and on the memory backend and at-least-once on the memory backend, in
    interleaved rounds (every configuration once a round), checkpoints every second; per
    configuration the median per core and the median number of checkpoints completed."""
    configs = [("rocksdb", "exactly_once"), ("memory", "exactly_once"),
               ("memory", "at_least_once")]
    out = []
    for name in names:
        got: dict[tuple[str, str], list[dict]] = {c: [] for c in configs}
        for _ in range(runs):
            for backend, guarantee in configs:
                got[backend, guarantee].append(
                    rayflow_run(name, n, backend, guarantee=guarantee))
        for (backend, guarantee), runs_ in got.items():
            out.append({"query": name, "events": n, "backend": backend,
                        "guarantee": guarantee, "runs": runs_,
                        "per_core": median(runs_, "per_core"),
                        "events_s": median(runs_, "events_s"),
                        "checkpoints": median(runs_, "checkpoints")})
            print(f"{name} on {n:,} events, {backend} {guarantee}: "
                  f"{out[-1]['per_core']:,.0f} events/s per core, "
                  f"{out[-1]['checkpoints']:g} checkpoints", flush=True)
    return out


@click.command()
@click.option("--quick", is_flag=True, help="Small sizes (a few minutes on 2 cores).")
@click.option("--runs", default=3, show_default=True, help="Runs per configuration.")
@click.option("--queries", default=",".join(QUERIES), show_default=True)
@click.option("--events", type=int, default=None, help="Events per run (overrides the sizes).")
@click.option("--long-queries", default=",".join(LONG), show_default=True,
              help="Queries also run LONG_FACTOR times longer, for their memory ('': none).")
def main(quick: bool, runs: int, queries: str, events: int | None, long_queries: str) -> None:
    names = [q.strip() for q in queries.split(",") if q.strip()]
    longs = [q.strip() for q in long_queries.split(",") if q.strip()]
    unknown = [q for q in names + longs if q not in QUERIES]
    if unknown:
        raise click.BadParameter(f"unknown queries {unknown}; known: {sorted(QUERIES)}")
    ensure_ray(None, include_dashboard=False)
    sizes = {"stateless": 150_000 if quick else 2_000_000,
             "stateful": 30_000 if quick else 400_000}
    rows, table = [], []
    # unmeasured runs first: the first jobs on a fresh Ray instance, and the first plain run
    # in this process, ran up to a fifth slower on the 2-core VM (one q0 round: rayflow
    # 1.08 M against 1.36 M events per CPU second, the plain loop 1.28 M against 1.46 M)
    if names:
        plain_run(names[0], WARM_UP_EVENTS)
        for _ in range(2):
            rayflow_run(names[0], WARM_UP_EVENTS, "memory")
    for name in names:
        q = QUERIES[name]
        n = events or sizes["stateless" if q.columnar else "stateful"]
        configs = [("memory", "exactly_once")] + (
            [("rocksdb", "exactly_once"), ("memory", "at_least_once")] if name in STATEFUL
            else [])
        with_bytewax = name in peers_nexmark.QUERIES and peers_nexmark.available()
        # interleaved rounds (the plain loop, Bytewax, each configuration once a round): a
        # slow spell of the machine falls on every system alike, not on the one then running
        plain: list[dict] = []
        bytewax: list[dict] = []
        config_runs: dict[tuple[str, str], list[dict]] = {c: [] for c in configs}
        for _ in range(runs):
            plain.append(plain_run(name, n))
            if with_bytewax:
                bytewax.append(peers_nexmark.bytewax_run(name, n))
            for backend, guarantee in configs:
                config_runs[backend, guarantee].append(
                    rayflow_run(name, n, backend, guarantee=guarantee))
        for backend, guarantee in configs:
            runs_ = config_runs[backend, guarantee]
            row = {"query": name, "events": n, "backend": backend,
                   "guarantee": guarantee, "path": "arrow" if q.columnar else "rows",
                   "runs": runs_, "plain_runs": plain,
                   "events_s": median(runs_, "events_s"), "cores": median(runs_, "cores"),
                   "per_core": median(runs_, "per_core"),
                   "peak_rss_mib": median(runs_, "peak_rss_mib"),
                   "plain_per_core": median(plain, "per_core"),
                   "flink_per_core": FLINK_PER_CORE.get(name)}
            if bytewax and (backend, guarantee) == ("memory", "exactly_once"):
                row.update(bytewax_runs=bytewax, bytewax_per_core=median(bytewax, "per_core"),
                           vs_bytewax=ratio(row["per_core"], median(bytewax, "per_core")))
            row["vs_plain"] = ratio(row["per_core"], row["plain_per_core"])
            row["vs_flink"] = ratio(row["per_core"], row["flink_per_core"])
            rows.append(row)
            table.append([name, backend, guarantee, row["path"], n, row["events_s"],
                          row["cores"], row["per_core"], row["plain_per_core"],
                          row["vs_plain"], row["flink_per_core"], row["vs_flink"],
                          row.get("bytewax_per_core"), row["peak_rss_mib"]])
            print(f"{name} {backend} {guarantee}: {row['per_core']:,.0f} events/s per core",
                  flush=True)
    print_table(f"W7 Nexmark, events/s per core (median of {runs}; machine: "
                f"{psutil.cpu_count()}-core VM, shared)",
                ["query", "state", "guarantee", "path", "events", "events/s", "cores",
                 "per core", "plain/core", "vs plain", "Flink/core", "vs Flink", "Bytewax/core",
                 "peak MiB"],
                table)
    checkpoint_rows = checkpoint_cost([q for q in names if q in STATEFUL], runs,
                                      CHECKPOINT_FACTOR * (events or sizes["stateful"]))
    long_rows = []
    for name in longs:
        n = events or sizes["stateful"]
        short = rayflow_run(name, n, "memory", config=LONG_CONFIG)
        run = rayflow_run(name, n * LONG_FACTOR, "memory", config=LONG_CONFIG)
        long_rows.append({"query": name, "events": n, "long_events": n * LONG_FACTOR,
                          "event_time_s": n / LONG_CONFIG.first_event_rate,
                          "peak_rss_mib": short["peak_rss_mib"],
                          "long_peak_rss_mib": run["peak_rss_mib"],
                          "growth": ratio(run["peak_rss_mib"], short["peak_rss_mib"]),
                          "short_run": short, "long_run": run})
        print(f"{name}: peak {short['peak_rss_mib']:,.0f} MiB at {n:,} events, "
              f"{run['peak_rss_mib']:,.0f} MiB at {n * LONG_FACTOR:,}", flush=True)
    path = write_result("nexmark",
                        {"quick": quick, "runs_per_config": runs, "config": repr(CONFIG),
                         "flink_per_core": FLINK_PER_CORE, "rows": rows,
                         "checkpoint_cost": {"factor": CHECKPOINT_FACTOR, "interval_s": 1.0,
                                             "rows": checkpoint_rows},
                         "long_factor": LONG_FACTOR, "long_config": repr(LONG_CONFIG),
                         "long": long_rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
