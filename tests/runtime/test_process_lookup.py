"""Process functions with timers, lookup joins, cached enrichment and state TTL on the runtime:
out-of-order input from several source instances, parallelism 1 (chained) and 3, against
plain Python; and exactly-once through an actor killed mid-stream, on each state backend."""

import json
import math
import time
from collections import Counter

import numpy as np
import pytest

import rayflow as rf
from rayflow.errors import ConfigError
from rayflow.operators.process import KeyedProcessFunction
from rayflow.operators.windows import EventTime
from tests.operators._drive import lookup_reference, sessions_reference

GAP = 3.0
# no idle timeout: on a loaded machine a partition can pause for longer than one, and then
# the other partition's watermark would make its next records late (the output would then
# depend on timing, which an exact comparison cannot allow)
WM = EventTime(timestamp=lambda r: r[1], max_delay_s=2.0, idle_timeout_s=None)
CASES = [(1, True), pytest.param(3, False, marks=pytest.mark.slow)]


class Sessions(KeyedProcessFunction):
    """Records per key and session (a gap > GAP ends one): each record waits for the timer
    at its own event time, and the timers replay them in time order, so the output does
    not depend on arrival order. Emits ``[key, count, last time]``."""

    def process_element(self, rec, ctx):
        buffered, cnt, last = ctx.state.value(((), 0, -math.inf))
        ctx.state.update((buffered + (ctx.timestamp,), cnt, last))
        ctx.timers.register(event_time=ctx.timestamp)

    def on_timer(self, key, ts, ctx):
        buffered, cnt, last = ctx.state.value()
        due = sorted(t for t in buffered if t <= ts)
        for t in due:
            if cnt and t - last > GAP:
                yield [key, cnt, last]
                cnt = 0
            if cnt:
                ctx.timers.delete(event_time=last + GAP)
            cnt, last = cnt + 1, t
        if due:
            ctx.timers.register(event_time=last + GAP)
        if cnt and not due and ts == last + GAP:
            yield [key, cnt, last]
            cnt = 0
        rest = tuple(t for t in buffered if t > ts)
        if rest or cnt:
            ctx.state.update((rest, cnt, last))
        else:
            ctx.state.clear()


def _records(seed, n, name, keys=6, span=400.0):
    """Out of order by up to 2 s (within max_delay_s)."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, span, n)) + rng.uniform(0, 2.0, n)
    return [(f"k{int(k)}", float(x), f"{name}{i}")
            for i, (k, x) in enumerate(zip(rng.integers(0, keys, n), t))]








@pytest.mark.parametrize("par,chaining", CASES)
def test_process_and_lookup_join_match_python(ray_session, par, chaining):
    stream, table = _records(1, 1200, "r"), _records(2, 200, "v")
    f = rf.Dataflow(f"proc-lookup-{par}")
    s = f.source("stream", rf.MemorySource(stream), parallelism=2, watermarks=WM)
    t = f.source("table", rf.MemorySource(table), parallelism=2, watermarks=WM)
    (s.key_by(lambda r: r[0]).process("sess", Sessions(), parallelism=par)
      .sink("sessions", rf.CollectSink(), parallelism=par))
    (s.key_by(lambda r: r[0]).lookup_join("lk", t.key_by(lambda r: r[0]), clock=EventTime(),
                                          parallelism=par)
      .sink("joined", rf.CollectSink(), parallelism=par))
    job = f.run(stream={"batch_size": 64, "chaining": chaining}, timeout_s=180)
    assert Counter(tuple(r) for r in job.collect("sessions")) == sessions_reference(stream, GAP)
    assert Counter(job.collect("joined")) == lookup_reference(stream, table)


@pytest.mark.parametrize("chaining", [True, False])
def test_an_event_time_lookup_join_emits_once_its_table_has_passed(ray_session, chaining):
    """A static table that has been read lets each record of the stream join as it comes,
    although the stream's watermark (and so the step's) stays far behind until its end: the
    joined records leave over the stream's 3 s, not all at its end."""
    far = EventTime(timestamp=lambda r: r[1], max_delay_s=1e12, idle_timeout_s=None)
    f = rf.Dataflow(f"lookup-early-{chaining}")
    s = f.source("stream", rf.GeneratorSource(lambda i: ("k", 1e9 + i, i), count=60, rate=20.0),
                 watermarks=far)
    t = f.source("table", rf.MemorySource([("k", 0.0, "v")]),
                 watermarks=EventTime(timestamp=lambda r: r[1]))
    (s.key_by(lambda r: r[0]).lookup_join("lk", t.key_by(lambda r: r[0]), clock=EventTime())
      .map("stamp", lambda j: (j[1][2], j[2][2], time.time()))
      .sink("out", rf.CollectSink()))
    job = f.run(stream={"batch_size": 8, "chaining": chaining}, timeout_s=120)
    got = job.collect("out")
    assert sorted((i, v) for i, v, _ in got) == [(i, "v") for i in range(60)]
    stamps = sorted(at for _, _, at in got)
    assert stamps[-1] - stamps[0] > 1.5, stamps


