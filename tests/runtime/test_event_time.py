"""Event time on the runtime: watermarks made per split at the sources, carried in the
channels, combined as the minimum over inputs; windows fire on them."""

import math
from collections import Counter
from time import time_ns

import pytest

import rayflow as rf
from rayflow.operators.windows import Count, EventTime, TumblingWindow

N = 40_000


def _two_inputs_ten_seconds_apart():
    """Instance 0 of a 2-instance MemorySource reads the first half, instance 1 the second:
    both in order, instance 1 ten seconds of event time ahead of instance 0."""
    half = N // 2
    return [(f"k{i % 7}", (i % half) * 0.001 + (10.0 if i >= half else 0.0)) for i in range(N)]


def _reference(records):
    """Plain Python: records per key and 1-second window."""
    return Counter((k, float(math.floor(t))) for k, t in records)


@pytest.mark.parametrize("window_par", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_a_fast_input_does_not_make_a_slow_inputs_records_late(ray_session, window_par):
    """Without per-input watermarks this case sent 19,088 of the 40,000 records to `late`."""
    records = _two_inputs_ten_seconds_apart()
    flow = rf.Dataflow(f"two-inputs-{window_par}")
    counts = (flow.source("src", rf.MemorySource(records), parallelism=2,
                          watermarks=EventTime(timestamp=lambda r: r[1], max_delay_s=1.0))
                  .key_by(lambda r: r[0])
                  .window("win", TumblingWindow(1.0), Count(), clock=EventTime(),
                          parallelism=window_par))
    counts.sink("out", rf.CollectSink(), parallelism=window_par)
    counts.side("late").sink("late", rf.CollectSink())
    job = flow.run(stream={"batch_size": 500}, timeout_s=120)
    assert job.collect("late") == []
    got = Counter({(r.key, r.start): r.value for r in job.collect("out")})
    assert got == _reference(records)
    assert sum(got.values()) == N


@pytest.mark.parametrize("chaining", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_records_behind_the_watermark_go_to_late(ray_session, chaining):
    t0 = 1_000.0
    events = [("a", t0 + 1), ("a", t0 + 12), ("a", t0 + 2), ("a", t0 + 25), ("a", t0 + 3),
              ("a", t0 + 21)]
    flow = rf.Dataflow("late")
    counts = (flow.source("src", rf.MemorySource(events),
                          watermarks=EventTime(timestamp=lambda r: r[1], max_delay_s=5.0))
                  .map("id", lambda r: r)
                  .key_by(lambda r: r[0])
                  .window("win", TumblingWindow(10.0), Count(), clock=EventTime()))
    counts.sink("out", rf.CollectSink())
    counts.side("late").sink("late_out", rf.CollectSink())
    job = flow.run(stream={"batch_size": 1, "chaining": chaining}, timeout_s=60)
    # t0+12 -> watermark t0+7: t0+2 on time; t0+25 -> t0+20: [0,10) and [10,20) fire,
    # t0+3 is late, t0+21 on time
    assert sorted((r.start - t0, r.value) for r in job.collect("out")) == [
        (0.0, 2), (10.0, 1), (20.0, 2)]
    assert job.collect("late_out") == [("a", t0 + 3)]
    assert job.metrics()["win"]["side_records"] == 1


def _late_every_100(n):
    """One partition in order, 0.01 s apart, except every 100th record, 5 s behind: late,
    whatever the batch boundaries (a batch holds at most 20 records here)."""
    out = []
    for i in range(n):
        t = 100.0 + i * 0.01
        out.append((f"k{i % 4}", round(t - 5.0 if i % 100 == 99 else t, 6)))
    return out


def _recovery_flow(name, topic_in, topic_out, topic_late, bs, window_spec):
    import json

    flow = rf.Dataflow(name)
    counts = (flow.source("src", rf.KafkaSource(topic_in, bootstrap=bs, bounded=True),
                          watermarks=EventTime(timestamp=lambda v: json.loads(v)[1],
                                               max_delay_s=1.0))
                  .map("decode", _slow_decode)
                  .key_by(lambda r: r[0])
                  .apply("win", window_spec))
    (counts.map("fmt", lambda r: json.dumps([r.key, r.start, r.value]).encode())
           .sink("out", rf.KafkaSink(topic_out, bootstrap=bs)))
    (counts.side("late").map("fmt_late", lambda r: json.dumps(r).encode())
           .sink("late", rf.KafkaSink(topic_late, bootstrap=bs)))
    return flow


def _slow_decode(v):
    import json
    import time

    time.sleep(0.001)  # stretch the run over several checkpoints
    return tuple(json.loads(v))


@pytest.mark.slow
def test_after_a_failure_windows_close_at_the_same_event_times(ray_session, kafka_broker,
                                                                tmp_path):
    """A crash while snapshotting: the restored run commits exactly the failure-free output,
    the same windows and the same late records (watermarks restored, not restarted)."""
    import json

    from rayflow.connectors.kafka import create_topic, produce, read_values
    from rayflow.operators.windows import Windowed
    from rayflow.testing import CrashDuringCheckpoint

    bs = kafka_broker.bootstrap
    records = _late_every_100(3000)
    tag = f"{time_ns()}"
    t_in = f"et-in-{tag}"
    create_topic(bs, t_in, 1)
    produce(bs, t_in, [json.dumps(r).encode() for r in records])
    win = Windowed(TumblingWindow(1.0), Count(), lambda r: r[0], EventTime())
    results = {}
    for name, spec in [("ref", win), ("crash", CrashDuringCheckpoint(win, 2, str(tmp_path / "m")))]:
        out, late = f"et-out-{name}-{tag}", f"et-late-{name}-{tag}"
        create_topic(bs, out, 1)
        create_topic(bs, late, 1)
        job = _recovery_flow(f"et-{name}", t_in, out, late, bs, spec).run(
            checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once"},
            stream={"batch_size": 20}, timeout_s=180)
        assert len(job.recoveries) == (1 if name == "crash" else 0)
        results[name] = (sorted(read_values(bs, out)), sorted(read_values(bs, late)))
    assert (tmp_path / "m").exists()
    assert results["crash"] == results["ref"]
    # and the reference is plain Python: on-time records counted, the 5 s stragglers late
    on_time = [r for i, r in enumerate(records) if i % 100 != 99]
    want = Counter((k, float(math.floor(t))) for k, t in on_time)
    got = Counter({(k, s): v for k, s, v in map(json.loads, results["ref"][0])})
    assert got == want
    assert sorted(tuple(json.loads(v)) for v in results["ref"][1]) == sorted(
        r for i, r in enumerate(records) if i % 100 == 99)


def _times_of(seq):
    """Event times of a GeneratorSource's records, out of order in pairs: 0.1 s apart,
    each even record a step behind its odd neighbour."""
    return (seq ^ 1) * 0.1


def test_a_generator_gives_its_records_event_times(ray_session):
    """``GeneratorSource(timestamps=...)``: one call per batch gives the event times, and
    ``EventTime()`` on the source needs no timestamp function; the windows equal the plain
    reference over 2 instances, and nothing within the bound is late."""
    n = 3000
    flow = rf.Dataflow("generator-times")
    counts = (flow.source("src", rf.GeneratorSource(lambda seq: (seq % 3).tolist(), count=n,
                                                    columnar=True, timestamps=_times_of),
                          parallelism=2, watermarks=EventTime(max_delay_s=0.2))
                  .key_by(lambda k: k)
                  .window("win", TumblingWindow(10.0), Count(), clock=EventTime()))
    counts.sink("out", rf.CollectSink())
    counts.side("late").sink("late", rf.CollectSink())
    job = flow.run(stream={"batch_size": 97}, timeout_s=120)
    assert job.collect("late") == []
    expected = Counter((i % 3, float(math.floor(((i ^ 1) * 0.1) / 10.0) * 10.0))
                       for i in range(n))
    assert Counter({(r.key, r.start): r.value for r in job.collect("out")}) == expected


def test_a_generator_whose_event_times_do_not_match_its_records_is_an_error():
    from rayflow.core.operators import StepContext

    reader = rf.GeneratorSource(lambda seq: seq, count=10, columnar=True,
                                timestamps=lambda seq: seq[:-1] * 1.0).build(
        StepContext("src", 0, 1))
    with pytest.raises(ValueError, match=r"timestamps gave \(4,\) times for 5 records"):
        reader.poll(5, 0.0)
    items, times = rf.GeneratorSource(lambda seq: seq, count=10, columnar=True,
                                      timestamps=lambda seq: seq * 0.5, rate=1e9).build(
        StepContext("src", 1, 2)).poll(3, 1.0)  # (1 s: room to wait for the rate)
    assert items.tolist() == [1, 3, 5] and times.tolist() == [0.5, 1.5, 2.5]
