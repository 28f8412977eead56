"""KafkaSource over several topics or a pattern, and event time per partition."""

import json
import math
import time
from collections import Counter

import pytest

import rayflow as rf
from rayflow.connectors.kafka import KafkaSource
from rayflow.connectors.kafka.source import _KafkaReader
from rayflow.core.operators import Rescaled, StepContext
from rayflow.operators.windows import Count, EventTime, TumblingWindow
from rayflow.testing import wait_for


class _FakeConsumer:
    """Just enough of a consumer adapter to build a reader without a broker."""

    def __init__(self, topics: dict[str, int]):
        self.parts = topics
        self.assigned: dict = {}

    def topics(self):
        return set(self.parts) | {"__rayflow_commits"}

    def partitions(self, topic):
        return set(range(self.parts.get(topic, 0)))

    def watermarks(self, topic, parts):
        return {p: 0 for p in parts}, {p: 10 for p in parts}

    def assign_tps(self, offsets):
        self.assigned = dict(offsets)


def _reader(spec, instance, parallelism, topics, resume=None):
    return _KafkaReader(spec, StepContext("src", instance, parallelism), _FakeConsumer(topics),
                        resume)


def test_partitions_of_all_topics_are_dealt_over_the_instances():
    topics = {"a": 2, "b": 1, "c": 3}
    spec = KafkaSource(topics=["a", "b", "c"], bootstrap="x")
    every = [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("c", 1), ("c", 2)]
    got = [_reader(spec, i, 4, topics).partitions for i in range(4)]
    assert got == [[every[j] for j in range(len(every)) if j % 4 == i] for i in range(4)]
    pattern = KafkaSource(pattern="[ac]", bootstrap="x")
    assert _reader(pattern, 0, 1, topics).partitions == [tp for tp in every if tp[0] != "b"]
    # one topic: positions keyed by partition alone, as checkpoints of old jobs are
    one = _reader(KafkaSource("c", bootstrap="x"), 0, 1, topics, {1: 4})
    assert one.snapshot() == {0: 0, 1: 4, 2: 0}
    assert one.splits() == ["c:0", "c:1", "c:2"]


def test_rescaled_offsets_follow_their_partitions():
    topics = {"a": 2, "b": 2}
    spec = KafkaSource(topics=["a", "b"], bootstrap="x")
    old = Rescaled(({("a", 0): 3, ("b", 0): 5}, {("a", 1): 4, ("b", 1): 6}), 2)
    new = [_reader(spec, i, 3, topics, old) for i in range(3)]
    assert [r.next for r in new] == [{("a", 0): 3, ("b", 1): 6}, {("a", 1): 4}, {("b", 0): 5}]


def test_bad_topic_options_are_errors():
    with pytest.raises(ValueError, match="exactly one of topic=, topics= or pattern="):
        KafkaSource("a", topics=["b"])
    with pytest.raises(ValueError, match="exactly one of"):
        KafkaSource()
    with pytest.raises(ValueError, match="name a topic twice"):
        KafkaSource(topics=["a", "a"])
    with pytest.raises(ValueError, match="non-empty list of topic names"):
        KafkaSource(topics="a")
    with pytest.raises(ValueError, match="is not a regular expression"):
        KafkaSource(pattern="(")
    with pytest.raises(ValueError, match="no topic matches the pattern 'z.*'"):
        _reader(KafkaSource(pattern="z.*", bootstrap="x"), 0, 1, {"a": 1})
    with pytest.raises(ValueError, match="Kafka topic 'nope' does not exist"):
        _reader(KafkaSource(topics=["a", "nope"], bootstrap="x"), 0, 1, {"a": 1})


def test_several_topics_and_a_pattern_read_everything(ray_session, kafka_broker, new_topic):
    from rayflow.connectors.kafka import produce

    bs = kafka_broker.bootstrap
    prefix = f"multi{time.time_ns()}"
    names = [new_topic(n, prefix=prefix) for n in (2, 1, 3)]
    sent = Counter()
    for k, (name, parts) in enumerate(zip(names, (2, 1, 3))):
        values = [f"{k}-{i}".encode() for i in range(200 + 50 * k)]
        produce(bs, name, values, partitions=parts)
        sent.update(values)
    for how in ({"topics": names}, {"pattern": f"{prefix}-.*"}):
        flow = rf.Dataflow("multi")
        (flow.source("src", KafkaSource(bootstrap=bs, bounded=True, with_metadata=True, **how),
                     parallelism=2)
             .map("v", lambda m: (m.topic, m.value))
             .sink("out", rf.CollectSink(), parallelism=2))
        out = flow.run(timeout_s=120).collect("out")
        assert Counter(v for _, v in out) == sent
        assert {t for t, _ in out} == set(names)
        assert all(v.startswith(f"{names.index(t)}-".encode()) for t, v in out)


def _send(bs, topic, records):
    """records: (partition, key, event time) in order; the value carries its event time."""
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bs, linger_ms=5)
    for part, key, t in records:
        p.send(topic, json.dumps([key, t]).encode(), partition=part)
    p.flush()
    p.close()


def _event_time_flow(name, src, watermarks):
    flow = rf.Dataflow(name)
    counts = (flow.source("src", src, watermarks=watermarks)
                  .map("decode", json.loads)
                  .key_by(lambda r: r[0])
                  .window("win", TumblingWindow(1.0), Count(), clock=EventTime(
                      timestamp=lambda r: r[1])))
    counts.sink("out", rf.CollectSink())
    counts.side("late").sink("late", rf.CollectSink())
    return flow


def _stamp(value: bytes) -> float:
    return json.loads(value)[1]


def test_each_partition_keeps_its_own_watermark(ray_session, kafka_broker, new_topic):
    """One reader, two partitions ten seconds of event time apart: nothing is late."""
    bs = kafka_broker.bootstrap
    topic = new_topic(2)
    recs = [(0, f"k{i % 3}", 10.0 + i * 0.01) for i in range(2000)] + \
           [(1, f"k{i % 3}", i * 0.01) for i in range(2000)]
    _send(bs, topic, recs)
    job = _event_time_flow("per-partition", KafkaSource(topic, bootstrap=bs, bounded=True),
                           EventTime(timestamp=_stamp, max_delay_s=1.0)).run(
        stream={"batch_size": 100}, timeout_s=120)
    assert job.collect("late") == []
    got = Counter({(r.key, r.start): r.value for r in job.collect("out")})
    assert got == Counter((k, float(math.floor(t))) for _, k, t in recs)


def test_an_idle_partition_does_not_hold_windows_open(ray_session, kafka_broker, new_topic):
    """Partition 1 never gets a record: after idle_timeout_s it leaves the minimum and the
    windows of partition 0 fire while the job runs (not only when it stops)."""
    bs = kafka_broker.bootstrap
    topic = new_topic(2)
    recs = [(0, "k", i * 0.1) for i in range(200)]  # event time 0 .. 19.9
    _send(bs, topic, recs)
    job = rf.run(_event_time_flow("idle", KafkaSource(topic, bootstrap=bs),
                                        EventTime(timestamp=_stamp, idle_timeout_s=1.0)), background=True)
    try:
        # the watermark reaches 19.9: windows [0, 1) ... [18, 19) fire, [19, 20) stays open
        wait_for(lambda: job.metrics()["win"]["records_out"] >= 19, timeout_s=60)
        time.sleep(0.5)
        assert job.metrics()["win"]["records_out"] == 19
    finally:
        job.stop()
    got = [(r.start, r.value) for r in job.collect("out")]
    assert got == [(float(s), 10) for s in range(20)]