def test_enrich_cached_and_ttl_counted_in_metrics(ray_session):
    def slow(r):
        time.sleep(0.005)
        return r

    # ten keys once, then one key for ~3 s: the ten expire (ttl 1 s), counted
    recs = [f"k{i}" for i in range(10)] + ["z"] * 600
    f = rf.Dataflow("ttl-metrics")
    keyed = f.source("src", rf.MemorySource(recs)).map("slow", slow).key_by(str)
    (keyed.stateful_map("n", lambda n, w: ((n or 0) + 1, (n or 0) + 1), ttl_s=1.0)
          .sink("counts", rf.CollectSink()))
    (keyed.enrich_cached("up", lambda keys: [k.upper() for k in keys], ttl_s=60.0, batch=True)
          .sink("enriched", rf.CollectSink()))
    job = f.run(stream={"batch_size": 16}, timeout_s=120)
    assert sorted(job.collect("enriched")) == sorted((w, w, w.upper()) for w in recs)
    counts = job.collect("counts")
    assert sorted(c for k, c in counts if k.startswith("k")) == [1] * 10
    assert job.metrics()["n"]["state_expired"] >= 10
    assert job.metrics()["up"]["state_expired"] == 0  # nothing cached for 60 s


def test_ttl_and_options_are_checked_when_the_flow_is_built():
    f = rf.Dataflow("bad")
    keyed = f.source("src", rf.MemorySource([1])).key_by(str)
    with pytest.raises(ConfigError, match="step 'n'.*ttl_s"):
        keyed.stateful_map("n", lambda s, v: (s, v), ttl_s=-1)
    with pytest.raises(ConfigError, match="unknown option 'ttl'"):
        keyed.process("p", lambda v, ctx: [v], ttl=5)
    with pytest.raises(ConfigError, match="needs key_by"):
        f.source("src2", rf.MemorySource([1])).process("p2", lambda v, ctx: [v])
    with pytest.raises(ConfigError, match="ttl_s is required"):
        keyed.enrich_cached("e", str, None)
    with pytest.raises(ConfigError, match="both streams keyed"):
        keyed.lookup_join("lk", f.source("t", rf.MemorySource([1])))


# -- exactly-once through a failure ----------------------------------------------------------

def _slow_decode(v):
    time.sleep(0.002)  # stretch the run over several checkpoints
    return tuple(json.loads(v))


def _names(keys):
    return [f"name-of-{k}" for k in keys]


