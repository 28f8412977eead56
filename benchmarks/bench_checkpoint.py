"""Checkpoint duration under load: how long a barrier takes to cross a busy exactly-once job.

    python benchmarks/bench_checkpoint.py [--quick] [--rounds R] [--sentences N]

The workload: JSON sentences in 4 Kafka partitions, parse, a keyed count window of 10,
format, an exactly-once Kafka sink, parallelism 2, a checkpoint every 0.5 s, the embedded
broker and a private local Ray. An aligned barrier travels behind the batches already in
flight, so its checkpoint takes about as long as the work queued in the channels. Compared in
interleaved rounds on the same topic:

- ``aligned``: the defaults (aligned barriers, ``channel_calls=2`` batches in flight per
  channel, and, as in every exactly-once job with aligned checkpoints, channels and source
  batches debloated to a fifth of the interval: ``channel_target_s`` 0.1 s here), the
  baseline;
- ``not debloated``: aligned, ``channel_target_s=0``: full source batches and 2 calls in
  flight per channel, whatever they cost;
- ``aligned, 16 calls``: not debloated, up to 16 batches in flight per channel (the default
  before ``channel_calls`` became 2): a barrier waits behind more queued work at every hop;
- ``unaligned``: ``checkpoint.unaligned``: the barrier overtakes the queued batches, which
  the checkpoint stores instead;
- ``unaligned, 2 sinks``: the same with two sink instances, each chained to a format
  instance: one sink instance is the slowest step at this load (it encodes, stores and
  commits every output record), and a barrier reaches it last;
- ``aligned, 2 sinks``: the defaults with two sink instances (every step at parallelism 2);
- ``kafka-python``: aligned, the source and the sink on ``client="kafka-python"`` (the
  pure-Python client, rayflow's default before confluent-kafka): the sink commits each
  completed checkpoint's records in one transaction, and this client's producer is slower
  than the pipeline here, so its commits fall behind and its writes wait for them
  (``max_uncommitted_bytes``).

Every other variant runs on the default client, confluent-kafka (librdkafka).

Reported: median and p90 checkpoint duration against the interval, the batches an unaligned
checkpoint held in flight, and sentences per second (sentences / the sink's span), as ratios
to the baseline. Sentences per second are *delivered*: to the sink's last commit, when
the output is visible to ``read_committed`` consumers.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import click  # noqa: E402
from _common import machine_info, print_table, ratio, write_result  # noqa: E402

import rayflow as rf  # noqa: E402
from rayflow._raycontext import ensure_ray  # noqa: E402
from rayflow.connectors.kafka import create_topic, produce  # noqa: E402
from rayflow.examples.wordcount import build_flow, sentences  # noqa: E402

INTERVAL_S = 0.5
VARIANTS = {  # name -> (stream options, checkpoint options, Kafka client, sink instances)
    "aligned": ({}, {}, None, 1),
    "not debloated": ({"channel_target_s": 0}, {}, None, 1),
    "aligned, 16 calls": ({"channel_calls": 16, "channel_target_s": 0}, {}, None, 1),
    "unaligned": ({}, {"unaligned": True}, None, 1),
    "unaligned, 2 sinks": ({}, {"unaligned": True}, None, 2),
    "aligned, 2 sinks": ({}, {}, None, 2),
    "kafka-python": ({}, {}, "kafka-python", 1),
}


def run_once(bs: str, topic: str, n: int, variant: str, batch_size: int | None) -> dict:
    out = f"chk-out-{time.time_ns()}"
    create_topic(bs, out, 2)
    stream, chk, client, sinks = VARIANTS[variant]
    flow = build_flow(topic, out, bs, 2, name=f"chk-{time.time_ns()}", client=client,
                      sink_parallelism=sinks)
    job = rf.run(flow, checkpoint={"processing_guarantee": "exactly_once",
                                   "interval_s": INTERVAL_S, **chk},
                 stream={**stream, **({"batch_size": batch_size} if batch_size else {})})
    m = job.metrics()
    # to the sink's last commit: exactly-once output counts once it is visible
    span = m["sink"]["delivered_time"] - (m["sink"]["first_in_time"] or 0)
    done = [c for c in job.checkpoints() if c["status"] == "completed"]
    d = sorted(c["duration_s"] for c in done)
    # where a checkpoint waits: the median time from its start to each task's ack
    tasks = sorted({t for c in done for t in c.get("acked_s", {})})
    acked = {t: round(statistics.median(c["acked_s"][t] for c in done if t in c["acked_s"]), 3)
             for t in tasks}
    return {"variant": variant, "checkpoints": len(d), "acked_s": acked,
            "median_s": round(statistics.median(d), 3) if d else None,
            # nearest rank: the flooring index it replaces gave a p90 below the median
            # when a run had few checkpoints
            "p90_s": round(d[math.ceil(0.9 * len(d)) - 1], 3) if d else None,
            "inflight_batches": statistics.median(c["inflight_batches"] for c in done)
            if done else None,
            "sentences_s": round(n / span) if span > 0 else None}


@click.command()
@click.option("--quick", is_flag=True, help="40k sentences, one round (a smoke run)")
@click.option("--rounds", default=2, show_default=True, help="interleaved rounds")
@click.option("--sentences", "n", default=500_000, show_default=True, help="input sentences")
@click.option("--batch-size", type=int, default=None,
              help="records per source batch (default: the job default, stream.batch_size)")
def main(quick: bool, rounds: int, n: int, batch_size: int | None) -> None:
    from rayflow.config import StreamOptions
    from rayflow.connectors.broker import EmbeddedBroker

    n = 40_000 if quick else n
    rounds = 1 if quick else rounds
    ensure_ray(None, None)
    with EmbeddedBroker() as broker:
        bs = broker.bootstrap
        topic = f"chk-in-{time.time_ns()}"
        create_topic(bs, topic, 4)
        produce(bs, topic, list(sentences(n)), partitions=4)
        runs = []
        for r in range(rounds):
            for variant in VARIANTS:  # the baseline first, every round
                res = run_once(bs, topic, n, variant, batch_size)
                res["round"] = r
                runs.append(res)
                print(res, flush=True)
    rows, summary = [], {}
    for variant in VARIANTS:
        mine = [x for x in runs if x["variant"] == variant]
        summary[variant] = {
            k: statistics.median(x[k] for x in mine if x[k] is not None)
            for k in ("median_s", "p90_s", "sentences_s", "inflight_batches")}
    base = summary["aligned"]
    for name, s in summary.items():
        rows.append([name, s["median_s"], s["p90_s"], ratio(s["median_s"], INTERVAL_S),
                     s["inflight_batches"], s["sentences_s"],
                     ratio(s["sentences_s"], base["sentences_s"])])
    print_table(f"checkpoint duration, interval {INTERVAL_S} s, {n:,} sentences, "
                f"{machine_info()['logical_cores']} cores",
                ["checkpoints", "median s", "p90 s", "median / interval", "batches stored",
                 "delivered sentences/s", "vs aligned"], rows)
    write_result("checkpoint_quick" if quick else "checkpoint",
                 {"sentences": n, "interval_s": INTERVAL_S,
                  "batch_size": batch_size or StreamOptions().batch_size,
                  "rounds": rounds, "runs": runs, **summary,
                  "median_ratio": {v: ratio(s["median_s"], base["median_s"])
                                   for v, s in summary.items()},
                  "throughput_ratio": {v: ratio(s["sentences_s"], base["sentences_s"])
                                       for v, s in summary.items()}})


if __name__ == "__main__":
    main()
