"""Window logic without Ray, against plain-Python ground truth, on every state backend."""

import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from rayflow.core.operators import StepContext
from rayflow.core.records import Field
from rayflow.operators.windows import (
    Aggregator,
    Count,
    CountWindow,
    EventTime,
    MinMax,
    SessionWindow,
    SlidingWindow,
    Sum,
    TumblingWindow,
    Windowed,
)
from rayflow.state import backend_from_name


@pytest.fixture(params=["memory", "filesystem", "rocksdb"])
def ctx(request, tmp_path):
    if request.param == "rocksdb":
        pytest.importorskip("rocksdict")
    return StepContext("win", 0, 1, "test", backend_from_name(request.param, str(tmp_path)))


def test_count_window_of_ten_matches_python(ctx):
    rng = np.random.default_rng(1)
    words = [f"w{int(x)}" for x in rng.integers(0, 13, 2000)]
    spec = Windowed(CountWindow(10), MinMax({"i": lambda r: r[1]}), key_fn=lambda r: r[0])
    logic = spec.build(ctx)
    records = [(w, i) for i, w in enumerate(words)]
    out = []
    for lo in range(0, len(records), 137):  # arbitrary batch boundaries
        out += logic.process(records[lo:lo + 137], None).items
    # ground truth: every 10th occurrence of a word closes a window of its last 10 positions
    seen = defaultdict(list)
    expected = []
    for w, i in records:
        seen[w].append(i)
        if len(seen[w]) % 10 == 0:
            chunk = seen[w][-10:]
            expected.append((w, len(seen[w]) // 10 - 1, {"count": 10, "min_i": chunk[0],
                                                        "max_i": chunk[-1]}))
    assert [(r.key, r.start, r.value) for r in out] == expected
    tail = logic.on_end().items
    assert sum(r.value["count"] for r in tail) == sum(len(v) % 10 for v in seen.values())


def test_count_window_state_survives_snapshot_restore(ctx):
    spec = Windowed(CountWindow(3), Count(), key_fn=str)
    a = spec.build(ctx)
    assert a.process(["x", "x", "y"], None).items == []
    handle = a.snapshot()
    b = spec.build(ctx, handle)
    out = b.process(["x", "y", "y"], None).items
    assert [(r.key, r.value) for r in out] == [("x", 3), ("y", 3)]


def test_tumbling_event_time_with_out_of_order_and_late_records(ctx):
    """Windows fire on the watermark that reaches the step, not on the records' times."""
    spec = Windowed(TumblingWindow(10.0), Sum(lambda r: r[1]), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[2]))
    logic = spec.build(ctx)
    o1 = logic.process([("k", 1, 1.0), ("k", 2, 8.0), ("k", 4, 12.0)], None)
    assert o1.items == [] and logic.on_watermark(7.0).items == []  # [0,10) still open
    o2 = logic.process([("k", 8, 3.0), ("k", 16, 16.0)], None)  # 3.0 is out of order, on time
    assert o2.items == []
    fired = logic.on_watermark(11.0)
    assert [(r.start, r.end, r.value) for r in fired.items] == [(0.0, 10.0, 11)]
    assert fired.event_times.tolist() == [np.nextafter(10.0, 0.0)]  # the window's last instant
    o3 = logic.process([("k", 32, 2.0)], None)  # its window closed: late
    assert o3.items == [] and o3.side["late"][0] == [("k", 32, 2.0)]
    assert o3.side["late"][1].tolist() == [2.0]
    assert logic.on_watermark(5.0) is None  # a watermark never goes back
    final = logic.on_end().items
    assert [(r.start, r.value) for r in final] == [(10.0, 20)]


def test_window_watermark_survives_snapshot_restore(ctx):
    """The watermark is part of the snapshot: a restored instance still finds the closed
    window closed, and fires the open one at the same event time."""
    spec = Windowed(TumblingWindow(10.0), Count(), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[1]))
    a = spec.build(ctx)
    a.process([("k", 1.0), ("k", 12.0)], None)
    assert [r.start for r in a.on_watermark(10.0).items] == [0.0]
    b = spec.build(ctx, a.snapshot())
    assert b.process([("k", 3.0)], None).side["late"][0] == [("k", 3.0)]
    assert b.on_watermark(19.0).items == []
    assert [(r.start, r.value) for r in b.on_watermark(20.0).items] == [(10.0, 1)]


def test_sliding_windows_assign_each_record_to_length_over_slide_windows():
    w = SlidingWindow(10.0, 5.0)
    assert w.windows_of(12.0) == [(5.0, 15.0), (10.0, 20.0)]
    assert TumblingWindow(10.0).windows_of(-0.5) == [(-10.0, 0.0)]


@pytest.mark.parametrize("window", [TumblingWindow(10.0), TumblingWindow(0.3, align_s=0.07),
                                    TumblingWindow(86_400.0, align_s=-3_600.0),
                                    SlidingWindow(10.0, 5.0), SlidingWindow(10.0, 3.0),
                                    SlidingWindow(1.0, 0.3, align_s=0.05)])
