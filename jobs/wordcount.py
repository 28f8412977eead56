"""W4 windowed word count: JSON sentences from Kafka, count windows of 10 per word, to Kafka.

Input ``{"msgId", "eventTime", "sentence"}``; output per window
``{"word", "window", "count", "minEventTime", "maxEventTime", "minInTime", "maxInTime",
"outTime"}``. Malformed JSON, missing fields and oversize records go to the dead-letter output.

    python jobs/wordcount.py --records 50000 --guarantee exactly_once
    ray job submit --working-dir . -- python jobs/wordcount.py --address auto --bootstrap HOST:9092
"""

from __future__ import annotations

import json
import time

import click

import rayflow as rf
from rayflow.connectors.kafka import count_records, create_topic, produce
from rayflow.operators.windows import CountWindow, MinMax

MAX_RECORD_BYTES = 10_000
WORDS = ("stream batch window state barrier kafka ray actor rank block matrix vector "
         "latency throughput checkpoint").split()


def parse(record: bytes) -> list[tuple[str, float, float]]:
    """One JSON sentence -> (word, eventTime, inTime) per word; raises on bad input."""
    if len(record) > MAX_RECORD_BYTES:
        raise ValueError(f"oversize record: {len(record)} bytes > {MAX_RECORD_BYTES}")
    msg = json.loads(record)
    if not isinstance(msg, dict):
        raise ValueError("record is not a JSON object")
    missing = [f for f in ("msgId", "eventTime", "sentence") if f not in msg]
    if missing:
        raise ValueError(f"missing fields: {', '.join(missing)}")
    now = time.time()
    event_time = float(msg["eventTime"])
    return [(w, event_time, now) for w in str(msg["sentence"]).split()]


def to_json(result) -> bytes:
    v = result.value
    return json.dumps({
        "word": result.key, "window": int(result.start), "count": v["count"],
        "minEventTime": v["min_eventTime"], "maxEventTime": v["max_eventTime"],
        "minInTime": v["min_inTime"], "maxInTime": v["max_inTime"], "outTime": time.time(),
    }).encode()


def build_flow(input_topic: str, output_topic: str, bootstrap: str, parallelism: int = 1,
               window: int = 10, name: str = "wordcount", bounded: bool = True,
               client: str = "kafka-python") -> rf.Dataflow:
    flow = rf.Dataflow(name)
    (flow.source("source", rf.KafkaSource(input_topic, bootstrap=bootstrap, bounded=bounded,
                                          client=client))
         .rebalance()
         .flat_map("parse", parse, parallelism=parallelism, on_error="dead_letter")
         .key_by(lambda r: r[0])
         .window("count", CountWindow(window),
                 MinMax({"eventTime": lambda r: r[1], "inTime": lambda r: r[2]}),
                 parallelism=parallelism)
         .map("format", to_json, parallelism=parallelism)
         .sink("sink", rf.KafkaSink(output_topic, bootstrap=bootstrap, client=client),
               parallelism=1))
    return flow


def sentences(n: int, seed: int = 0, words: int = 12):
    """``n`` deterministic JSON sentences of ``words`` words (about 150 bytes each)."""
    import random

    rnd = random.Random(seed)
    t0 = 1_700_000_000.0
    for i in range(n):
        text = " ".join(rnd.choice(WORDS) for _ in range(words))
        yield json.dumps({"msgId": i, "eventTime": t0 + i / 1000, "sentence": text}).encode()


@click.command()
@click.option("--address", default=None, help="Ray address; a private local Ray when omitted.")
@click.option("--bootstrap", default=None, help="Kafka bootstrap; the embedded broker when omitted.")
@click.option("--input", "input_topic", default="w4-in", show_default=True)
@click.option("--output", "output_topic", default="w4-out", show_default=True)
@click.option("--records", default=20_000, show_default=True, help="sentences to pre-fill")
@click.option("--parallelism", default=1, show_default=True, help="parser and window instances")
@click.option("--guarantee", type=click.Choice(["at_most_once", "at_least_once", "exactly_once"]),
              default="at_least_once", show_default=True)
@click.option("--state-backend", type=click.Choice(["memory", "filesystem", "rocksdb"]),
              default="memory", show_default=True)
@click.option("--state-dir", default=None, help="snapshot directory (filesystem, rocksdb)")
def main(address, bootstrap, input_topic, output_topic, records, parallelism, guarantee,
         state_backend, state_dir):
    broker = None
    if bootstrap is None:
        broker = rf.EmbeddedBroker().start()
        bootstrap = broker.bootstrap
    try:
        create_topic(bootstrap, input_topic, 1)
        create_topic(bootstrap, output_topic, 1)
        if records:
            produce(bootstrap, input_topic, sentences(records))
            produce(bootstrap, input_topic, [b"{not json", b'{"msgId": 1}', b"x" * 20_000])
        flow = build_flow(input_topic, output_topic, bootstrap, parallelism)
        job = rf.run(flow, ray={"address": address}, checkpoint={
            "processing_guarantee": guarantee, "state_backend": state_backend,
            "state_dir": state_dir, "interval_s": 1.0})
        m = job.metrics()
        print(json.dumps({
            "job": "wordcount", "guarantee": guarantee, "state_backend": state_backend,
            "sentences": m["source"]["records_out"], "windows": m["sink"]["records_in"],
            "dead_letters": m["parse"]["dead_letters"],
            "throughput_rec_s": round(m["source"]["records_out"] / max(
                1e-9, job.finished_at - job.ready_at)),
            "latency": job.latency(), "checkpoints": len(job.checkpoints()),
            "written": count_records(bootstrap, output_topic, "read_committed"),
        }, indent=2))
    finally:
        if broker:
            broker.stop()


if __name__ == "__main__":
    main()
