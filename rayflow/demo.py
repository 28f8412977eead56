"""``rayflow demo``: the capabilities end to end on embedded defaults, with a summary table."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

import rayflow as rf
from rayflow.connectors.kafka import count_records, create_topic, produce


def _in_memory(n: int) -> dict[str, Any]:
    lines = [f"the quick brown fox {i % 97} jumps" for i in range(n)]
    flow = rf.Dataflow("demo-memory")
    (flow.source("lines", rf.MemorySource(lines))
         .flat_map("split", str.split)
         .key_by(lambda w: w)
         .filter("numbers", str.isdigit, parallelism=2)
         .map("to_int", int)
         .sink("out", rf.CollectSink()))
    job = rf.run(flow)
    out = job.collect("out")
    expected = sorted(int(w) for line in lines for w in line.split() if w.isdigit())
    return {"demo": "in-memory flat_map/key_by/filter", "records": n,
            "rate_rec_s": round(job.throughput()), "p99_ms": job.latency()["p99_ms"],
            "check": "ok" if sorted(out) == expected else "MISMATCH"}


def _kafka_identity(bootstrap: str, n: int) -> dict[str, Any]:
    topic_in, topic_out = f"demo-in-{time.time_ns()}", f"demo-out-{time.time_ns()}"
    create_topic(bootstrap, topic_in, 2)
    create_topic(bootstrap, topic_out, 1)
    produce(bootstrap, topic_in, (b"%d,%d" % (i, time.time() * 1000) for i in range(n)), 2)
    flow = rf.Dataflow("demo-kafka")
    (flow.source("source", rf.KafkaSource(topic_in, bootstrap=bootstrap, bounded=True),
                 parallelism=2)
         .sink("sink", rf.KafkaSink(topic_out, bootstrap=bootstrap,
                                    stamp=lambda r, i, o: b"%s,%d,%d" % (r, i * 1e3, o * 1e3))))
    job = rf.run(flow)
    written = count_records(bootstrap, topic_out)
    return {"demo": "Kafka identity (W2)", "records": n, "rate_rec_s": round(job.throughput()),
            "p99_ms": job.latency()["p99_ms"], "check": "ok" if written == n else "MISMATCH"}


def run_demo(quick: bool = False, address: str | None = None,
             bootstrap: str | None = None) -> list[dict[str, Any]]:
    """Run every demo and print a table; returns the rows."""
    from rayflow._raycontext import ensure_ray

    console = Console()
    scale = 1 if quick else 5
    broker = None
    rows = []
    with console.status("starting Ray and the embedded Kafka broker"):
        ensure_ray(address)
        if bootstrap is None:
            broker = rf.EmbeddedBroker().start()
            bootstrap = broker.bootstrap
    try:
        for title, fn in [("in-memory stream", lambda: _in_memory(20_000 * scale)),
                          ("Kafka identity", lambda: _kafka_identity(bootstrap, 20_000 * scale))]:
            with console.status(f"running {title}"):
                t0 = time.time()
                row = fn()
                row["wall_s"] = round(time.time() - t0, 1)
                rows.append(row)
            console.log(f"{title}: {row['check']}")
    finally:
        if broker:
            broker.stop()
    table = Table(title="rayflow demo")
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
    return rows