def test_a_batch_of_times_gets_the_windows_its_times_get_one_by_one(window):
    import random

    rnd = random.Random(5)
    times = [rnd.uniform(-1e3, 1e6) for _ in range(2_000)] + [0.0, 10.0, -10.0, 0.07, 0.37]
    times += [window.windows_of(t)[0][0] for t in times[:50]]  # on a window's start
    assert window.windows_of_many(np.asarray(times)) == [window.windows_of(t) for t in times]
    assert window.windows_of_many(np.asarray([], dtype=np.float64)) == []


@pytest.mark.parametrize("window", [TumblingWindow(10.0), SlidingWindow(10.0, 5.0),
                                    SessionWindow(5.0)])
def test_a_record_whose_time_is_not_a_number_is_a_dead_letter(ctx, window):
    spec = Windowed(window, Count(), lambda r: r[0], EventTime(timestamp=lambda r: r[1]))
    logic = spec.build(ctx)
    recs = [("a", 1.0), ("b", float("nan")), ("a", 2.0), ("c", float("inf"))]
    out = logic.process(recs, None)
    assert [(d.record[0], d.reason) for d in out.dead] == [  # (nan != nan: by key)
        ("b", "event time nan is not a finite number"),
        ("c", "event time inf is not a finite number")]
    assert [(r.key, r.value) for r in logic.on_end().items] == [("a", 2)] * (
        2 if isinstance(window, SlidingWindow) else 1)


def test_sliding_event_time_counts_match_python(ctx):
    rng = np.random.default_rng(2)
    recs = [(f"k{int(k)}", float(t)) for k, t in zip(rng.integers(0, 3, 500),
                                                        np.sort(rng.uniform(0, 100, 500)))]
    spec = Windowed(SlidingWindow(20.0, 5.0), Count(), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[1]))
    logic = spec.build(ctx)
    out = []
    for lo in range(0, 500, 50):  # in-order batches, each followed by its watermark
        part = recs[lo:lo + 50]
        assert not logic.process(part, None).side
        out += logic.on_watermark(part[-1][1]).items
    out += logic.on_end().items
    got = Counter({(r.key, r.start): r.value for r in out})
    expected = Counter()
    for k, t in recs:
        for start in np.arange(-15.0, 100.0, 5.0):
            if start <= t < start + 20.0:
                expected[(k, float(start))] += 1
    assert got == expected
    ends = [r.end for r in out]
    assert ends == sorted(ends)  # fired in order of their end


def test_event_time_clock_rejects_source_only_settings():
    from rayflow import Dataflow, MemorySource
    from rayflow.errors import ConfigError

    with pytest.raises(ValueError, match="max_delay_s must be a number >= 0"):
        EventTime(max_delay_s=-1)
    flow = Dataflow("clk")
    keyed = flow.source("in", MemorySource([1])).key_by(str)
    with pytest.raises(ConfigError, match="belong to the source"):
        keyed.window("w", TumblingWindow(1.0), Count(), clock=EventTime(max_delay_s=2.0))


@pytest.mark.parametrize("make, message", [
    (lambda: TumblingWindow(0), "TumblingWindow: length_s must be a number > 0"),
    (lambda: TumblingWindow(-1.0), "TumblingWindow: length_s must be a number > 0"),
    (lambda: TumblingWindow(float("nan")), "TumblingWindow: length_s .* got nan"),
    (lambda: TumblingWindow(float("inf")), "TumblingWindow: length_s .* got inf"),
    (lambda: TumblingWindow("10"), "TumblingWindow: length_s .* got '10'"),
    (lambda: TumblingWindow(True), "TumblingWindow: length_s .* got True"),
    (lambda: TumblingWindow(1.0, align_s=float("nan")), "TumblingWindow: align_s"),
    (lambda: SlidingWindow(10.0, 0), "SlidingWindow: slide_s must be a number > 0"),
    (lambda: SlidingWindow(-10.0, 1.0), "SlidingWindow: length_s must be a number > 0"),
    (lambda: SlidingWindow(10.0, -1.0), "SlidingWindow: slide_s"),
    (lambda: SlidingWindow(10.0, 1.0, align_s=float("inf")), "SlidingWindow: align_s"),
    (lambda: CountWindow(0), "CountWindow: size must be an int >= 1, got 0"),
    (lambda: CountWindow(2.5), "CountWindow: size .* got 2.5"),
    (lambda: CountWindow(True), "CountWindow: size .* got True"),
    (lambda: SessionWindow(float("inf")), "SessionWindow: gap_s .* got inf"),
    (lambda: EventTime(max_delay_s=float("nan")), "EventTime: max_delay_s .* got nan"),
    (lambda: EventTime(idle_timeout_s=0), "EventTime: idle_timeout_s must be a number > 0 "
                                          "or None"),
])
def test_a_window_or_clock_that_cannot_work_is_an_error_naming_it(make, message):
    """A length that is zero, negative, not finite or not a number (a window of no time,
    or one that never ends) is refused where the window is made, not met record by record
    as a division by zero or windows that never close."""
    with pytest.raises(ValueError, match=message):
        make()


def test_windows_take_numpy_numbers():
    assert TumblingWindow(np.int64(5)).windows_of(7.0) == [(5.0, 10.0)]
    assert SlidingWindow(np.float64(4.0), np.int32(2)).windows_of(5.0) == [(2.0, 6.0),
                                                                         (4.0, 8.0)]
    assert CountWindow(np.int64(3)).size == 3
    assert EventTime(idle_timeout_s=None).idle_timeout_s is None


