"""merge and branch on the runtime, against plain Python."""

import math
import time
from collections import Counter

import pytest

import rayflow as rf
from rayflow.connectors.kafka import produce, read_values
from rayflow.errors import ConfigError
from rayflow.examples.wordcount import parse, sentences
from rayflow.operators.windows import Count, CountWindow, EventTime, TumblingWindow
from rayflow.testing import wait_for


@pytest.mark.parametrize("par", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_merge_of_streams_of_any_parallelism(ray_session, par):
    a = [("a", i) for i in range(3000)]
    b = [("b", i) for i in range(1000)]
    c = [("c", i) for i in range(500)]
    f = rf.Dataflow(f"merge-{par}")
    sa = f.source("a", rf.MemorySource(a), parallelism=2)
    sb = f.source("b", rf.MemorySource(b)).map("b2", lambda r: (r[0], r[1] * 2))
    sc = f.source("c", rf.MemorySource(c), parallelism=3)
    (sa.merge("all", sb, sc.key_by(lambda r: r[1]), parallelism=par)
       .map("tag", lambda r: r, parallelism=par)
       .sink("out", rf.CollectSink(), parallelism=par))
    job = f.run(stream={"batch_size": 128}, timeout_s=120)
    want = Counter(a + [("b", i * 2) for i in range(1000)] + c)
    assert Counter(job.collect("out")) == want
    m = job.metrics()
    assert m["all"]["records_in"] == m["all"]["records_out"] == 4500


@pytest.mark.parametrize("chaining", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_branch_splits_a_stream_in_two(ray_session, chaining):
    xs = list(range(2000)) + ["bad"]
    f = rf.Dataflow("branch")
    big, small = (f.source("in", rf.MemorySource(xs))
                   .branch("split", lambda x: x >= 1500, on_error="dead_letter"))
    big.map("neg", lambda x: -x).sink("big", rf.CollectSink())
    small.sink("small", rf.CollectSink())
    job = f.run(stream={"batch_size": 64, "chaining": chaining}, timeout_s=120)
    assert job.collect("big") == [-x for x in range(1500, 2000)]
    assert job.collect("small") == list(range(1500))
    assert [d.record for d in job.dead_letters()] == ["bad"]


def test_merged_event_time_is_the_minimum_of_the_inputs(ray_session):
    """Two sources, one 20 s of event time ahead: merged and windowed, nothing is late."""
    fast = [("k", 20.0 + i * 0.01) for i in range(2000)]
    slow = [("k", i * 0.01) for i in range(2000)]
    f = rf.Dataflow("merge-wm")
    wm = EventTime(timestamp=lambda r: r[1], max_delay_s=0.5)
    s1 = f.source("fast", rf.MemorySource(fast), watermarks=wm)
    s2 = f.source("slow", rf.MemorySource(slow), watermarks=wm)
    counts = (s1.merge("both", s2).key_by(lambda r: r[0])
                .window("win", TumblingWindow(1.0), Count(), clock=EventTime()))
    counts.sink("out", rf.CollectSink())
    counts.side("late").sink("late", rf.CollectSink())
    job = f.run(stream={"batch_size": 50}, timeout_s=120)
    assert job.collect("late") == []
    got = Counter({(r.key, r.start): r.value for r in job.collect("out")})
    assert got == Counter((k, float(math.floor(t))) for k, t in fast + slow)


def test_merge_and_branch_reject_bad_input():
    f = rf.Dataflow("bad")
    s = f.source("in", rf.MemorySource([1]))
    with pytest.raises(ConfigError, match="merge\\(\\) needs at least one other stream"):
        s.merge("m")
    with pytest.raises(ConfigError, match="reads step 'in' twice"):
        s.merge("m", s)
    other = rf.Dataflow("other").source("o", rf.MemorySource([1]))
    with pytest.raises(ConfigError, match="takes streams of flow 'bad'"):
        s.merge("m2", other)


def _slow_words(record):
    time.sleep(0.002)  # stretch the run over several checkpoints
    return [w for w, _, _ in parse(record)]


def _fan_out_flow(topic_in, long_out, short_out, bs, name):
    """A branch whose two outputs both chain on (one into a map, one into a keyed count
    window), each into its own exactly-once sink: every step in the source's actor."""
    f = rf.Dataflow(name)
    long_words, short_words = (f.source("in", rf.KafkaSource(topic_in, bootstrap=bs,
                                                             bounded=True))
                                .flat_map("words", _slow_words)
                                .branch("split", lambda w: len(w) >= 6))
    long_words.map("upper", str.upper).sink("long", rf.KafkaSink(long_out, bootstrap=bs))
    (short_words.key_by(lambda w: w)
        .window("count", CountWindow(10), Count())
        .map("fmt", lambda r: f"{r.key}:{r.start}:{r.value}".encode())
        .sink("short", rf.KafkaSink(short_out, bootstrap=bs)))
    return f


def _fan_out_reference(records):
    """Plain Python: the long words upper-cased, and count windows of 10 per short word
    (the open ones closed at the end of the input)."""
    words = [w for r in records for w, _, _ in parse(r)]
    long_words = Counter(w.upper().encode() for w in words if len(w) >= 6)
    seen: Counter = Counter()
    windows = Counter()
    for w in (w for w in words if len(w) < 6):
        seen[w] += 1
        if seen[w] % 10 == 0:
            windows[f"{w}:{seen[w] // 10 - 1}:10".encode()] += 1
    for w, n in seen.items():
        if n % 10:
            windows[f"{w}:{n // 10}:{n % 10}".encode()] += 1
    return long_words, windows


def test_fan_out_chains_into_one_actor_and_recovers_exactly_once(ray_session, kafka_broker,
                                                                  new_topic):
    """As in Flink, a step's outputs chain on whether it has one consumer or several, on its
    main output or a side one: the whole flow is one actor. Killed after a checkpoint, it
    restores and writes each output exactly once (plain-Python ground truth)."""
    import ray

    bs = kafka_broker.bootstrap
    topic_in, long_out, short_out = new_topic(), new_topic(), new_topic()
    data = list(sentences(1200, words=6))
    produce(bs, topic_in, data)
    job = rf.run(_fan_out_flow(topic_in, long_out, short_out, bs, "fan-out-eos"),
                 background=True, stream={"batch_size": 20},
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once"})
    actors = {h._actor_id for h in job.hosts.values()}
    assert len(actors) == 1, sorted(job.hosts)
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()))
    wait_for(lambda: job.metrics()["count"]["records_in"] > 0)
    ray.kill(job.hosts[("in", 0)], no_restart=True)
    job.wait(120)
    assert len(job.recoveries) == 1 and job.recoveries[0]["restored_checkpoint"] is not None
    long_words, windows = _fan_out_reference(data)
    assert Counter(read_values(bs, long_out, "read_committed")) == long_words
    assert Counter(read_values(bs, short_out, "read_committed")) == windows


def test_a_branch_merged_back_chains_into_one_actor_and_recovers_exactly_once(
        ray_session, kafka_broker, new_topic):
    """A step of two inputs from the same chain (a branch's two streams merged back) runs in
    the source's actor too: its barriers come by call from both inputs and align there.
    Killed after a checkpoint, the job restores and writes each count window once."""
    import ray

    bs = kafka_broker.bootstrap
    topic_in, out = new_topic(), new_topic()
    data = list(sentences(1200, words=6))
    produce(bs, topic_in, data)
    f = rf.Dataflow("merge-back-eos")
    long_words, short_words = (f.source("in", rf.KafkaSource(topic_in, bootstrap=bs,
                                                             bounded=True))
                                .flat_map("words", _slow_words)
                                .branch("split", lambda w: len(w) >= 6))
    (long_words.map("upper", str.upper).merge("both", short_words)
        .key_by(lambda w: w)
        .window("count", CountWindow(10), Count())
        .map("fmt", lambda r: f"{r.key}:{r.start}:{r.value}".encode())
        .sink("out", rf.KafkaSink(out, bootstrap=bs)))
    job = rf.run(f, background=True, stream={"batch_size": 20},
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once"})
    assert len({h._actor_id for h in job.hosts.values()}) == 1, sorted(job.hosts)
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()))
    wait_for(lambda: job.metrics()["count"]["records_in"] > 0)
    ray.kill(job.hosts[("in", 0)], no_restart=True)
    job.wait(120)
    assert len(job.recoveries) == 1 and job.recoveries[0]["restored_checkpoint"] is not None
    seen: Counter = Counter()
    want: Counter = Counter()
    for w in (w for r in data for w, _, _ in parse(r)):
        w = w.upper() if len(w) >= 6 else w
        seen[w] += 1
        if seen[w] % 10 == 0:
            want[f"{w}:{seen[w] // 10 - 1}:10".encode()] += 1
    want.update(f"{w}:{n // 10}:{n % 10}".encode() for w, n in seen.items() if n % 10)
    assert Counter(read_values(bs, out, "read_committed")) == want
