"""merge and branch on the runtime, against plain Python."""

import math
from collections import Counter

import pytest

import rayflow as rf
from rayflow.errors import ConfigError
from rayflow.operators.windows import Count, EventTime, TumblingWindow


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