def test_event_time_window_without_watermarks_upstream_is_an_error():
    from rayflow import CollectSink, Dataflow, MemorySource
    from rayflow.errors import ConfigError

    flow = Dataflow("nowm")
    (flow.source("in", MemorySource([1])).key_by(str)
         .window("w", TumblingWindow(1.0), Count(), clock=EventTime())
         .sink("out", CollectSink()))
    with pytest.raises(ConfigError, match="step 'w' runs on event time, but no source"):
        flow.validate()


def test_processing_time_windows_close_on_tick(ctx):
    import time

    # a long window, so that the batch itself does not close it (a processing-time batch
    # fires what its own end has passed); should the clock cross its end all the same, what
    # the batch fired counts, and the tick fires the rest: each window once
    spec = Windowed(TumblingWindow(60.0), Count(), key_fn=str)
    logic = spec.build(ctx)
    start = time.time()
    fired = list(logic.process(["a", "a", "b"], None).items)
    now = time.time()
    if now // 60.0 == start // 60.0:
        assert fired == []
        assert logic.on_tick(now) is None  # still open
    out = logic.on_tick(time.time() + 61.0)
    fired += out.items if out is not None else []
    assert sorted((r.key, r.value) for r in fired) == [("a", 2), ("b", 1)]
    assert logic.on_tick(time.time() + 200.0) is None  # fired once


def _arrow_batches(n: int, seed: int, with_nulls: bool = False):
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    words = [f"w{int(x)}" for x in rng.integers(0, 17, n)]
    if with_nulls:
        words[5] = None
    ev = rng.normal(size=n)
    return pa.table({"word": words, "eventTime": ev, "i": np.arange(n, dtype=np.int64)})


@pytest.mark.parametrize("agg", [Count(), MinMax({"eventTime": Field("eventTime")}),
                                 Sum(Field("i"))], ids=["count", "minmax", "sum"])
def test_columnar_count_window_equals_record_path(ctx, agg, tmp_path):
    """Keyed by a field, an Arrow batch takes the vectorized path: same windows, same order,
    same state (a second logic keyed by a lambda takes the record path)."""
    table = _arrow_batches(3001, 4)
    fast = Windowed(CountWindow(10), agg, key_fn=Field("word")).build(ctx)
    slow_ctx = StepContext("win2", 0, 1, "test", backend_from_name("memory", str(tmp_path)))
    slow = Windowed(CountWindow(10), agg, key_fn=lambda r: r["word"]).build(slow_ctx)
    got, want = [], []
    for lo in range(0, table.num_rows, 211):  # windows span batch boundaries
        part = table.slice(lo, 211)
        got += fast.process(part, None).items
        want += slow.process(part, None).items
    assert len(want) > 250
    assert [(r.key, r.start, r.value) for r in got] == [(r.key, r.start, r.value) for r in want]
    assert sorted((r.key, r.value) for r in fast.on_end().items) == \
        sorted((r.key, r.value) for r in slow.on_end().items)


@pytest.mark.parametrize("size", [1, 3, 10])
def test_columnar_count_window_matches_python_over_random_batches_and_a_restore(ctx, size):
    """Random batch lengths (shorter and longer than a window), many keys, a snapshot and a
    restore in the middle: every window (key, sequence, count, min/max) and their order equal
    a plain-Python count window fed record by record."""
    import pyarrow as pa

    rng = np.random.default_rng(size)
    n = 4000
    words = [f"k{int(x)}" for x in rng.zipf(1.3, n) % 300]
    ev = rng.normal(size=n).round(3)
    want, open_, seq = [], {}, defaultdict(int)
    for w, e in zip(words, ev.tolist()):
        acc = open_.setdefault(w, [0, e, e])
        acc[0] += 1
        acc[1], acc[2] = min(acc[1], e), max(acc[2], e)
        if acc[0] == size:
            want.append((w, seq[w], acc[0], acc[1], acc[2]))
            seq[w] += 1
            del open_[w]
    spec = Windowed(CountWindow(size), MinMax({"eventTime": Field("eventTime")}),
                    key_fn=Field("word"))
    logic = spec.build(ctx)
    table = pa.table({"word": words, "eventTime": ev})
    got, lo, restored = [], 0, False
    while lo < n:
        step = int(rng.integers(1, 3 * size * 20))
        got += logic.process(table.slice(lo, step), None).items
        lo += step
        if lo > n // 2 and not restored:  # go on from a snapshot in a new instance
            logic, restored = spec.build(ctx, logic.snapshot()), True
    assert [(r.key, r.start, r.value["count"], r.value["min_eventTime"],
             r.value["max_eventTime"]) for r in got] == want
    rest = sorted((r.key, r.start, r.value["count"]) for r in logic.on_end().items)
    assert rest == sorted((w, seq[w], a[0]) for w, a in open_.items())


