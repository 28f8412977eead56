"""W7 Nexmark through Kafka: events/s per core of queries that read their events from a
Kafka topic, beside a plain loop that reads the same topic.

    python benchmarks/bench_nexmark_kafka.py [--quick] [--runs 3] [--queries q0,q5]
                                             [--bootstrap HOST:PORT]

The events (the generator's, as in :mod:`bench_nexmark`) are pre-filled as JSON into a topic
of one partition (:func:`rayflow.nexmark.fill_kafka`) on the embedded broker (or
``--bootstrap``). Each rayflow run reads the topic to its end with a bounded ``KafkaSource``
and :func:`rayflow.nexmark.decode` (event dicts: the rows path), parallelism 1, exactly-once
checkpoints every second on the memory backend, into a discarding sink; per core = events /
CPU seconds of the driver and the job's worker processes while it runs (start-up apart), as
in :mod:`bench_nexmark`. The baseline is one process that reads the same topic with the same
client and settings (confluent-kafka, as rayflow's connectors set it), decodes the same
JSON and runs the query's plain-Python reference (which also sorts its output): per core =
events / its CPU seconds, the client's threads included. The two run in interleaved rounds
(plain, rayflow, plain, rayflow ...); medians of ``--runs``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import click  # noqa: E402
from _common import print_table, ratio, write_result  # noqa: E402
from _streams import _consumer, new_topic  # noqa: E402
from bench_nexmark import CONFIG, median, metered_run  # noqa: E402
from report.published import W7_FLINK_PER_CORE as FLINK_PER_CORE  # noqa: E402

import rayflow as rf  # noqa: E402
from rayflow._raycontext import ensure_ray  # noqa: E402
from rayflow.connectors.broker import bootstrap_or_embedded  # noqa: E402
from rayflow.nexmark import QUERIES, decode, fill_kafka, nexmark_flow  # noqa: E402

QUERIES_THROUGH_KAFKA = ("q0", "q1", "q2", "q5", "q13", "q20")


def rayflow_kafka_run(query: str, n: int, bootstrap: str, topic: str) -> dict:
    """One run reading the pre-filled ``topic`` (``n`` events) to its end."""
    source = rf.KafkaSource(topic, bootstrap=bootstrap, bounded=True, deserializer=decode)
    flow = nexmark_flow(query, CONFIG, sink=rf.DiscardSink(), source=source,
                        name=f"nexmark-{query}-kafka-{time.time_ns()}")
    figures, job = metered_run(flow, n)
    got = job.metrics()["events"]["records_out"]
    if got != n:
        raise RuntimeError(f"{query} through Kafka read {got} events of {n}")
    return figures


def plain_kafka_run(query: str, n: int, bootstrap: str, topic: str) -> dict:
    """The baseline through Kafka: this one process reads the topic with the client rayflow's
    source uses, decodes each event and runs the query's reference on them."""
    t0, c0 = time.perf_counter(), time.process_time()
    poll, close = _consumer("confluent", bootstrap, topic)
    events: list = []
    deadline = time.monotonic() + 300
    while len(events) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"plain {query} through Kafka read {len(events)} events of {n}")
        events.extend(map(decode, poll()))
    close()
    result = QUERIES[query].reference(events)
    out = len(result)
    del events, result  # freed inside the clock, as a job frees its batches
    cpu = time.process_time() - c0
    return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu, "per_core": n / cpu,
            "outputs": out}


def kafka_section(names: list[str], n: int, runs: int, bootstrap: str | None) -> list[dict]:
    """Each query through Kafka beside its plain loop, in interleaved rounds."""
    rows = []
    with bootstrap_or_embedded(bootstrap) as bs:
        topic = new_topic(bs, "nexmark-events")
        fill_kafka(bs, topic, CONFIG, n)
        for name in names:
            mine, plain = [], []
            for _ in range(runs):
                plain.append(plain_kafka_run(name, n, bs, topic))
                mine.append(rayflow_kafka_run(name, n, bs, topic))
            row = {"query": name, "events": n, "backend": "memory",
                   "guarantee": "exactly_once", "path": "rows", "source": "kafka",
                   "client": "confluent", "runs": mine, "plain_runs": plain,
                   "events_s": median(mine, "events_s"), "cores": median(mine, "cores"),
                   "per_core": median(mine, "per_core"),
                   "peak_rss_mib": median(mine, "peak_rss_mib"),
                   "plain_per_core": median(plain, "per_core"),
                   "flink_per_core": FLINK_PER_CORE.get(name)}
            row["vs_plain"] = ratio(row["per_core"], row["plain_per_core"])
            row["vs_flink"] = ratio(row["per_core"], row["flink_per_core"])
            rows.append(row)
            print(f"{name} through Kafka: {row['per_core']:,.0f} events/s per core "
                  f"(plain loop {row['plain_per_core']:,.0f})", flush=True)
    return rows


@click.command()
@click.option("--quick", is_flag=True, help="30,000 events a run (a minute or two on 2 cores).")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1),
              help="Rounds (each query once a round, plain loop and rayflow).")
@click.option("--queries", default=",".join(QUERIES_THROUGH_KAFKA), show_default=True)
@click.option("--events", type=click.IntRange(1), default=None,
              help="Events in the topic (default 200,000).")
@click.option("--bootstrap", default=None, help="Kafka bootstrap (embedded broker if omitted).")
def main(quick: bool, runs: int, queries: str, events: int | None,
         bootstrap: str | None) -> None:
    names = [q.strip() for q in queries.split(",") if q.strip()]
    unknown = [q for q in names if q not in QUERIES]
    if unknown or not names:
        raise click.BadParameter(f"unknown queries {unknown}; known: {sorted(QUERIES)}")
    ensure_ray(None, include_dashboard=False)
    n = events or (30_000 if quick else 200_000)
    rows = kafka_section(names, n, runs, bootstrap)
    print_table(f"W7 Nexmark through Kafka, events/s per core (median of {runs})",
                ["query", "events", "events/s", "cores", "per core", "plain/core",
                 "vs plain", "Flink/core", "vs Flink"],
                [[r["query"], r["events"], r["events_s"], r["cores"], r["per_core"],
                  r["plain_per_core"], r["vs_plain"], r["flink_per_core"], r["vs_flink"]]
                 for r in rows])
    path = write_result("nexmark_kafka" if not quick else "nexmark_kafka_quick",
                        {"quick": quick, "runs_per_config": runs, "config": repr(CONFIG),
                         "client": "confluent", "flink_per_core": FLINK_PER_CORE,
                         "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
