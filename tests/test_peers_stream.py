"""The Bytewax and Pathway peers of W2 (identity) and W4 (word count) in
benchmarks/peers_stream.py, against plain-Python references, through the embedded broker."""

from __future__ import annotations

import importlib.util
import json
import math
import random
from collections import Counter, defaultdict
from importlib.metadata import version
from pathlib import Path

import pytest

from rayflow.connectors.kafka import produce
from rayflow.examples.wordcount import sentences

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("peers_stream",
                                                  ROOT / "benchmarks" / "peers_stream.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ps = _load()

WINDOW_KEYS = ["word", "window", "count", "minEventTime", "maxEventTime", "minInTime",
               "maxInTime", "outTime"]


def _peer(name: str):
    pytest.importorskip(name)
    return name


@pytest.fixture(params=["bytewax", "pathway"])
def peer(request):
    return _peer(request.param)


def _read_all(bootstrap: str, topic: str) -> list:
    """Every message of ``topic`` from the beginning (confluent-kafka), with its headers."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "peers-check",
                  "enable.auto.commit": False})
    md = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out, idle = [], 0
    while idle < 3:
        msgs = c.consume(10_000, 0.3)
        idle = 0 if msgs else idle + 1
        for m in msgs:
            assert m.error() is None, m.error()
            out.append(m)
    c.close()
    return out


def _topics(new_topic, partitions: int) -> tuple[str, str]:
    return new_topic(partitions, "peer-in"), new_topic(1, "peer-out")


# -- plain-Python references -------------------------------------------------------------------

def ref_parse(record: bytes):
    """rayflow's W4 input rules, written out: None for a malformed record."""
    if len(record) > 10_000:
        return None
    try:
        msg = json.loads(record)
    except ValueError:
        return None
    if not isinstance(msg, dict) or any(f not in msg for f in ("msgId", "eventTime",
                                                                 "sentence")):
        return None
    try:
        ev = float(msg["eventTime"])
    except (TypeError, ValueError):
        return None
    return [(w, ev) for w in str(msg["sentence"]).split()]


def ref_windows(records: list[bytes], size: int = 10):
    """(word, window, count, minEventTime, maxEventTime) of every closed window, and the
    number of malformed records, reading ``records`` in order."""
    occ: dict[str, list[float]] = defaultdict(list)
    bad = 0
    for r in records:
        words = ref_parse(r)
        if words is None:
            bad += 1
            continue
        for w, ev in words:
            occ[w].append(ev)
    out = []
    for w, evs in occ.items():
        for k in range(len(evs) // size):
            chunk = evs[k * size:(k + 1) * size]
            out.append((w, k, size, min(chunk), max(chunk)))
    return out, bad


MALFORMED = [
    b"not json at all",
    b'{"msgId": 3, "eventTime": 1.5}',  # no sentence
    b"[1, 2, 3]",  # not an object
    b'{"msgId": 4, "eventTime": "soon", "sentence": "ray actor"}',  # eventTime not a number
    b'{"msgId": 5, "eventTime": 1.5, "sentence": "' + b"kafka " * 2000 + b'"}',  # oversize
    b'{"msgId": 6, "eventTime": 1.5, "sentence": "ray',  # truncated
]


def _wordcount_input(n: int) -> list[bytes]:
    records = list(sentences(n))
    rnd = random.Random(7)
    for bad in MALFORMED:
        records.insert(rnd.randrange(len(records)), bad)
    return records


# -- the settings and the format ---------------------------------------------------------------

def test_client_settings_are_rayflows(monkeypatch):
    """The peers' confluent settings are the ones rayflow's confluent adapters build."""
    confluent_kafka = pytest.importorskip("confluent_kafka")

    from rayflow.connectors.kafka import clients

    built = {}

    class Fake:
        def __init__(self, conf):
            built[type(self).kind] = dict(conf)

    monkeypatch.setattr(confluent_kafka, "Consumer", type("C", (Fake,), {"kind": "consumer"}))
    monkeypatch.setattr(confluent_kafka, "Producer", type("P", (Fake,), {"kind": "producer"}))
    clients._ConfluentConsumer("h:1", None, {})
    clients._ConfluentProducer("h:1", {})
    consumer = {k: v for k, v in built["consumer"].items()
                if k not in ("bootstrap.servers", "group.id")}
    producer = {k: v for k, v in built["producer"].items() if k != "bootstrap.servers"}
    assert consumer == ps.CONSUMER_CONF
    assert producer == ps.PRODUCER_CONF


def test_window_json_is_rayflows_format():
    """Same fields, order and number formatting as rayflow's W4 ``to_json``."""
    from rayflow.examples.wordcount import to_json
    from rayflow.operators.windows import WindowResult

    acc = [10, 1700000000.001, 1700000000.25, 1796140000.5, 1796140001.125]
    ours = ps.window_json("ray", 3, acc, 1796140002.0)
    theirs = to_json(WindowResult("ray", 3, 4, acc))
    assert list(json.loads(ours)) == list(json.loads(theirs)) == WINDOW_KEYS
    assert ours.split(b', "outTime"')[0] == theirs.split(b', "outTime"')[0]


def test_parse_sentence_matches_reference():
    for r in _wordcount_input(50):
        assert ps.parse_sentence(r) == ref_parse(r), r[:60]


def test_count_windows_close_every_tenth():
    w = ps.CountWindows()
    closed = [w.add(float(i % 7), 100.0 + i) for i in range(25)]
    got = [c for c in closed if c is not None]
    assert [i for i, c in enumerate(closed) if c is not None] == [9, 19]
    assert got == [(0, [10, 0.0, 6.0, 100.0, 109.0]), (1, [10, 0.0, 6.0, 110.0, 119.0])]
    assert w.acc == [5, 0.0, 6.0, 120.0, 124.0] and w.seq == 2


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="unknown peer 'flink'"):
        ps.run_peer("flink", "identity", "h:1", "a", "b", 10)
    with pytest.raises(ValueError, match="unknown workload 'sleep'"):
        ps.run_peer("bytewax", "sleep", "h:1", "a", "b", 10)
    with pytest.raises(ValueError, match="n must be a positive int"):
        ps.run_peer("bytewax", "identity", "h:1", "a", "b", 0)


# -- W2 identity -------------------------------------------------------------------------------

@pytest.mark.parametrize("partitions", [1, 3])
def test_identity(peer, partitions, kafka_broker, new_topic):
    n = 2000
    bs = kafka_broker.bootstrap
    t_in, t_out = _topics(new_topic, partitions)
    records = [b"%d,%d" % (i, 1_700_000_000_000 + 7 * i) for i in range(n)]
    produce(bs, t_in, records, partitions)

    res = ps.run_peer(peer, "identity", bs, t_in, t_out, n, timeout_s=120)

    assert res["peer"] == peer and res["workload"] == "identity"
    assert res["version"] == version(peer) and res["workers"] == 1 and res["notes"]
    assert res["threads_peak"] > 1  # the engine thread and librdkafka's, at least
    assert res["records_in"] == res["records_out"] == n
    assert res["t_launch"] <= res["t_start"] <= res["t_run"] <= res["t_done"]
    out = [m.value().split(b",") for m in _read_all(bs, t_out)]
    assert all(len(f) == 4 for f in out)
    assert Counter((f[0], f[1]) for f in out) == Counter(tuple(r.split(b",")) for r in records)
    lo, hi = math.floor(res["t_launch"] * 1000), res["t_done"] * 1000
    for _, _, t_in_ms, t_out_ms in out:
        assert lo <= int(t_in_ms) <= int(t_out_ms) <= hi


def test_child_failure_raises_with_stderr(kafka_broker, new_topic):
    _peer("bytewax")
    t_in, t_out = _topics(new_topic, 1)
    produce(kafka_broker.bootstrap, t_in, [b"1,2"] * 5)
    with pytest.raises(RuntimeError, match=r"consumed 5 records .* expected n=9"):
        ps.run_peer("bytewax", "identity", kafka_broker.bootstrap, t_in, t_out, 9,
                    timeout_s=60)


def test_child_timeout_raises(kafka_broker, new_topic):
    """Pathway's input waits for all n records: fewer in the topic end in a timeout."""
    _peer("pathway")
    t_in, t_out = _topics(new_topic, 1)
    produce(kafka_broker.bootstrap, t_in, [b"1,2"] * 5)
    with pytest.raises(TimeoutError, match="no result after 8 s"):
        ps.run_peer("pathway", "identity", kafka_broker.bootstrap, t_in, t_out, 9,
                    timeout_s=8)


# -- W4 word count -----------------------------------------------------------------------------

def _windows(bs: str, topic: str) -> list[dict]:
    msgs = _read_all(bs, topic)
    for m in msgs:  # Pathway's writer marks each record's change: no retraction gets out
        assert dict(m.headers() or ()).get("pathway_diff", b"1") == b"1"
    got = [json.loads(m.value()) for m in msgs]
    for w in got:
        assert list(w) == WINDOW_KEYS
        assert w["minEventTime"] <= w["maxEventTime"]
        assert w["minInTime"] <= w["maxInTime"] <= w["outTime"]
    return got


def test_wordcount_one_partition_matches_reference(peer, kafka_broker, new_topic):
    bs = kafka_broker.bootstrap
    t_in, t_out = _topics(new_topic, 1)
    records = _wordcount_input(500)
    produce(bs, t_in, records, 1)
    expected, bad = ref_windows(records)

    res = ps.run_peer(peer, "wordcount", bs, t_in, t_out, len(records), timeout_s=120)

    assert bad == len(MALFORMED) and res["malformed"] == bad
    assert res["records_in"] == len(records) and res["records_out"] == len(expected)
    got = _windows(bs, t_out)
    assert Counter((w["word"], w["window"], w["count"], w["minEventTime"], w["maxEventTime"])
                   for w in got) == Counter(expected)
    assert all(res["t_launch"] <= w["minInTime"] and w["outTime"] <= res["t_done"]
               for w in got)


def test_wordcount_three_partitions_totals(peer, kafka_broker, new_topic):
    bs = kafka_broker.bootstrap
    t_in, t_out = _topics(new_topic, 3)
    records = _wordcount_input(500)
    produce(bs, t_in, records, 3)
    expected, bad = ref_windows(records)

    res = ps.run_peer(peer, "wordcount", bs, t_in, t_out, len(records), timeout_s=120)

    assert res["malformed"] == bad
    got = _windows(bs, t_out)
    assert {w["count"] for w in got} == {10}
    per_word: dict[str, list[int]] = defaultdict(list)
    for w in got:
        per_word[w["word"]].append(w["window"])
    want: dict[str, list[int]] = defaultdict(list)
    for word, k, *_ in expected:
        want[word].append(k)
    assert {w: sorted(ks) for w, ks in per_word.items()} == \
        {w: sorted(ks) for w, ks in want.items()}


def test_pathway_windows_across_minibatches():
    """The Pathway reducer folds each minibatch after the state the earlier ones left, in
    consumption order within a minibatch (not the order rows arrive in), and emits every
    window once, as an insertion, at the minibatch that closed it."""
    pw = pytest.importorskip("pathway")
    from pathway.internals.parse_graph import G

    class Occ(pw.Schema):
        word: str
        seq: int
        pos: int
        ev: float
        in_s: float

    # word "a": 23 occurrences, "b": 12, over three minibatches (times 2, 4, 6)
    occ = [("a" if i % 3 else "b", i // 2, i % 2, float((i * 37) % 11), 50.0 + i)
           for i in range(35)]
    times = [2 if i < 12 else 4 if i < 27 else 6 for i in range(len(occ))]
    rows = [(*o, t, 1) for o, t in zip(occ, times)]
    random.Random(3).shuffle(rows)  # arrival order inside a minibatch is not the order

    expected = {}
    closed_at = {}
    per: dict[str, list] = defaultdict(list)
    for o, t in zip(occ, times):
        per[o[0]].append((o, t))
        chunk = per[o[0]]
        if len(chunk) % 10 == 0:
            last = chunk[-10:]
            evs, ins = [x[0][3] for x in last], [x[0][4] for x in last]
            key = (o[0], len(chunk) // 10 - 1)
            expected[key] = (10, min(evs), max(evs), min(ins), max(ins))
            closed_at[key] = t

    G.clear()
    try:
        table = pw.debug.table_from_rows(Occ, rows, is_stream=True)
        events = []
        pw.io.subscribe(ps.pathway_count_windows(pw, table),
                        lambda key, row, time, is_addition: events.append(
                            (row["word"], row["closed"], time, is_addition)))
        # default_logging=False: Pathway's own would reconfigure this process's root logger
        pw.run(monitoring_level=pw.MonitoringLevel.NONE, default_logging=False)
    finally:
        G.clear()
    assert all(add for *_, add in events)
    got = {(w, c[0]): tuple(c[1]) for w, c, _, _ in events}
    assert len(got) == len(events) == len(expected) == 3
    assert got == expected
    assert {(w, c[0]): t for w, c, t, _ in events} == closed_at


def test_record_limit_is_rayflows():
    from rayflow.examples.wordcount import MAX_RECORD_BYTES

    assert ps.MAX_RECORD_BYTES == MAX_RECORD_BYTES


def test_poll_size_is_rayflows_batch_size():
    from rayflow.config import current

    assert ps.POLL_RECORDS == current().stream.batch_size