def test_a_record_whose_aggregation_raises_is_one_dead_letter_and_counts_nowhere(ctx):
    """Sliding windows: a record belongs to two windows. When the aggregator raises on it,
    it is a dead letter once (not also late), it counts in none of its windows, and a
    window that only it would have opened does not appear."""
    from rayflow.operators.windows import Reduce

    def add(acc, rec):
        if rec[2] == "bad":
            raise ValueError("bad record")
        return acc + 1

    recs = [("a", 1.0, "ok"), ("a", 6.0, "bad"), ("a", 7.0, "ok"), ("b", 12.0, "bad"),
            ("b", 3.0, "ok")]
    spec = Windowed(SlidingWindow(10.0, 5.0), Reduce(add, 0), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[1]))
    logic = spec.build(ctx)
    out = logic.process(recs, None)
    assert [d.record for d in out.dead] == [("a", 6.0, "bad"), ("b", 12.0, "bad")]
    assert "bad record" in out.dead[0].reason and not out.side
    got = {(r.key, r.start): r.value for r in logic.on_end().items}
    # plain Python: the good records' windows [s, s + 10) with s a multiple of 5
    want = Counter((k, float(s)) for k, t, tag in recs if tag == "ok"
                   for s in range(-5, 15, 5) if s <= t < s + 10)
    assert got == dict(want)


