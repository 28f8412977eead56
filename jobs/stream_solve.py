"""Streams and MPI stages in one program: per-sensor least-squares fits, each window solved
by conjugate gradients on a gang of ranks, results to Kafka exactly once.

sensor rows -> key_by(sensor) -> count window of R rows -> CG stage on a reused gang
(normal equations X'X b = X'y) -> JSON -> Kafka (exactly-once, read_committed)

    python jobs/stream_solve.py --windows 40 --rows 400 --features 32
"""

from __future__ import annotations

import json

import click

import rayflow as rf
from rayflow.connectors.broker import bootstrap_or_embedded
from rayflow.examples.stream_solve import build_flow


@click.command()
@click.option("--address", default=None, help="Ray address; a private local Ray when omitted.")
@click.option("--bootstrap", default=None, help="Kafka bootstrap; the embedded broker when omitted.")
@click.option("--output", "output_topic", default="fits", show_default=True)
@click.option("--windows", default=20, show_default=True)
@click.option("--rows", default=400, show_default=True, help="rows per window")
@click.option("--features", default=32, show_default=True)
@click.option("--ranks", default=2, show_default=True)
@click.option("--rebuild-gang", is_flag=True, help="start a gang per window (for comparison)")
def main(address, bootstrap, output_topic, windows, rows, features, ranks, rebuild_gang):
    from rayflow.connectors.kafka import count_records, create_topic

    with bootstrap_or_embedded(bootstrap) as bootstrap:
        create_topic(bootstrap, output_topic, 1)
        flow = build_flow(rf.KafkaSink(output_topic, bootstrap=bootstrap), windows, rows,
                          features, ranks=ranks, reuse_gang=not rebuild_gang)
        job = rf.run(flow, ray={"address": address},
                     checkpoint={"processing_guarantee": "exactly_once", "interval_s": 1.0})
        wall = job.finished_at - job.ready_at
        print(json.dumps({
            "job": "stream_solve", "windows": job.metrics()["out"]["records_in"],
            "windows_per_s": round(windows / wall, 2), "latency": job.latency(),
            "committed": count_records(bootstrap, output_topic, "read_committed"),
        }, indent=2))


if __name__ == "__main__":
    main()
