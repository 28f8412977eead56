"""Kafka in and out through rayflow jobs on the embedded broker."""

import time
from collections import defaultdict

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

import rayflow as rf


def _produce(bootstrap, topic, records):
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for part, value in records:
        p.send(topic, value, partition=part)
    p.flush()
    p.close()


def _read_all(bootstrap, topic, partitions, expect, timeout_s=20):
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
    got, deadline = [], time.time() + timeout_s
    while len(got) < expect and time.time() < deadline:
        for tp, recs in c.poll(200).items():
            got.extend((tp.partition, r.key, r.value) for r in recs)
    c.close()
    return got


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_round_trip_keeps_counts_and_order_per_partition(ray_session, kafka_broker, new_topic,
                                                         client):
    if client == "confluent":
        pytest.importorskip("confluent_kafka")
    bs = kafka_broker.bootstrap
    src, dst = new_topic(4), new_topic(3)
    n = 4000
    _produce(bs, src, [(i % 4, f"{i % 4},{i // 4}".encode()) for i in range(n)])
    f = rf.Dataflow(f"kafka-rt-{client}")
    (f.source("in", rf.KafkaSource(src, bootstrap=bs, bounded=True, client=client), parallelism=2)
      .map("upper", lambda v: v + b",x")
      .sink("out", rf.KafkaSink(dst, bootstrap=bs, key=lambda v: v.split(b",")[0],
                                client=client), parallelism=2))
    job = f.run(stream={"batch_size": 500}, timeout_s=120)
    assert job.metrics()["out"]["records_in"] == n
    got = _read_all(bs, dst, 3, n)
    assert len(got) == n
    seqs = defaultdict(list)
    for _, key, value in got:
        part, seq, tag = value.split(b",")
        assert key == part and tag == b"x"
        seqs[int(part)].append(int(seq))
    # every source partition's records arrive complete and in order
    assert {p: s for p, s in seqs.items()} == {p: list(range(n // 4)) for p in range(4)}
    assert job.latency()["samples"] > 0


def test_committed_offsets_resume_where_the_group_stopped(ray_session, kafka_broker, new_topic):
    bs = kafka_broker.bootstrap
    topic = new_topic(2)

    def run_once():
        f = rf.Dataflow("committed")
        (f.source("in", rf.KafkaSource(topic, bootstrap=bs, start="committed", group_id="g1",
                                       bounded=True))
          .sink("out", rf.CollectSink()))
        return sorted(int(v) for v in f.run(timeout_s=60).collect("out"))

    _produce(bs, topic, [(i % 2, str(i).encode()) for i in range(100)])
    assert run_once() == list(range(100))
    _produce(bs, topic, [(i % 2, str(i).encode()) for i in range(100, 150)])
    assert run_once() == list(range(100, 150))


def test_latest_skips_old_records_and_unbounded_source_stops(ray_session, kafka_broker, new_topic):
    bs = kafka_broker.bootstrap
    topic = new_topic(1)
    _produce(bs, topic, [(0, b"old")] * 10)
    f = rf.Dataflow("latest")
    f.source("in", rf.KafkaSource(topic, bootstrap=bs, start="latest")).sink("out", rf.CollectSink())
    job = rf.run(f, background=True)
    time.sleep(1.0)
    _produce(bs, topic, [(0, b"new")] * 5)
    deadline = time.time() + 20
    while job.metrics()["out"]["records_in"] < 5 and time.time() < deadline:
        time.sleep(0.2)
    job.stop()
    assert job.collect("out") == [b"new"] * 5


def test_oversize_records_go_to_dead_letters(ray_session, kafka_broker, new_topic):
    bs = kafka_broker.bootstrap
    dst = new_topic(1)
    records = [b"a" * 10, b"b" * 5000, b"c" * 10]
    f = rf.Dataflow("oversize")
    f.source("in", rf.MemorySource(records)).sink(
        "out", rf.KafkaSink(dst, bootstrap=bs, max_message_bytes=1000), on_error="dead_letter")
    job = f.run(timeout_s=60)
    assert [v for _, _, v in _read_all(bs, dst, 1, 2)] == [b"a" * 10, b"c" * 10]
    dead = job.dead_letters()
    assert len(dead) == 1 and "5000 bytes > max_message_bytes=1000" in dead[0].reason
    assert job.metrics()["out"]["dead_letters"] == 1


@pytest.mark.parametrize("client,names", [
    ("confluent", {"proto": "security.protocol", "id": "client.id", "linger": "linger.ms",
                   "host": "ssl.endpoint.identification.algorithm", "txn": "transactional.id",
                   "iso": "isolation.level"}),
    ("kafka-python", {"proto": "security_protocol", "id": "client_id", "linger": "linger_ms",
                      "host": "ssl_check_hostname", "txn": "transactional_id",
                      "iso": "isolation_level"})])
def test_every_client_of_an_exactly_once_sink_gets_the_connection_options(
        kafka_broker, new_topic, client, names):
    """The producer and the consumer the sink reads its topic back with are both built with
    the user's security and identity options, in either spelling, translated for the
    client; producer-only options stay with the producer; the job's kafka.options (config)
    reach them under the sink's own."""
    from rayflow.config import load_config, set_current
    from rayflow.core.operators import StepContext

    topic = new_topic(1)
    sink = rf.KafkaSink(topic, bootstrap=kafka_broker.bootstrap,
                        options={"security_protocol": "PLAINTEXT", "client.id": "rf-sec",
                                 "linger_ms": 7}, transactional_id_prefix="team-a")
    set_current(load_config(kafka={"client": client,
                                   "options": {"ssl.endpoint.identification.algorithm":
                                               "none"}}))
    try:
        w = sink.build(StepContext("out", 0, 1, "sec", guarantee="exactly_once", run_id="r1"))
    finally:
        set_current(None)
    no_check = "none" if client == "confluent" else False
    try:
        assert w.p.config[names["txn"]] == "team-a-out-0"
        for built in (w.p.config, w.scanner.options):
            assert built[names["proto"]] == "PLAINTEXT"
            assert built[names["id"]] == "rf-sec"
            assert built[names["host"]] == no_check
        assert w.p.config[names["linger"]] == 7 and names["linger"] not in w.scanner.options
        assert w.scanner.options[names["iso"]] == "read_committed"
    finally:
        w.close()
