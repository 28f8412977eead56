"""Each Nexmark query as a flow against its plain-Python reference, exactly, on events that
are out of order and come from several source instances (partitions)."""

import json

import pytest

import rayflow as rf
from rayflow.errors import ConfigError
from rayflow.nexmark import (
    QUERIES,
    NexmarkConfig,
    NexmarkGenerator,
    decode,
    fill_kafka,
    nexmark_flow,
)

# 4,000 events at 40 events/s of event time: 100 s, ten 10-second windows; out of order in
# groups of 32 (0.8 s)
CONFIG = NexmarkConfig(seed=5, first_event_rate=40.0, out_of_order_group_size=32)
N = 4000


@pytest.fixture(scope="module")
def events():
    return NexmarkGenerator(CONFIG).rows(range(N))


def _run(query, columnar=None, parallelism=2, **kw):
    late = rf.CollectSink() if QUERIES[query].late else None
    flow = nexmark_flow(query, CONFIG, N, sink=rf.CollectSink(), parallelism=parallelism,
                        columnar=columnar, late_sink=late, batch_size=250, **kw)
    job = flow.run(timeout_s=180)
    if late is not None:
        assert job.collect("late") == []
    return QUERIES[query].rows(job.collect("out"))


@pytest.mark.parametrize("query, columnar", [
    ("q0", True), ("q1", False),  # one columnar, one record by record: the rest are slow
    pytest.param("q1", True, marks=pytest.mark.slow),
    pytest.param("q2", True, marks=pytest.mark.slow),
    pytest.param("q0", False, marks=pytest.mark.slow),
    pytest.param("q2", False, marks=pytest.mark.slow)])
def test_stateless_queries_match_the_reference(ray_session, events, query, columnar):
    got = _run(query, columnar)
    assert got == QUERIES[query].reference(events)
    assert got  # the set is large enough to give output


@pytest.mark.parametrize("query", ["q5"] + [pytest.param(q, marks=pytest.mark.slow)
                                           for q in ("q7", "q8", "q9", "q11", "q16", "q20")])
def test_stateful_queries_match_the_reference(ray_session, events, query):
    got = _run(query)
    assert got == QUERIES[query].reference(events)
    assert len(got) >= 4  # q16: one row per channel (4) and day


@pytest.mark.parametrize("query", ["q12"] + [pytest.param(q, marks=pytest.mark.slow) for q in (
    "q13", "q3", "q4", "q14", "q15", "q17", "q18", "q19", "q21", "q22")])
def test_more_queries_match_the_reference(ray_session, events, query):
    got = _run(query)
    assert got == QUERIES[query].reference(events)
    assert got


def test_the_new_references_have_something_to_compare(events):
    # enough rows of each kind that a wrong join, window or update would show
    sizes = {q: len(QUERIES[q].reference(events)) for q in (
        "q3", "q4", "q12", "q13", "q14", "q15", "q17", "q18", "q19", "q21", "q22")}
    assert min(sizes.values()) >= 1 and sizes["q3"] >= 5 and sizes["q4"] == 5
    bids = sum(e["kind"] == "bid" for e in events)
    assert sizes["q13"] == sizes["q21"] == sizes["q22"] == bids
    assert 0 < sizes["q14"] < bids
    # q18/q19: some keys see several bids, so the updating result has real updates
    assert sizes["q18"] < bids and sizes["q19"] < bids


def test_updating_results_take_the_last_update_per_key():
    # q19's rows: the top list with the most bids seen wins, whatever the arrival order
    a = (5, 1, 100, "Google", "u", 10)
    b = (5, 2, 200, "Google", "u", 11)
    out = [(5, (2, (b, a))), (5, (1, (a,)))]
    assert QUERIES["q19"].rows(out) == [(1, b), (2, a)]
    assert QUERIES["q4"].rows([(10, 2, 5.0), (10, 1, 3.0), (11, 1, 7.0)]) == [
        (10, 2, 5.0), (11, 1, 7.0)]


def test_the_references_see_out_of_order_events(events):
    times = [e["date_time"] for e in events]
    assert times != sorted(times)
    # several hot items per window, sessions that end and start again, several new sellers
    assert len({r[2] for r in QUERIES["q5"].reference(events)}) > 1
    assert len({r[0] for r in QUERIES["q8"].reference(events)}) > 1
    sessions = [r[0] for r in QUERIES["q11"].reference(events)]
    assert len(sessions) > len(set(sessions))
    # some bids come before their auction: the q20 join must hold them
    first_seen = {}
    for i, e in enumerate(events):
        if e["kind"] == "auction":
            first_seen.setdefault(e["id"], i)
    q20_ids = {r[0] for r in QUERIES["q20"].reference(events)}
    assert any(e["kind"] == "bid" and e["auction"] in q20_ids and i < first_seen[e["auction"]]
               for i, e in enumerate(events))


