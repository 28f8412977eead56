"""W2 Identity and W3 Sleep (seed 003: Flink vs Storm), with same-run baselines.

    python benchmarks/bench_identity.py [--quick]

Measures, on the embedded Tansu broker and a private local Ray:
  1. in-memory throughput, parallelism 1: a per-record Python function, beside a bare
     single-process loop doing the same per-record work (a columnar identity that passes one
     numpy array by reference through a chain measures nothing, so there is none; one that
     crosses an actor boundary and a Kafka round trip needs a quiet machine to measure);
  2. Kafka throughput from a pre-filled topic (1 and 8 partitions), kafka-python and
     confluent-kafka, beside a plain consume -> stamp -> produce loop with the same client;
  3. latency p50/p99 at 25/50/75/90 % of the measured capacity, in memory and through Kafka;
  4. Sleep (1 ms per record) at parallelism 1, 2, 4, 8;
  5. job start-up time on a running Ray.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import click  # noqa: E402
from _common import print_table, ratio, write_result  # noqa: E402
from report.published import W2_IDENTITY as PUBLISHED  # noqa: E402

import rayflow as rf  # noqa: E402
from rayflow._raycontext import ensure_ray  # noqa: E402
from rayflow.connectors.kafka import count_records, create_topic, produce  # noqa: E402


def w2_stamp(record: bytes) -> bytes:
    """The per-record work of W2: split ``msgId,eventTime`` and append the stamps."""
    msg_id, event_time = record.split(b",")
    now = time.time()
    return b"%s,%s,%d,%d" % (msg_id, event_time, now * 1000, now * 1000)


def _messages(n: int) -> list[bytes]:
    now = int(time.time() * 1000)
    return [b"%d,%d" % (i, now) for i in range(n)]


# -- 1. in memory ----------------------------------------------------------------------------

def bare_loop(records: list[bytes]) -> float:
    t0 = time.perf_counter()
    out = []
    append = out.append
    for r in records:
        append(w2_stamp(r))
    return len(records) / (time.perf_counter() - t0)


def in_memory(n: int) -> dict:
    records = _messages(n)
    per = rf.Dataflow("w2-per-record")
    (per.source("source", rf.MemorySource(records))
        .map("stamp", w2_stamp)
        .sink("sink", rf.DiscardSink()))
    job_per = rf.run(per)
    loop = max(bare_loop(records) for _ in range(3))
    return {"per_record_rec_s": round(job_per.throughput()),
            "bare_loop_rec_s": round(loop),
            "per_record_vs_loop": ratio(job_per.throughput(), loop),
            "startup_s": round(job_per.startup_s, 2)}


# -- 2. Kafka throughput ---------------------------------------------------------------------

def plain_kafka_loop(bootstrap: str, topic_in: str, topic_out: str, n: int, client: str) -> float:
    """Single process: consume -> stamp -> produce, as fast as the client goes."""
    t0 = time.perf_counter()
    done = 0
    if client == "confluent":
        from confluent_kafka import Consumer, Producer, TopicPartition

        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "plain", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest"})
        md = c.list_topics(topic_in, timeout=10).topics[topic_in]
        c.assign([TopicPartition(topic_in, p, 0) for p in md.partitions])
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        while done < n:
            for m in c.consume(10000, 0.1):
                while True:
                    try:
                        p.produce(topic_out, w2_stamp(m.value()))
                        break
                    except BufferError:
                        p.poll(0.01)
                done += 1
            p.poll(0)
        p.flush()
        c.close()
    else:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                          auto_offset_reset="earliest", max_poll_records=100_000,
                          fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20)
        c.assign([TopicPartition(topic_in, p) for p in c.partitions_for_topic(topic_in)])
        c.seek_to_beginning()
        p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 20)
        while done < n:
            for _, recs in c.poll(100, max_records=10000).items():
                for r in recs:
                    p.send(topic_out, w2_stamp(r.value))
                done += len(recs)
        p.flush()
        c.close()
        p.close()
    return n / (time.perf_counter() - t0)


def kafka_throughput(bootstrap: str, n: int, partitions: int, client: str) -> dict:
    tag = f"{client}-{partitions}p-{time.time_ns()}"
    t_in, t_out, t_base = f"in-{tag}", f"out-{tag}", f"base-{tag}"
    create_topic(bootstrap, t_in, partitions)
    create_topic(bootstrap, t_out, 1)
    create_topic(bootstrap, t_base, 1)
    produce(bootstrap, t_in, _messages(n), partitions, client="confluent")
    flow = rf.Dataflow(f"w2-kafka-{partitions}p")
    (flow.source("source", rf.KafkaSource(t_in, bootstrap=bootstrap, bounded=True, client=client))
         .map("stamp", w2_stamp)
         .sink("sink", rf.KafkaSink(t_out, bootstrap=bootstrap, client=client)))
    job = rf.run(flow)
    ours = job.throughput()
    written = count_records(bootstrap, t_out)
    base = plain_kafka_loop(bootstrap, t_in, t_base, n, client)
    return {"client": client, "partitions": partitions, "records": n,
            "ours_rec_s": round(ours), "plain_loop_rec_s": round(base),
            "ratio_vs_loop": ratio(ours, base), "written": written,
            "vs_flink": ratio(ours, PUBLISHED["flink_rec_s"]),
            "vs_storm": ratio(ours, PUBLISHED["storm_rec_s"])}


# -- 3. latency ------------------------------------------------------------------------------

def latency_in_memory(rate: float, seconds: float) -> dict:
    flow = rf.Dataflow("w2-latency-memory")
    now = int(time.time() * 1000)
    (flow.source("source", rf.GeneratorSource(lambda i: b"%d,%d" % (i, now), rate=rate))
         .map("stamp", w2_stamp)
         .sink("sink", rf.DiscardSink()))
    job = rf.run(flow, background=True, stream={"latency_sample_every": 4})
    time.sleep(seconds)
    job.stop()
    return {**job.latency(skip_s=1.0), "achieved_rec_s": round(job.throughput())}


def latency_kafka(bootstrap: str, rate: float, seconds: float, client: str) -> dict:
    tag = f"lat-{client}-{time.time_ns()}"
    create_topic(bootstrap, f"in-{tag}", 1)
    create_topic(bootstrap, f"out-{tag}", 1)
    flow = rf.Dataflow("w2-latency-kafka")
    (flow.source("source", rf.KafkaSource(f"in-{tag}", bootstrap=bootstrap, start="latest",
                                          client=client))
         .map("stamp", w2_stamp)
         .sink("sink", rf.KafkaSink(f"out-{tag}", bootstrap=bootstrap, client=client)))
    job = rf.run(flow, background=True, stream={"latency_sample_every": 4})
    time.sleep(1.0)
    stop = threading.Event()

    def load():  # the load generator: confluent-kafka, cheap per record, paced in 5 ms steps
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        t0, sent = time.time(), 0
        while not stop.is_set():
            due = int((time.time() - t0) * rate)
            now = int(time.time() * 1000)
            for i in range(sent, due):
                while True:
                    try:
                        p.produce(f"in-{tag}", b"%d,%d" % (i, now))
                        break
                    except BufferError:
                        p.poll(0.005)
            sent = due
            p.poll(0)
            time.sleep(0.005)
        p.flush()

    th = threading.Thread(target=load, daemon=True)
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join()
    time.sleep(0.5)
    job.stop()
    return {**job.latency(skip_s=1.0), "achieved_rec_s": round(job.throughput())}


# -- 4. sleep --------------------------------------------------------------------------------

def sleep_scaling(parallelism: int, seconds: float) -> dict:
    n = int(900 * parallelism * seconds)

    def nap(r):
        time.sleep(0.001)
        return r

    flow = rf.Dataflow(f"w3-sleep-{parallelism}")
    (flow.source("source", rf.MemorySource(_messages(n)))
         .rebalance()
         .map("sleep", nap, parallelism=parallelism)
         .sink("sink", rf.DiscardSink()))
    job = rf.run(flow, stream={"batch_size": 64})
    rate = job.throughput()
    return {"parallelism": parallelism, "records": n, "rec_s": round(rate),
            "rec_s_per_instance": round(rate / parallelism)}


@click.command()
@click.option("--quick", is_flag=True, help="Small sizes for a check.")
def main(quick: bool) -> None:
    n_mem = 200_000 if quick else 1_000_000
    n_kafka = 50_000 if quick else 300_000
    secs = 3.0 if quick else 6.0
    ensure_ray(None)
    broker = rf.EmbeddedBroker().start()
    bs = broker.bootstrap
    result: dict = {"published": PUBLISHED, "quick": quick}
    try:
        mem = in_memory(n_mem)
        result["in_memory"] = mem
        print_table("W2 in memory, parallelism 1 (rec/s)",
                    ["per-record", "bare loop", "per-record / loop", "startup s"],
                    [[mem["per_record_rec_s"], mem["bare_loop_rec_s"],
                      mem["per_record_vs_loop"], mem["startup_s"]]])
        kafka_rows = []
        clients = ["kafka-python", "confluent"]
        for client in clients:
            for parts in (1, 8):
                kafka_rows.append(kafka_throughput(bs, n_kafka if client == "kafka-python"
                                                   else 2 * n_kafka, parts, client))
        result["kafka"] = kafka_rows
        print_table("W2 through Kafka, parallelism 1 (rec/s)",
                    ["client", "partitions", "ours", "plain loop", "ratio", "Storm", "Flink"],
                    [[r["client"], r["partitions"], r["ours_rec_s"], r["plain_loop_rec_s"],
                      r["ratio_vs_loop"], PUBLISHED["storm_rec_s"], PUBLISHED["flink_rec_s"]]
                     for r in kafka_rows])
        lat_rows = []
        cap_mem = mem["per_record_rec_s"]
        cap_kafka = {c: max(r["ours_rec_s"] for r in kafka_rows if r["client"] == c)
                     for c in clients}
        for frac in (0.25, 0.5, 0.75, 0.9):
            lat_rows.append({"path": "memory", "load": frac, "rate": round(cap_mem * frac),
                             **latency_in_memory(cap_mem * frac, secs)})
        for client in clients:
            for frac in (0.25, 0.5, 0.75, 0.9):
                rate = cap_kafka[client] * frac
                lat_rows.append({"path": f"kafka/{client}", "load": frac, "rate": round(rate),
                                 **latency_kafka(bs, rate, secs, client)})
        result["latency"] = lat_rows
        print_table("W2 latency outTime - eventTime (ms); published at full load: "
                    "Flink 50/300, Storm 100/700",
                    ["path", "load", "target rec/s", "achieved", "p50 ms", "p99 ms"],
                    [[r["path"], r["load"], r["rate"], r["achieved_rec_s"], r["p50_ms"],
                      r["p99_ms"]] for r in lat_rows])
        sleep_rows = [sleep_scaling(p, secs / 2) for p in (1, 2, 4, 8)]
        base = sleep_rows[0]["rec_s"]
        for r in sleep_rows:
            r["scaling_efficiency"] = ratio(r["rec_s"], base * r["parallelism"])
        result["sleep"] = sleep_rows
        print_table("W3 Sleep 1 ms per record (published ~900 rec/s per thread)",
                    ["parallelism", "rec/s", "per instance", "efficiency"],
                    [[r["parallelism"], r["rec_s"], r["rec_s_per_instance"],
                      r["scaling_efficiency"]] for r in sleep_rows])
    finally:
        broker.stop()
    path = write_result("identity_quick" if quick else "identity", result)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