def _kafka_flow(name, bs, t_stream, t_table, t_sess, t_join, t_enriched=None):
    wm = EventTime(timestamp=lambda v: json.loads(v)[1], max_delay_s=2.0, idle_timeout_s=None)
    f = rf.Dataflow(name)
    s = f.source("stream", rf.KafkaSource(t_stream, bootstrap=bs, bounded=True),
                 parallelism=2, watermarks=wm).map("decode", _slow_decode, parallelism=2)
    t = (f.source("table", rf.KafkaSource(t_table, bootstrap=bs, bounded=True),
                  watermarks=wm).map("decode_t", lambda v: tuple(json.loads(v))))
    (s.key_by(lambda r: r[0]).process("sess", Sessions(), parallelism=2)
      .map("fmt_s", lambda r: json.dumps(r).encode(), parallelism=2)
      .sink("sessions", rf.KafkaSink(t_sess, bootstrap=bs), parallelism=2))
    (s.key_by(lambda r: r[0]).lookup_join("lk", t.key_by(lambda r: r[0]), clock=EventTime(),
                                          parallelism=2)
      .map("fmt_j", lambda r: json.dumps(r).encode(), parallelism=2)
      .sink("joined", rf.KafkaSink(t_join, bootstrap=bs), parallelism=2))
    if t_enriched is not None:
        (s.key_by(lambda r: r[0]).enrich_cached("enrich", _names, ttl_s=30.0, batch=True)
          .map("fmt_e", lambda r: json.dumps(r).encode())
          .sink("enriched", rf.KafkaSink(t_enriched, bootstrap=bs)))
    return f


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", "filesystem", "rocksdb"])
def test_exactly_once_through_a_killed_actor(ray_session, kafka_broker, new_topic, backend,
                                             tmp_path):
    import ray

    from rayflow.connectors.kafka import produce, read_values
    from rayflow.testing import wait_for

    if backend == "rocksdb":
        pytest.importorskip("rocksdict")
    bs = kafka_broker.bootstrap
    stream, table = _records(3, 2500, "r"), _records(4, 300, "v")
    t_stream, t_table = new_topic(2), new_topic(1)
    t_sess, t_join, t_enriched = new_topic(1), new_topic(1), new_topic(1)
    produce(bs, t_stream, [json.dumps(r).encode() for r in stream], partitions=2)
    produce(bs, t_table, [json.dumps(r).encode() for r in table])
    job = rf.run(_kafka_flow(f"eos-proc-{backend}", bs, t_stream, t_table, t_sess, t_join,
                             t_enriched),
                 background=True, stream={"batch_size": 20},
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once",
                             "state_backend": backend, "state_dir": str(tmp_path)})
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
    wait_for(lambda: job.metrics()["sess"]["records_in"] > 200, 60)
    ray.kill(job.hosts[("sess", 0)], no_restart=True)  # mid-stream: timers pending
    job.wait(240)
    assert len(job.recoveries) == 1 and job.recoveries[0]["restored_checkpoint"] is not None
    sessions = [tuple(json.loads(v)) for v in read_values(bs, t_sess, "read_committed")]
    joined = [json.loads(v) for v in read_values(bs, t_join, "read_committed")]
    assert Counter(sessions) == sessions_reference(stream, GAP)
    assert Counter((k, tuple(r), tuple(v)) for k, r, v in joined) == \
        lookup_reference(stream, table)
    enriched = [json.loads(v) for v in read_values(bs, t_enriched, "read_committed")]
    assert sorted((k, tuple(r), v) for k, r, v in enriched) == sorted(
        (r[0], r, f"name-of-{r[0]}") for r in stream)


@pytest.mark.slow
def test_rescale_from_a_savepoint_moves_values_timers_and_tables(ray_session, kafka_broker,
                                                                 new_topic, tmp_path):
    """Parallelism changes on a running exactly-once job (a savepoint, then a restart at the
    new parallelism): the process function's values and pending timers and the lookup
    join's table and waiting records go to their keys' new owners; output equals Python."""
    from rayflow.connectors.kafka import produce, read_values
    from rayflow.testing import wait_for

    pytest.importorskip("rocksdict")
    bs = kafka_broker.bootstrap
    stream, table = _records(5, 2500, "r"), _records(6, 300, "v")
    t_stream, t_table = new_topic(2), new_topic(1)
    t_sess, t_join = new_topic(1), new_topic(1)
    produce(bs, t_stream, [json.dumps(r).encode() for r in stream], partitions=2)
    produce(bs, t_table, [json.dumps(r).encode() for r in table])
    job = rf.run(_kafka_flow("rescale-proc", bs, t_stream, t_table, t_sess, t_join),
                 background=True, stream={"batch_size": 20},
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once",
                             "state_backend": "rocksdb", "state_dir": str(tmp_path)})
    wait_for(lambda: job.metrics()["sess"]["records_in"] > 300, 60)
    job2 = job.rescale({"sess": 3, "lk": 1})
    assert job.status() == "STOPPED"
    job2.wait(240)
    sessions = [tuple(json.loads(v)) for v in read_values(bs, t_sess, "read_committed")]
    joined = [json.loads(v) for v in read_values(bs, t_join, "read_committed")]
    assert Counter(sessions) == sessions_reference(stream, GAP)
    assert Counter((k, tuple(r), tuple(v)) for k, r, v in joined) == \
        lookup_reference(stream, table)