def test_a_record_whose_key_function_raises_is_a_dead_letter_and_the_rest_count(ctx):
    """Tumbling event-time windows: the records the key function raises on are dead letters
    with the reason, each once, and the batch's other records count as plain Python does."""
    recs = [({"k": "a"}, 1.0), ({}, 2.0), ({"k": "b"}, 3.0), ({"k": "a"}, 4.0), ({}, 11.0),
            ({"k": "b"}, 12.0)]
    spec = Windowed(TumblingWindow(10.0), Count(), key_fn=lambda r: r[0]["k"],
                    clock=EventTime(timestamp=lambda r: r[1]))
    logic = spec.build(ctx)
    out = logic.process(recs, None)
    assert [d.record for d in out.dead] == [({}, 2.0), ({}, 11.0)]
    assert all("KeyError" in d.reason for d in out.dead)
    got = {(r.key, r.start): r.value for r in logic.on_end().items}
    want = Counter((r[0]["k"], float(r[1] // 10 * 10)) for r in recs if "k" in r[0])
    assert got == dict(want)


def test_columnar_count_window_null_key_and_null_value_fall_back_per_record(ctx):
    import pyarrow as pa

    table = _arrow_batches(50, 5, with_nulls=True)
    ev = table.column("eventTime").to_pylist()
    ev[7] = None
    table = table.set_column(1, "eventTime", pa.array(ev, pa.float64()))
    logic = Windowed(CountWindow(3), MinMax({"eventTime": Field("eventTime")}),
                     key_fn=Field("word")).build(ctx)
    out = logic.process(table, None)
    # the null eventTime cannot be compared: that record is a dead letter, the others count
    assert len(out.dead) == 1 and out.dead[0].record["i"] == 7
    closed = sum(r.value["count"] for r in out.items)
    partial = sum(r.value["count"] for r in logic.on_end().items)
    assert closed + partial == 49
    assert any(r.key is None for r in logic.on_end().items) or any(
        r.key is None for r in out.items)


def test_field_partitioning_matches_per_record_hash():
    from rayflow.core.records import partition_indices, stable_hash

    table = _arrow_batches(500, 6)
    groups = partition_indices(table, Field("word"), 3)
    words = table.column("word").to_pylist()
    for g, idx in enumerate(groups):
        assert all(stable_hash(words[i]) % 3 == g for i in idx.tolist())
    assert sorted(np.concatenate(groups).tolist()) == list(range(500))


def _sessions_reference(recs, gap):
    """Plain Python: per key, sorted times split where consecutive ones are more than
    ``gap`` apart; each session is (start, last + gap, count)."""
    by_key = defaultdict(list)
    for k, t in recs:
        by_key[k].append(t)
    out = set()
    for k, ts in by_key.items():
        ts.sort()
        start = prev = ts[0]
        n = 0
        for t in ts:
            if t - prev > gap:
                out.add((k, start, prev + gap, n))
                start, n = t, 0
            prev = t
            n += 1
        out.add((k, start, prev + gap, n))
    return out


def test_session_windows_merge_out_of_order_records_like_python(ctx):
    rng = np.random.default_rng(7)
    recs = [(f"k{int(k)}", float(t)) for k, t in zip(rng.integers(0, 5, 3000),
                                                        rng.uniform(0, 600, 3000).round(2))]
    order = np.argsort([t for _, t in recs], kind="stable")
    # out of order by up to 3 s: shuffle within 3-second buckets
    bucket = np.array([t // 3 for _, t in recs])[order]
    jitter = order[np.lexsort((rng.random(len(order)), bucket))]
    shuffled = [recs[i] for i in jitter]
    spec = Windowed(SessionWindow(2.0), Count(), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[1]))
    logic = spec.build(ctx)
    out, seen_max = [], -np.inf
    for lo in range(0, len(shuffled), 97):
        part = shuffled[lo:lo + 97]
        assert not logic.process(part, None).side  # within the 3 s allowed: none late
        seen_max = max(seen_max, max(t for _, t in part))
        out += logic.on_watermark(seen_max - 3.0).items
    out += logic.on_end().items
    assert {(r.key, r.start, r.end, r.value) for r in out} == _sessions_reference(recs, 2.0)
    assert len(out) == len(_sessions_reference(recs, 2.0))  # none fired twice
    assert len(logic.state) == 0


class _Times(Aggregator):
    """The event times of a window's records, in the order they were added or merged."""

    def create(self):
        return ()

    def add(self, acc, record):
        return (*acc, record[1])

    def merge(self, a, b):
        return a + b


def test_sessions_that_grow_bridge_and_open_before_others_hold_their_own_records(ctx):
    """One key's sessions opened out of order: after an existing one, before it (the
    sessions stay in start order), grown at either end, and bridged by a record that
    touches two: each fired session holds exactly its records, as plain Python's."""
    recs = [("a", t) for t in (10.0, 20.0, 1.0, 12.5, 7.5, 16.0, 0.5, 30.0, 27.5, 3.0, 5.0,
                               18.0)]
    spec = Windowed(SessionWindow(3.0), _Times(), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[1]))
    logic = spec.build(ctx)
    for i in range(0, len(recs), 3):
        assert not logic.process(recs[i:i + 3], None).side
    got = sorted((r.start, r.end, tuple(sorted(r.value))) for r in logic.on_end().items)
    times = sorted(t for _, t in recs)
    want, run = [], [times[0]]
    for t in times[1:]:
        if t - run[-1] > 3.0:
            want.append((run[0], run[-1] + 3.0, tuple(run)))
            run = []
        run.append(t)
    want.append((run[0], run[-1] + 3.0, tuple(run)))
    assert got == want
    assert len(logic.state) == 0


def test_a_late_record_that_joins_an_open_session_is_not_late(ctx):
    spec = Windowed(SessionWindow(5.0), Count(), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[1]))
    logic = spec.build(ctx)
    logic.process([("a", 10.0), ("a", 20.0), ("b", 1.0)], None)
    assert [(r.key, r.end) for r in logic.on_watermark(22.0).items] == [("b", 6.0), ("a", 15.0)]
    # [16, 21) closed on its own, but it touches the open session [20, 25): merged
    out = logic.process([("a", 16.0), ("a", 9.0)], None)
    assert out.side["late"][0] == [("a", 9.0)]
    assert [(r.start, r.end, r.value) for r in logic.on_end().items] == [(16.0, 25.0, 2)]


def test_session_windows_on_processing_time_close_on_tick(ctx):
    import time

    # a gap far longer than the batch and the first tick take, on any machine
    logic = Windowed(SessionWindow(30.0), Count(), key_fn=str).build(ctx)
    assert logic.process(["a", "a", "b"], None).items == []
    assert logic.on_tick(time.time()) is None
    out = logic.on_tick(time.time() + 31.0)
    assert sorted((r.key, r.value) for r in out.items) == [("a", 2), ("b", 1)]
    with pytest.raises(ValueError, match="gap_s must be a number > 0"):
        SessionWindow(0)


@pytest.mark.parametrize("n", [50_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_closed_sessions_leave_no_state_even_in_rocksdb(tmp_path, n):
    """10^5 keys (5 x 10^4 in the fast suite) through short sessions: the state, and the
    RocksDB directory once compacted, shrink back to (near) nothing."""
    pytest.importorskip("rocksdict")

    def du(path):
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

    ctx = StepContext("sess", 0, 1, "test", backend_from_name("rocksdb", str(tmp_path)))
    logic = Windowed(SessionWindow(1.0), Count(), key_fn=lambda r: r[0],
                     clock=EventTime(timestamp=lambda r: r[1])).build(ctx)
    for lo in range(0, n, 10_000):
        logic.process([(f"user{i}", float(i // 1000)) for i in range(lo, lo + 10_000)], None)
    logic.state.flush()  # the cache's entries and the memtable into RocksDB's files
    full = du(logic.state.path)
    assert len(logic.state) == n
    fired = logic.on_watermark(n / 1000 + 1.0).items
    assert len(fired) == n and all(r.value == 1 for r in fired)
    assert len(logic.state) == 0
    logic.state.flush()
    logic.state.db.compact_range(None, None)
    empty = du(logic.state.path)
    print(f"RocksDB directory: {full / 1e6:.2f} MB with {n} open sessions, "
          f"{empty / 1e6:.2f} MB after they closed")
    assert empty < full / 5
    logic.close()


def test_fired_windows_kept_as_partials_leave_no_state_in_rocksdb(tmp_path):
    """5 x 10^4 keys, each in two batches of one tumbling window, on RocksDB with a cache
    smaller than the keys: the window is kept as partials (two per key on disk), fires
    each key's exact count, and leaves no entry behind; the directory, once compacted,
    shrinks back to (near) nothing."""
    pytest.importorskip("rocksdict")
    from rayflow.state import RocksDBBackend

    def du(path):
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

    n = 50_000
    ctx = StepContext("win", 0, 1, "test", RocksDBBackend(str(tmp_path), cache_entries=1_000))
    logic = Windowed(TumblingWindow(10.0), Count(), key_fn=lambda r: r[0],
                     clock=EventTime(timestamp=lambda r: r[1])).build(ctx)
    for half in range(2):
        for lo in range(0, n, 10_000):
            logic.process([(f"user{i}", 1.0 + half) for i in range(lo, lo + 10_000)], None)
    logic.state.flush()
    full = du(logic.state.path)
    assert 2 * n - 1_000 <= len(logic.state) <= 2 * n  # (the cache merged a few)
    fired = logic.on_watermark(10.0).items
    assert sorted((r.key, r.value) for r in fired) == sorted((f"user{i}", 2) for i in range(n))
    assert len(logic.state) == 0
    logic.state.flush()
    logic.state.db.compact_range(None, None)
    empty = du(logic.state.path)
    assert empty < full / 5
    logic.close()


@pytest.mark.parametrize("cache_entries", [0, 2, 1_000])
def test_sliding_windows_keep_their_slices_as_partials_on_rocksdb(tmp_path, cache_entries):
    """Sliding windows (6 s every 2 s) on RocksDB: each slice is a namespace of partials,
    added to unread (no point entry per key and window), read by each of its windows'
    firings and taken by the last; every window fires each key's exact count, as plain
    Python counts it, and nothing is left behind."""
    pytest.importorskip("rocksdict")
    from rayflow.state import RocksDBBackend
    from rayflow.state.backends import PARTIAL

    ctx = StepContext("win", 0, 1, "test",
                      RocksDBBackend(str(tmp_path), cache_entries=cache_entries))
    window = SlidingWindow(6.0, 2.0)
    logic = Windowed(window, Count(), key_fn=lambda r: r[0],
                     clock=EventTime(timestamp=lambda r: r[1])).build(ctx)
    recs = [(f"k{i % 7}", 0.5 * i) for i in range(40)]  # 0.0-19.5 s
    want: dict = {}
    for key, t in recs:
        for w in window.windows_of(t):
            want[(key, *w)] = want.get((key, *w), 0) + 1
    got: dict = {}
    for lo in range(0, len(recs), 5):
        logic.process(recs[lo:lo + 5], None)
        entries = [k for k, _ in logic.state.items() if k != logic.WM]
        assert entries and all(k[0] == PARTIAL for k in entries)  # slices, as partials
        out = logic.on_watermark(recs[lo + 4][1] - 1.0)
        for r in out.items if out else ():
            assert (r.key, r.start, r.end) not in got
            got[(r.key, r.start, r.end)] = r.value
    for r in logic.on_end().items:
        got[(r.key, r.start, r.end)] = r.value
    assert got == want
    assert [k for k, _ in logic.state.items() if k != logic.WM] == []
    logic.close()


@pytest.mark.parametrize("kind", ["rocksdb", "memory", "filesystem"])
@pytest.mark.parametrize("windower", [TumblingWindow(6.0), SlidingWindow(6.0, 2.0)])
def test_windows_restored_from_one_entry_per_key_fire_them_as_partials(tmp_path, windower,
                                                                        kind):
    """A snapshot whose windows are one entry per key and window (as a window step that
    keeps no partials writes them, and as earlier versions kept every window on memory
    and filesystem state): restored into a step that keeps partials, every such window
    still fires its keys' values, merged with what comes after the restore, and no entry
    of the old kind is left."""
    from rayflow.state import RocksDBBackend, backend_from_name

    if kind == "rocksdb":
        pytest.importorskip("rocksdict")
        backend = RocksDBBackend(str(tmp_path), cache_entries=0)
    else:
        backend = backend_from_name(kind, str(tmp_path))
    old = backend.open("win", 0, "test")
    # slices (sliding) or windows (tumbling) named as the step names them
    first = windower.windows_of(1.0)[-1]
    old.put(("__w", "a", first), 3)
    old.put(("__w", "b", first), 5)
    handle = old.snapshot(1)
    old.close()
    ctx = StepContext("win", 0, 1, "test", backend)
    logic = Windowed(windower, Count(), key_fn=lambda r: r[0],
                     clock=EventTime(timestamp=lambda r: r[1])).build(ctx, handle)
    assert [k for k, _ in logic.state.items() if k[0] == "__w"] == []
    logic.process([("a", 1.0), ("c", 1.5)], None)
    got = sorted((r.key, r.start, r.end, r.value) for r in logic.on_end().items)
    want: dict = {("a", *w): 3 for w in windower.windows_of(first[0])}
    want.update({("b", *w): 5 for w in windower.windows_of(first[0])})
    for key, t in (("a", 1.0), ("c", 1.5)):
        for w in windower.windows_of(t):
            want[(key, *w)] = want.get((key, *w), 0) + 1
    assert got == sorted((*k, v) for k, v in want.items())
    logic.close()


@pytest.mark.parametrize("queue", ["WindowQueue"])
def test_the_window_queues_fire_in_time_then_key_order_and_keep_what_a_caller_left(queue):
    import random

    from rayflow.operators import queues

    rng = random.Random(3)
    entries = [(float(rng.randrange(5)), f"k{rng.randrange(50)}", (0, rng.randrange(3)))
               for _ in range(400)]
    q = getattr(queues, queue)()
    for t, k, w in entries:
        q.push(t, k, w)
    assert len(q) == 400 and q.peek() == min(t for t, _, _ in entries)
    # as a heap of (time, key text, window, arrival) pops them
    want = [(t, k, w) for t, k, w, _ in sorted((t, k, w, i) for i, (t, k, w) in
                                                enumerate(entries))]
    got = []
    it = q.pop_until(2.0)
    for _ in range(5):  # a caller that stops early: the rest stays queued
        got.append(next(it))
    it.close()
    assert len(q) == 395
    got += list(q.pop_until(2.0))
    q.push(1.0, "late", None)  # pushed after its time's bucket fired: fires next
    got += list(q.pop_until(10.0))
    early = [e for e in want if e[0] <= 2.0]
    assert got[:len(early)] == early
    assert got[len(early)] == (1.0, "late", None)
    assert got[len(early) + 1:] == [e for e in want if e[0] > 2.0]
    assert len(q) == 0 and q.peek() == float("inf")


def test_window_keys_fire_windows_by_end_and_keys_in_arrival_order():
    import random

    from rayflow.operators.queues import WindowKeys

    rng = random.Random(5)
    # windows as the tumbling windower makes them, keys in no order; some keys share a text
    # (7 and "7"), and a key may open a window more than once (the queue keeps each)
    adds = [(rng.choice([rng.randrange(300), str(rng.randrange(300))]),
             (float(s), float(s) + 10.0)) for s in (rng.randrange(0, 50, 5) for _ in range(3000))]
    q = WindowKeys()
    for key, window in adds[:2000]:
        q.add(key, window)
    by_window: dict = {}
    for key, window in adds[2000:]:
        by_window.setdefault(window, []).append(key)
    for window, keys in by_window.items():
        q.add_many(window, keys)
    assert len(q) == 3000 and q.peek() == 10.0
    # the order a heap of (end, start, arrival) entries pops them in
    arrival = adds[:2000] + [(k, w) for w, ks in by_window.items() for k in ks]
    order = sorted((w[1], w[0], i, k) for i, (k, w) in enumerate(arrival))
    expected: list = []
    for end, start, _, key in order:
        if not expected or expected[-1][0] != (start, end):
            expected.append(((start, end), []))
        expected[-1][1].append(key)
    got = q.drain(32.0)
    assert got == [e for e in expected if e[0][1] <= 32.0]
    q.add("late", (10.0, 20.0))  # opened again after its window fired: fires next
    rest = q.drain(float("inf"))
    assert rest[0] == ((10.0, 20.0), ["late"])
    assert rest[1:] == [e for e in expected if e[0][1] > 32.0]
    assert len(q) == 0 and q.peek() == float("inf")
    for key in ("1", 1, 2):
        q.add(key, (0.0, 5.0))
    q.add_many((0.0, 5.0), ["1", 0])
    assert q.drain(5.0) == [((0.0, 5.0), ["1", 1, 2, "1", 0])]


class _ListAgg(Sum):
    """Collects the records' times in a list; its merge extends its first argument in place
    (as an accumulator may), so a window must not merge into a slice's own accumulator."""

    def create(self):
        return []

    def add(self, acc, record):
        return acc + [record[1]]

    def merge(self, a, b):
        a.extend(b)
        return a

    def result(self, acc):
        return sorted(acc)


@pytest.mark.parametrize("window, agg", [
    (SlidingWindow(10.0, 2.0), Count()),
    (SlidingWindow(6.0, 3.0, align_s=1.0), Sum(lambda r: round(r[1] * 100))),  # exact sums
    (SlidingWindow(10.0, 2.5), _ListAgg())])
def test_sliding_windows_kept_as_slices_match_python_out_of_order_with_a_restore(
        ctx, window, agg):
    """Sliding windows whose aggregator merges keep one accumulator per slide, merged when a
    window fires. Out of order input from three partitions (each in order, interleaved in
    batches of random length), a watermark trailing the slowest partition after each batch,
    late records, and a restore from a snapshot midway: every window's value equals plain
    Python adding each record to the windows of it that had not fired when it came."""
    rng = np.random.default_rng(7)
    parts = [sorted(rng.uniform(0, 120, 300).round(2).tolist()) for _ in range(3)]
    keys = [[f"k{int(k)}" for k in rng.integers(0, 7, 300)] for _ in range(3)]
    pos, batches = [0, 0, 0], []
    while any(p < 300 for p in pos):
        i = int(rng.integers(0, 3))
        n = int(rng.integers(1, 40))
        if pos[i] == 300:
            continue
        batches.append([(keys[i][j], parts[i][j]) for j in range(pos[i], min(300, pos[i] + n))])
        pos[i] = min(300, pos[i] + n)
    late_every = 9  # some records come far behind the watermark: late for some windows
    for b, batch in enumerate(batches):
        if b % late_every == 4:
            batch.append((batch[0][0], max(0.0, batch[0][1] - 15.0)))
    spec = Windowed(window, agg, key_fn=lambda r: r[0], clock=EventTime(timestamp=lambda r: r[1]))
    logic = spec.build(ctx)
    want: dict = defaultdict(agg.create)
    want_late, got, got_late = [], {}, []
    wm = -math.inf
    for b, batch in enumerate(batches):
        for k, t in batch:
            ws = [w for w in window.windows_of(t) if w[1] > wm]
            for w in ws:
                want[(k, w)] = agg.add(want[(k, w)], (k, t))
            if not ws:
                want_late.append((k, t))
        out = logic.process(batch, None)
        got_late += out.side["late"][0] if "late" in out.side else []
        wm = max(wm, min(t for k, t in batch) - 1.0)
        fired = logic.on_watermark(wm)  # (None: the watermark did not advance)
        for r in fired.items if fired is not None else []:
            assert r.end <= wm and (r.key, (r.start, r.end)) not in got
            got[(r.key, (r.start, r.end))] = r.value
        if b == len(batches) // 2:  # go on from a snapshot in a new instance
            logic = spec.build(ctx, logic.snapshot())
    for r in logic.on_end().items:
        got[(r.key, (r.start, r.end))] = r.value
    assert got == {kw: agg.result(a) for kw, a in want.items()}
    assert got_late == want_late and want_late  # the late ones went aside, and there were some


@pytest.mark.parametrize("windower", [TumblingWindow(1.0), SlidingWindow(3.0, 1.0),
                                      SlidingWindow(2.5, 1.0)])  # (the last is not sliced)
def test_windows_read_in_batches_from_rocksdb_match_the_memory_backend(tmp_path, windower):
    """Without its cache every batch's windows are read from RocksDB in one multi-get, built
    per distinct key where a batch falls in one window and per record where it spans
    several; late records, a key function that raises and a time that is not a number
    among them: the same results, late records and dead letters as the memory backend."""
    pytest.importorskip("rocksdict")
    from rayflow.state import MemoryBackend, RocksDBBackend

    rng = np.random.default_rng(7)
    batches = []
    for b in range(40):
        n = int(rng.integers(1, 60))
        if b % 3:  # one window's worth of time, or...
            times = b + rng.uniform(0.0, 0.9, n)
        else:  # ...several windows, out of order
            times = b + rng.uniform(-6.0, 2.0, n)
        recs = [(f"k{int(k)}", float(t)) for k, t in zip(rng.integers(0, 12, n), times)]
        if b % 7 == 0:
            recs[0] = (None, recs[0][1])  # the key function raises on it
        if b % 11 == 0:
            recs[-1] = (recs[-1][0], float("nan"))
        batches.append(recs)

    def key(r):
        return r[0].upper()

    def run(backend):
        ctx = StepContext("win", 0, 1, "test", backend)
        logic = Windowed(windower, Count(), key_fn=key,
                         clock=EventTime(timestamp=lambda r: r[1])).build(ctx)
        # each firing's results (in no promised order within a firing: RocksDB returns a
        # window's keys in its own order), late records and dead letters in order
        results, late, dead = [], [], []
        for b, recs in enumerate(batches):
            out = logic.process(recs, None)
            late += out.side.get("late", ([], None))[0]
            dead += [(d.record, d.reason) for d in out.dead]
            results.append(sorted(logic.on_watermark(b - 1.0).items))
        results.append(sorted(logic.on_end().items))
        return results, late, dead

    expected = run(MemoryBackend())
    assert expected[1] and len(expected[2]) >= 8  # late records and dead letters among them
    assert run(RocksDBBackend(str(tmp_path), cache_entries=0)) == expected
    assert run(RocksDBBackend(str(tmp_path), cache_entries=16)) == expected


@pytest.mark.parametrize("windower", [TumblingWindow(2.0), SlidingWindow(4.0, 2.0)])
def test_time_windows_restored_from_any_snapshot_go_on_as_if_uninterrupted(ctx, windower):
    """A snapshot after every batch (on the memory backend a chain of deltas, and full ones
    once most keys changed, when the step writes its dict in place), a restore from several
    of them into a new instance: what that instance fires from there on, after what fired
    before the snapshot, is exactly the uninterrupted run's output (in the order of the
    windows' ends; a restored instance may fire one window's keys in another order)."""
    rng = np.random.default_rng(3)
    batches, t = [], 0.0
    for _ in range(30):
        n = int(rng.integers(20, 120))
        times = t + rng.uniform(0.0, 1.5, n)
        t += 0.7
        batches.append([(f"k{int(k)}", float(x)) for k, x in zip(rng.integers(0, 40, n), times)])
    spec = Windowed(windower, Count(), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[1]))

    def feed(logic, part, first):
        out = []
        for b, recs in enumerate(part, first):
            logic.process(recs, None)
            out += sorted((r.end, r.key, r.start, r.value)
                          for r in logic.on_watermark(0.7 * b - 1.0).items)
        return out

    reference = feed(spec.build(ctx), batches, 0)
    a, before, handles = spec.build(ctx), [], []
    for b, recs in enumerate(batches):
        before.append(feed(a, [recs], b))
        handles.append(a.snapshot())
    end = sorted((r.end, r.key, r.start, r.value) for r in a.on_end().items)
    assert sum(before, []) == reference
    for cut in (0, 4, 11, 19, 28):
        restored = spec.build(ctx, handles[cut])
        after = feed(restored, batches[cut + 1:], cut + 1)
        assert sum(before[:cut + 1], []) + after == reference, cut
        assert sorted((r.end, r.key, r.start, r.value) for r in restored.on_end().items) == end