def test_q5_reference_by_brute_force(events):
    """Every window [s, s + 10) with s a multiple of 2 s, counted the slow way."""
    bids = [e for e in events if e["kind"] == "bid"]
    starts = sorted({(e["date_time"] // 2000) * 2000 - k * 2000 for e in bids for k in range(5)})
    want = []
    for s in starts:
        counts = {}
        for b in bids:
            if s <= b["date_time"] < s + 10_000:
                counts[b["auction"]] = counts.get(b["auction"], 0) + 1
        if counts:
            top = max(counts.values())
            want += [(s / 1000, (s + 10_000) / 1000, a, n) for a, n in counts.items() if n == top]
    assert QUERIES["q5"].reference(events) == sorted(want)


@pytest.mark.slow
def test_queries_read_a_prefilled_kafka_topic(ray_session, kafka_broker, new_topic, events):
    topic = new_topic(partitions=3)
    fill_kafka(kafka_broker.bootstrap, topic, CONFIG, N, partitions=3)
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_broker.bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=5000)
    seen = [(m.partition, m.timestamp, json.loads(m.value)) for m in consumer]
    consumer.close()
    assert sorted((e["date_time"], json.dumps(e)) for _, _, e in seen) == \
        sorted((e["date_time"], json.dumps(e)) for e in events)
    assert all(t == e["date_time"] for _, t, e in seen)
    assert {p for p, _, _ in seen} == {0, 1, 2}

    source = rf.KafkaSource(topic, bootstrap=kafka_broker.bootstrap, bounded=True,
                            deserializer=decode)
    flow = nexmark_flow("q11", CONFIG, sink=rf.CollectSink(), parallelism=3, source=source,
                        late_sink=rf.CollectSink(), name="nexmark-q11-kafka")
    job = flow.run(timeout_s=180)
    assert job.collect("late") == []
    assert QUERIES["q11"].rows(job.collect("out")) == QUERIES["q11"].reference(events)


def test_bad_queries_and_options_are_errors():
    with pytest.raises(ConfigError, match=r"unknown query 'q99'.*'q0'"):
        nexmark_flow("q99", CONFIG, sink=rf.CollectSink())
    with pytest.raises(ConfigError, match="q5 has no Arrow path"):
        nexmark_flow("q5", CONFIG, sink=rf.CollectSink(), columnar=True)
    for q in ("q1", "q9"):  # no event time; event time, but no step with late output
        with pytest.raises(ConfigError, match=f"{q} has no step that sends late events"):
            nexmark_flow(q, CONFIG, sink=rf.CollectSink(), late_sink=rf.CollectSink())
    with pytest.raises(ConfigError, match="a given source gives event dicts"):
        nexmark_flow("q1", CONFIG, sink=rf.CollectSink(), columnar=True,
                     source=rf.MemorySource([]))
    with pytest.raises(ConfigError, match="unknown option 'batchsize'"):
        nexmark_flow("q0", CONFIG, sink=rf.CollectSink(), batchsize=10)


@pytest.mark.slow
def test_q16_counts_per_channel_and_day_over_several_days(ray_session):
    config = NexmarkConfig(seed=9, first_event_rate=0.02, out_of_order_group_size=8)
    events = NexmarkGenerator(config).rows(range(N))  # 200,000 s: three UTC days
    want = QUERIES["q16"].reference(events)
    assert len({r[1] for r in want}) == 3
    flow = nexmark_flow("q16", config, N, sink=rf.CollectSink(), parallelism=2,
                        late_sink=rf.CollectSink(), batch_size=250)
    job = flow.run(timeout_s=180)
    assert job.collect("late") == []
    assert QUERIES["q16"].rows(job.collect("out")) == want


def test_q13_looks_the_side_table_up_inside_the_source_chain():
    """q13 is a lookup into its bounded side table (as Flink's lookup join into a file):
    one input, so every step runs in the source's actor, the bids crossing no channel."""
    from rayflow.runtime.plan import chains

    flow = nexmark_flow("q13", CONFIG, sink=rf.CollectSink())
    assert [s.step_id for s in flow.steps if s.kind == "source"] == ["events"]
    assert set(chains(flow).values()) == {"events"}


@pytest.mark.slow
@pytest.mark.parametrize("query", ["q3", "q20"])
def test_regular_joins_on_rocksdb_survive_a_killed_actor(ray_session, events, tmp_path, query):
    """q3 and q20 keep both sides of their join in keyed state (q20 by batch), as compact
    rows: exactly-once on RocksDB, with a step actor killed after a checkpoint, the output
    is still exactly the reference's."""
    import ray

    from rayflow.testing import wait_for

    flow = nexmark_flow(query, CONFIG, N, sink=rf.CollectSink(), parallelism=2,
                        rate=N / 4, batch_size=100)  # 4 s of input, checkpoints every 0.3 s
    job = flow.run(background=True, checkpoint={
        "interval_s": 0.3, "processing_guarantee": "exactly_once", "state_backend": "rocksdb",
        "state_dir": str(tmp_path), "max_restarts": 4})
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
    ray.kill(job.actors()[-1], no_restart=True)
    job.wait(180)
    assert job.recoveries, "the kill came after the end of the input"
    assert QUERIES[query].rows(job.collect("out")) == QUERIES[query].reference(events)
