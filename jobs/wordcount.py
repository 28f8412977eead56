"""W4 windowed word count: JSON sentences from Kafka, count windows of 10 per word, to Kafka.

Input ``{"msgId", "eventTime", "sentence"}``; output per window
``{"word", "window", "count", "minEventTime", "maxEventTime", "minInTime", "maxInTime",
"outTime"}``. Malformed JSON, missing fields and oversize records go to the dead-letter output.

    python jobs/wordcount.py --records 50000 --guarantee exactly_once
    ray job submit --working-dir . -- python jobs/wordcount.py --address auto --bootstrap HOST:9092
"""

from __future__ import annotations

import json
import uuid

import click

import rayflow as rf
from rayflow.connectors.broker import bootstrap_or_embedded
from rayflow.connectors.kafka import count_records, create_topic, produce
from rayflow.examples.wordcount import build_flow, sentences


@click.command()
@click.option("--address", default=None, help="Ray address; a private local Ray when omitted.")
@click.option("--bootstrap", default=None, help="Kafka bootstrap; the embedded broker when omitted.")
@click.option("--input", "input_topic", default=None,
              help="input topic (default: a new w4-in-RUN topic, so a run never counts another's)")
@click.option("--output", "output_topic", default=None,
              help="output topic (default: a new w4-out-RUN topic)")
@click.option("--records", default=20_000, show_default=True, help="sentences to pre-fill")
@click.option("--parallelism", default=1, show_default=True, help="parser and window instances")
@click.option("--guarantee", type=click.Choice(["at_most_once", "at_least_once", "exactly_once"]),
              default="at_least_once", show_default=True)
@click.option("--state-backend", type=click.Choice(["memory", "filesystem", "rocksdb"]),
              default="memory", show_default=True)
@click.option("--state-dir", default=None, help="snapshot directory (filesystem, rocksdb)")
def main(address, bootstrap, input_topic, output_topic, records, parallelism, guarantee,
         state_backend, state_dir):
    run = uuid.uuid4().hex[:8]
    input_topic = input_topic or f"w4-in-{run}"
    output_topic = output_topic or f"w4-out-{run}"
    with bootstrap_or_embedded(bootstrap) as bootstrap:
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
                1e-9, m["sink"]["last_out_time"] - (m["sink"]["first_in_time"] or 0))),
            # up to the sink's final flush or (exactly-once) last commit: visible in Kafka
            "delivered_rec_s": round(m["source"]["records_out"] / max(
                1e-9, m["sink"]["delivered_time"] - (m["sink"]["first_in_time"] or 0))),
            # from each record's event time (its Kafka timestamp): for a topic filled
            # before the run, mostly the time it waited there, not processing time
            "latency_since_event_ms": job.latency(), "checkpoints": len(job.checkpoints()),
            "written": count_records(bootstrap, output_topic, "read_committed"),
        }, indent=2))


if __name__ == "__main__":
    main()
