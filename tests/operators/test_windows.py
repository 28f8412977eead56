"""Window logic without Ray, against plain-Python ground truth, on every state backend."""

from collections import Counter, defaultdict

import numpy as np
import pytest

from rayflow.batches import Field
from rayflow.operators.base import StepContext
from rayflow.operators.windows import (
    Count,
    CountWindow,
    EventTime,
    MinMax,
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
    spec = Windowed(TumblingWindow(10.0), Sum(lambda r: r[1]), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[2], max_delay_s=5.0))
    logic = spec.build(ctx)
    o1 = logic.process([("k", 1, 1.0), ("k", 2, 8.0), ("k", 4, 12.0)], None)
    assert o1.items == []  # watermark 7: window [0,10) still open
    o2 = logic.process([("k", 8, 3.0), ("k", 16, 16.0)], None)  # 3.0 is out of order, on time
    assert [(r.start, r.end, r.value) for r in o2.items] == [(0.0, 10.0, 11)]
    o3 = logic.process([("k", 32, 2.0)], None)  # its window closed: late
    assert o3.items == [] and o3.side["late"][0] == [("k", 32, 2.0)]
    final = logic.on_end().items
    assert [(r.start, r.value) for r in final] == [(10.0, 20)]


def test_sliding_windows_assign_each_record_to_length_over_slide_windows():
    w = SlidingWindow(10.0, 5.0)
    assert w.windows_of(12.0) == [(5.0, 15.0), (10.0, 20.0)]
    assert TumblingWindow(10.0).windows_of(-0.5) == [(-10.0, 0.0)]


def test_sliding_event_time_sums_match_python(ctx):
    rng = np.random.default_rng(2)
    recs = [(f"k{int(k)}", float(t)) for k, t in zip(rng.integers(0, 3, 500),
                                                        np.sort(rng.uniform(0, 100, 500)))]
    spec = Windowed(SlidingWindow(20.0, 5.0), Count(), key_fn=lambda r: r[0],
                    clock=EventTime(timestamp=lambda r: r[1]))
    logic = spec.build(ctx)
    out = logic.process(recs, None).items + logic.on_end().items
    got = Counter({(r.key, r.start): r.value for r in out})
    expected = Counter()
    for k, t in recs:
        for start in np.arange(-15.0, 100.0, 5.0):
            if start <= t < start + 20.0:
                expected[(k, float(start))] += 1
    assert got == expected


def test_idle_timeout_advances_the_watermark(ctx):
    spec = Windowed(TumblingWindow(10.0), Count(), key_fn=str,
                    clock=EventTime(timestamp=lambda r: 1.0, max_delay_s=0.0, idle_timeout_s=0.5))
    logic = spec.build(ctx)
    assert logic.process(["a"], None).items == []
    import time

    assert logic.on_tick(time.time()) is None
    out = logic.on_tick(time.time() + 20.0)  # idle long enough: [0, 10) closes
    assert [(r.key, r.value) for r in out.items] == [("a", 1)]


def test_processing_time_windows_close_on_tick(ctx):
    spec = Windowed(TumblingWindow(0.05), Count(), key_fn=str)
    logic = spec.build(ctx)
    logic.process(["a", "a", "b"], None)
    import time

    out = logic.on_tick(time.time() + 1.0)
    assert sorted((r.key, r.value) for r in out.items) == [("a", 2), ("b", 1)]


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
    from rayflow.batches import partition_indices, stable_hash

    table = _arrow_batches(500, 6)
    groups = partition_indices(table, Field("word"), 3)
    words = table.column("word").to_pylist()
    for g, idx in enumerate(groups):
        assert all(stable_hash(words[i]) % 3 == g for i in idx.tolist())
    assert sorted(np.concatenate(groups).tolist()) == list(range(500))
