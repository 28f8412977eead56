"""Session windows, joins, stateful_map and stateful_map_batches on the runtime: out-of-order input from several
source instances, parallelism 1 (chained where the graph allows) and 3 (unchained), against
plain Python."""

import math
from collections import Counter, defaultdict

import numpy as np
import pytest

import rayflow as rf
from rayflow.operators.windows import Count, EventTime, SessionWindow, TumblingWindow

# (parallelism of the keyed step, chaining); parallelism 3 starts 8-10 actors: slow here
CASES = [(1, True), pytest.param(3, False, marks=pytest.mark.slow)]
WM = EventTime(timestamp=lambda r: r[1], max_delay_s=2.0)


def _records(seed, n, name, keys=5, span=200.0):
    """Out of order by up to 2 s (within max_delay_s), read by two source instances."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, span, n)) + rng.uniform(0, 2.0, n)
    return [(f"k{int(k)}", round(float(x), 3), f"{name}{i}")
            for i, (k, x) in enumerate(zip(rng.integers(0, keys, n), t))]


def _run(flow, chaining):
    return flow.run(stream={"batch_size": 64, "chaining": chaining}, timeout_s=180)


@pytest.mark.parametrize("par,chaining", CASES)
def test_session_windows(ray_session, par, chaining):
    recs = _records(1, 3000, "s", keys=7, span=900.0)
    f = rf.Dataflow(f"sessions-{par}")
    out = (f.source("src", rf.MemorySource(recs), parallelism=2, watermarks=WM)
            .map("id", lambda r: r, parallelism=2)
            .key_by(lambda r: r[0])
            .window("sess", SessionWindow(1.0), Count(), clock=EventTime(), parallelism=par))
    out.sink("out", rf.CollectSink(), parallelism=par)
    out.side("late").sink("late", rf.CollectSink())
    job = _run(f, chaining)
    assert job.collect("late") == []
    by_key = defaultdict(list)
    for k, t, _ in recs:
        by_key[k].append(t)
    want = set()
    for k, ts in by_key.items():
        ts.sort()
        start = prev = ts[0]
        n = 0
        for t in ts:
            if t - prev > 1.0:
                want.add((k, start, prev + 1.0, n))
                start, n = t, 0
            prev, n = t, n + 1
        want.add((k, start, prev + 1.0, n))
    got = [(r.key, r.start, r.end, r.value) for r in job.collect("out")]
    assert len(got) == len(set(got)) and set(got) == want


def _two_sided(name, par, left, right):
    f = rf.Dataflow(name)
    a = f.source("left", rf.MemorySource(left), parallelism=2, watermarks=WM)
    b = f.source("right", rf.MemorySource(right), parallelism=2, watermarks=WM)
    return f, a.key_by(lambda r: r[0]), b.key_by(lambda r: r[0])


@pytest.mark.parametrize("par,chaining", CASES)
def test_window_join_left(ray_session, par, chaining):
    left, right = _records(2, 800, "L"), _records(3, 600, "R")
    f, a, b = _two_sided(f"join-{par}", par, left, right)
    a.join("j", b, TumblingWindow(5.0), how="left", clock=EventTime(),
           parallelism=par).sink("out", rf.CollectSink(), parallelism=par)
    job = _run(f, chaining)
    rw = defaultdict(list)
    for r in right:
        rw[(r[0], math.floor(r[1] / 5.0))].append(r)
    want = Counter()
    for r in left:
        matches = rw.get((r[0], math.floor(r[1] / 5.0)), [])
        want.update([(r[0], r, m) for m in matches] or [(r[0], r, None)])
    got = Counter((k, tuple(x), None if y is None else tuple(y))
                  for k, x, y in job.collect("out"))
    assert got == want


@pytest.mark.parametrize("par,chaining", CASES)
def test_interval_join(ray_session, par, chaining):
    left, right = _records(4, 600, "L"), _records(5, 600, "R")
    f, a, b = _two_sided(f"ijoin-{par}", par, left, right)
    a.interval_join("j", b, -0.5, 1.0, parallelism=par).sink("out", rf.CollectSink(),
                                                              parallelism=par)
    job = _run(f, chaining)
    want = Counter((x[0], x, y) for x in left for y in right
                   if x[0] == y[0] and x[1] - 0.5 <= y[1] <= x[1] + 1.0)
    assert Counter(job.collect("out")) == want


def _keyed_flow(name, recs, par, step):
    """``recs`` from 2 source instances, keyed by their first field, through ``step`` (a
    function of the keyed stream) into a collecting sink at parallelism ``par``."""
    f = rf.Dataflow(name)
    keyed = f.source("src", rf.MemorySource(recs), parallelism=2).key_by(lambda r: r[0])
    step(keyed).sink("out", rf.CollectSink(), parallelism=par)
    return f


@pytest.mark.parametrize("par,chaining", CASES)
def test_stateful_map_counts_per_key(ray_session, par, chaining):
    recs = _records(6, 3000, "m", keys=11)
    f = _keyed_flow(f"smap-{par}", recs, par, lambda keyed: keyed.stateful_map(
        "n", lambda n, r: ((n or 0) + 1, (n or 0) + 1), parallelism=par))
    job = _run(f, chaining)
    per_key = Counter(k for k, _, _ in recs)
    assert Counter(job.collect("out")) == Counter(
        {(k, i): 1 for k, n in per_key.items() for i in range(1, n + 1)})


def _ids_so_far(n, recs):
    """stateful_map_batches: a key's count, emitted with the ids of the batch's records."""
    n = (n or 0) + len(recs)
    return n, [(n, [r[2] for r in recs])]


def _check_counted_once(out, recs):
    """Each key's updates count up by the ids they carry, and carry each of its records'
    ids exactly once."""
    by_key = defaultdict(list)
    for key, (n, ids) in out:
        by_key[key].append((n, ids))
    want = defaultdict(list)
    for k, _, i in recs:
        want[k].append(i)
    assert set(by_key) == set(want)
    for key, updates in by_key.items():
        updates.sort()
        seen = 0
        for n, ids in updates:
            seen += len(ids)
            assert n == seen
        assert sorted(i for _, ids in updates for i in ids) == sorted(want[key])


@pytest.mark.parametrize("par,chaining", CASES)
def test_stateful_map_batches_counts_each_record_once(ray_session, par, chaining):
    recs = _records(7, 3000, "b", keys=11)
    f = _keyed_flow(f"smb-{par}", recs, par, lambda keyed: keyed.stateful_map_batches(
        "n", _ids_so_far, parallelism=par))
    out = _run(f, chaining).collect("out")
    _check_counted_once(out, recs)
    assert len(out) < len(recs)  # batches of 64 from 2 sources over 11 keys: fewer calls


def _decode_slowly(v):
    import json
    import time

    time.sleep(0.001)  # stretch the run over several checkpoints
    return tuple(json.loads(v))


@pytest.mark.slow
def test_stateful_map_batches_exactly_once_through_a_crash(ray_session, kafka_broker,
                                                           new_topic, tmp_path):
    """A crash while snapshotting: the committed updates still count every record once."""
    import json

    from rayflow.connectors.kafka import produce, read_values
    from rayflow.operators.stateful import StatefulMapBatches
    from rayflow.testing import CrashDuringCheckpoint

    bs = kafka_broker.bootstrap
    recs = _records(8, 2000, "x", keys=7)
    t_in, t_out = new_topic(2), new_topic(1)
    produce(bs, t_in, [json.dumps(r).encode() for r in recs], partitions=2)
    spec = CrashDuringCheckpoint(StatefulMapBatches(_ids_so_far, lambda r: r[0]), 2,
                                 str(tmp_path / "m"))
    f = rf.Dataflow("smb-eos")
    (f.source("src", rf.KafkaSource(t_in, bootstrap=bs, bounded=True), parallelism=2)
      .map("decode", _decode_slowly, parallelism=2)
      .key_by(lambda r: r[0]).apply("n", spec, parallelism=2)
      .map("fmt", lambda r: json.dumps(r).encode())
      .sink("out", rf.KafkaSink(t_out, bootstrap=bs)))
    job = f.run(checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once"},
                stream={"batch_size": 20}, timeout_s=180)
    assert (tmp_path / "m").exists() and len(job.recoveries) == 1
    out = [json.loads(v) for v in read_values(bs, t_out, "read_committed")]
    _check_counted_once([(k, (n, ids)) for k, (n, ids) in out], recs)
