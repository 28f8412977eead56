"""W2 Identity (and W3 Sleep with --sleep-ms): Kafka in, stamp, Kafka out.

Input records are ``msgId,eventTime``; the job writes ``msgId,eventTime,inTime,outTime``.

    python jobs/identity.py --records 200000                 # embedded Ray and Kafka
    ray job submit --working-dir . -- python jobs/identity.py --address auto \\
        --bootstrap kafka:9092 --input in --output out
"""

from __future__ import annotations

import json
import time
import uuid

import click

import rayflow as rf
from rayflow.connectors.broker import bootstrap_or_embedded
from rayflow.connectors.kafka import count_records, create_topic, produce


def build_flow(input_topic: str, output_topic: str, bootstrap: str, partitions: int,
               sleep_ms: float = 0.0, parallelism: int = 1, client: str = "confluent"):
    """The W2/W3 dataflow: source -> (sleep) -> stamped sink."""
    flow = rf.Dataflow("sleep" if sleep_ms else "identity")
    stream = flow.source(
        "source", rf.KafkaSource(input_topic, bootstrap=bootstrap, bounded=True, client=client),
        parallelism=min(parallelism, partitions))
    if sleep_ms:
        delay = sleep_ms / 1000.0

        def sleep(record):
            time.sleep(delay)
            return record

        stream = stream.rebalance().map("sleep", sleep, parallelism=parallelism)
    stream.sink("sink", rf.KafkaSink(output_topic, bootstrap=bootstrap, stamp=stamp,
                                     client=client), parallelism=1)
    return flow


def stamp(record: bytes, in_time: float, out_time: float) -> bytes:
    """``msgId,eventTime`` -> ``msgId,eventTime,inTime,outTime`` (ms since the epoch)."""
    return b"%s,%d,%d" % (record, in_time * 1000, out_time * 1000)


def messages(n: int):
    now = time.time()
    return (b"%d,%d" % (i, now * 1000) for i in range(n))


@click.command()
@click.option("--address", default=None, help="Ray address; a private local Ray when omitted.")
@click.option("--bootstrap", default=None, help="Kafka bootstrap; the embedded broker when omitted.")
@click.option("--input", "input_topic", default=None,
              help="input topic (default: a new w2-in-RUN topic, so a run never counts another's)")
@click.option("--output", "output_topic", default=None,
              help="output topic (default: a new w2-out-RUN topic)")
@click.option("--records", default=100_000, show_default=True, help="records to pre-fill (0: none)")
@click.option("--partitions", default=1, show_default=True)
@click.option("--sleep-ms", default=0.0, show_default=True, help="W3: sleep per record")
@click.option("--parallelism", default=1, show_default=True)
@click.option("--client", type=click.Choice(["confluent", "kafka-python"]), default="confluent")
def main(address, bootstrap, input_topic, output_topic, records, partitions, sleep_ms,
         parallelism, client):
    run = uuid.uuid4().hex[:8]
    input_topic = input_topic or f"w2-in-{run}"
    output_topic = output_topic or f"w2-out-{run}"
    with bootstrap_or_embedded(bootstrap) as bootstrap:
        create_topic(bootstrap, input_topic, partitions)
        create_topic(bootstrap, output_topic, 1)
        if records:
            produce(bootstrap, input_topic, messages(records), partitions)
        flow = build_flow(input_topic, output_topic, bootstrap, partitions, sleep_ms,
                          parallelism, client)
        job = rf.run(flow, ray={"address": address})
        m = job.metrics()
        summary = {
            "job": flow.name,
            "records": m["sink"]["records_in"],
            "throughput_rec_s": round(job.throughput()),
            # up to the sink's final flush: the records are in Kafka
            "delivered_rec_s": round(job.throughput(delivered=True)),
            # from each record's event time (its Kafka timestamp): for a topic filled
            # before the run, mostly the time it waited there, not processing time
            "latency_since_event_ms": job.latency(),
            "startup_s": round(job.startup_s, 2),
            "written": count_records(bootstrap, output_topic),
        }
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
