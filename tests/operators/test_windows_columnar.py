"""Tumbling windows over Arrow batches kept as columns, without Ray: against plain Python and
the record path, out of order from several partitions, on every state backend, through a
restore, a rescale and a change of step."""

import math
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from rayflow.core.operators import Rescaled, StepContext, owns
from rayflow.core.records import Field
from rayflow.operators.windows import (
    Count,
    EventTime,
    MinMax,
    Sum,
    TumblingWindow,
    Windowed,
    columnar,
)
from rayflow.state import backend_from_name
from tests.operators._drive import partitions, rounds

SIZE = 4.0
AGGS = {
    "count": (Count(), lambda vs: len(vs)),
    "sum": (Sum(Field("v")), lambda vs: sum(vs)),
    "minmax": (MinMax({"v": Field("v")}),
               lambda vs: {"count": len(vs), "min_v": min(vs), "max_v": max(vs)}),
}


def _records(n=3000, keys=40, span=60.0, seed=3, str_keys=False):
    rng = np.random.default_rng(seed)
    ks = rng.integers(0, keys, n).tolist()
    return [{"k": f"u{k}" if str_keys else k, "v": int(v), "t": float(t)} for k, v, t in
            zip(ks, rng.integers(-50, 1000, n).tolist(), rng.uniform(0, span, n).tolist())]


def _reference(recs, value_of, size=SIZE):
    by = defaultdict(list)
    for r in recs:
        start = math.floor(r["t"] / size) * size
        by[(r["k"], start)].append(r["v"])
    return sorted((k, s, s + size, repr(value_of(vs))) for (k, s), vs in by.items())


def _norm(results):
    return sorted((r.key, r.start, r.end, repr(r.value)) for r in results)


def _feed(recs, parts=3, step=97):
    return list(rounds(partitions(recs, parts, delay=2.0, time=lambda r: r["t"]), step,
                       delay=2.0, time=lambda r: r["t"]))


def _backend(kind, tmp_path):
    if kind == "rocksdb":
        pytest.importorskip("rocksdict")
    return backend_from_name(kind, str(tmp_path / kind))


def _spec(agg, **kw):
    return Windowed(TumblingWindow(SIZE), agg, key_fn=Field("k"), clock=EventTime(), **kw)


def _wm(logic, wm):
    out = logic.on_watermark(wm) if wm > -math.inf else None
    return out.items if out is not None else []


def _run(logic, feed, arrow=True):
    got, late = [], []
    for batch, times, wm in feed:
        out = logic.process(pa.Table.from_pylist(batch) if arrow else batch, times)
        got += out.items
        late += out.side.get("late", ([],))[0]
        got += _wm(logic, wm)
    got += logic.on_end().items
    return got, late


@pytest.mark.parametrize("kind", ["memory", "filesystem", "rocksdb"])
@pytest.mark.parametrize("agg", sorted(AGGS))
@pytest.mark.parametrize("str_keys", [False, True])
def test_arrow_batches_give_the_windows_of_plain_python_and_of_the_record_path(
        tmp_path, kind, agg, str_keys):
    recs = _records(str_keys=str_keys)
    feed = _feed(recs)
    spec = _spec(AGGS[agg][0])
    logic = spec.build(StepContext("w", 0, 1, "t", _backend(kind, tmp_path)))
    assert logic._arrow is not None  # the columnar path is the one under test
    got, late = _run(logic, feed)
    assert not late
    assert _norm(got) == _reference(recs, AGGS[agg][1])
    rows = spec.build(StepContext("w", 0, 1, "t", _backend(kind, tmp_path / "rows")))
    by_rows, _ = _run(rows, feed, arrow=False)
    # the same results, windows in the same order (the order of a window's keys is not
    # promised: Arrow's grouping has its own)
    assert [r.start for r in got] == [r.start for r in by_rows]
    assert _norm(got) == _norm(by_rows)


def test_late_records_and_times_that_are_not_numbers_leave_as_on_the_record_path():
    spec = _spec(Count())
    first = [{"k": 1, "v": 1, "t": 1.0}, {"k": 2, "v": 1, "t": 5.0}]
    then = [{"k": 1, "v": 2, "t": 2.0}, {"k": 3, "v": 3, "t": -1.0},  # (its time: NaN)
            {"k": 1, "v": 4, "t": 6.0}, {"k": 4, "v": 5, "t": 3.5}]
    results = {}
    for arrow in (True, False):
        logic = spec.build(StepContext("w", 0, 1))
        wrap = pa.Table.from_pylist if arrow else list
        out = logic.process(wrap(first), np.array([r["t"] for r in first]))
        fired = logic.on_watermark(4.5).items  # closes [0, 4)
        out = logic.process(wrap(then), np.array([2.0, math.nan, 6.0, 3.5]))
        late, late_t = out.side["late"]
        results[arrow] = ([(r.key, r.start, r.value) for r in fired + logic.on_end().items],
                          late, late_t.tolist(),
                          [(d.reason, d.record) for d in out.dead])
    assert results[True] == results[False]
    fired, late, late_t, dead = results[True]
    assert fired == [(1, 0.0, 1), (2, 4.0, 1), (1, 4.0, 1)]
    assert late == [{"k": 1, "v": 2, "t": 2.0}, {"k": 4, "v": 5, "t": 3.5}]
    assert late_t == [2.0, 3.5]
    assert len(dead) == 1 and dead[0][1]["k"] == 3 and "not a finite number" in dead[0][0]


@pytest.mark.parametrize("kind", ["memory", "filesystem", "rocksdb"])
def test_a_restore_from_any_snapshot_goes_on_as_if_uninterrupted(tmp_path, kind):
    recs = _records(n=2000, seed=5)
    feed = _feed(recs)
    spec = _spec(MinMax({"v": Field("v")}))
    backend = _backend(kind, tmp_path)
    want = _reference(recs, AGGS["minmax"][1])
    for cut in (3, len(feed) // 2, len(feed) - 2):
        logic = spec.build(StepContext("w", 0, 1, "t", backend))
        got = []
        for batch, times, wm in feed[:cut]:
            got += logic.process(pa.Table.from_pylist(batch), times).items
            got += _wm(logic, wm)
        handle = logic.snapshot()
        assert any(columnar.is_cw(k) for k, _ in logic.state.items())
        logic.close()
        resumed = spec.build(StepContext("w", 0, 1, "t", backend), handle)
        more, _ = _run(resumed, feed[cut:])
        assert _norm(got + more) == want, cut


def test_a_rescale_splits_each_window_by_the_keys_each_instance_owns(tmp_path):
    recs = _records(n=2500, keys=60, seed=7, str_keys=True)
    feed = _feed(recs)
    spec = _spec(Sum(Field("v")))
    backend = _backend("rocksdb", tmp_path)
    one = spec.build(StepContext("w", 0, 1, "t", backend))
    got, cut = [], len(feed) // 2
    for batch, times, wm in feed[:cut]:
        got += one.process(pa.Table.from_pylist(batch), times).items
        got += _wm(one, wm)
    handle = one.snapshot()
    many = [spec.build(StepContext("w", i, 3, "t", backend), Rescaled((handle,), 1))
            for i in range(3)]
    for logic in many:  # each holds the open windows of its keys, and no other key
        keys = {k for key, t in logic.state.items() if columnar.is_cw(key)
                for k in t.column(0).to_pylist()}
        assert keys and all(owns(k, logic.ctx) for k in keys)
    for batch, times, wm in feed[cut:]:
        for logic in many:
            mine = [j for j, r in enumerate(batch) if owns(r["k"], logic.ctx)]
            if mine:
                got += logic.process(pa.Table.from_pylist([batch[j] for j in mine]),
                                     times[mine]).items
            got += _wm(logic, wm)
    for logic in many:
        got += logic.on_end().items
    assert _norm(got) == _reference(recs, AGGS["sum"][1])


def test_batches_the_columns_cannot_take_go_the_record_way_into_the_same_windows():
    """A null value (a dead letter on the record path), a value column of another type, and
    batches of records: each takes the record path, and the windows merge both."""
    spec = _spec(Sum(Field("v")))
    logic = spec.build(StepContext("w", 0, 1))
    t = np.array([1.0, 2.0])
    logic.process(pa.Table.from_pylist([{"k": "a", "v": 1, "t": 1.0},
                                        {"k": "b", "v": 2, "t": 2.0}]), t)
    out = logic.process(pa.Table.from_pylist([{"k": "a", "v": None, "t": 1.0},
                                              {"k": "a", "v": 10, "t": 2.0}]), t)
    assert len(out.dead) == 1 and out.dead[0].record == {"k": "a", "v": None, "t": 1.0}
    logic.process(pa.Table.from_pylist([{"k": "b", "v": 0.5, "t": 1.0}]), t[:1])  # floats
    logic.process([{"k": "c", "v": 7, "t": 3.0}, {"k": "a", "v": 100, "t": 3.5}],
                  np.array([3.0, 3.5]))
    logic.process(pa.Table.from_pylist([{"k": "a", "v": 1000, "t": 3.9}]), np.array([3.9]))
    got = {r.key: r.value for r in logic.on_watermark(4.0).items}
    assert got == {"a": 1111, "b": 2.5, "c": 7}
    assert logic.on_end().items == []


def test_a_step_resumed_without_columns_takes_the_windows_a_snapshot_kept_as_columns(
        tmp_path):
    recs = _records(n=1500, seed=11)
    feed = _feed(recs)
    backend = _backend("rocksdb", tmp_path)
    cols = _spec(Count()).build(StepContext("w", 0, 1, "t", backend))
    got, cut = [], len(feed) // 2
    for batch, times, wm in feed[:cut]:
        got += cols.process(pa.Table.from_pylist(batch), times).items
        got += _wm(cols, wm)
    handle = cols.snapshot()
    # the same step with a time to live keeps its windows record by record
    rows = _spec(Count(), ttl_s=3600.0).build(StepContext("w", 0, 1, "t", backend), handle)
    assert rows._arrow is None
    more, _ = _run(rows, feed[cut:])
    assert _norm(got + more) == _reference(recs, AGGS["count"][1])
    assert not any(columnar.is_cw(k) for k, _ in rows.state.items())


@pytest.mark.parametrize("group_rows", [1, 1 << 16])
def test_many_batches_of_a_window_are_merged_as_they_come(monkeypatch, group_rows):
    """A window's tables are merged once they hold COMPACT_ROWS rows (and four times the
    last merge's), so it holds a few rows per key, and its value is the same, whichever
    way they merge (numpy by Arrow's dictionary codes, or Arrow's grouping from
    GROUP_ROWS rows up)."""
    monkeypatch.setattr(columnar, "COMPACT_ROWS", 64)
    monkeypatch.setattr(columnar, "GROUP_ROWS", group_rows)
    recs = _records(n=5000, keys=30, span=8.0, seed=13)
    feed = _feed(recs, step=40)
    logic = _spec(MinMax({"v": Field("v")})).build(StepContext("w", 0, 1))
    most = 0
    got = []
    for batch, times, wm in feed:
        got += logic.process(pa.Table.from_pylist(batch), times).items
        most = max([most] + [sum(t.num_rows for t in ts)
                             for ts in logic._arrow.open.values()])
        got += _wm(logic, wm)
    got += logic.on_end().items
    assert _norm(got) == _reference(recs, AGGS["minmax"][1])
    assert most < 8 * 30 + 3 * 40  # (a window's 30 keys: merged at 240 rows at most)


@pytest.mark.parametrize("group_rows", [1, 1 << 16])
def test_float_sums_and_extremes_match_python_to_the_last_bits_that_order_allows(
        monkeypatch, group_rows):
    monkeypatch.setattr(columnar, "GROUP_ROWS", group_rows)
    rng = np.random.default_rng(17)
    recs = [{"k": int(k), "v": float(v), "t": float(t)} for k, v, t in zip(
        rng.integers(0, 9, 2000).tolist(), rng.normal(0, 1e3, 2000).tolist(),
        rng.uniform(0, 20, 2000).tolist())]
    feed = _feed(recs)
    for agg, value_of in [(Sum(Field("v")), sum),
                          (MinMax({"v": Field("v")}), lambda vs: (min(vs), max(vs)))]:
        got, _ = _run(_spec(agg).build(StepContext("w", 0, 1)), feed)
        by = defaultdict(list)
        for r in recs:
            by[(r["k"], math.floor(r["t"] / SIZE) * SIZE)].append(r["v"])
        assert len(got) == len(by)
        for r in got:
            want = value_of(by[(r.key, r.start)])
            if isinstance(agg, Sum):
                assert r.value == pytest.approx(want, rel=1e-12, abs=1e-9)
            else:  # minima and maxima are exact
                assert (r.value["min_v"], r.value["max_v"]) == want


@pytest.mark.parametrize("kind", ["memory", "filesystem", "rocksdb"])
def test_windows_written_at_every_checkpoint_fire_whole_and_leave_nothing(tmp_path, kind):
    """Checkpoints every few batches, a restore from one of them: on RocksDB each
    checkpoint writes what came since the last and it leaves memory (a window is then
    several entries, which its firing reads back); elsewhere a window is one entry, written
    when it changed. Either way the windows are those of plain Python, and a fired window
    leaves no entry."""
    recs = _records(n=4000, keys=25, span=40.0, seed=23)
    feed = _feed(recs, step=60)
    spec = _spec(Sum(Field("v")))
    backend = _backend(kind, tmp_path)
    logic = spec.build(StepContext("w", 0, 1, "t", backend))
    got, handles, parts = [], [], 0
    for n, (batch, times, wm) in enumerate(feed):
        got += logic.process(pa.Table.from_pylist(batch), times).items
        got += _wm(logic, wm)
        if n % 3 == 2:
            handles.append((n, len(got), logic.snapshot()))
            arrow = logic._arrow
            in_memory = sum(len(t) for ts in arrow.open.values() for t in ts)
            assert (in_memory == 0) == (kind == "rocksdb") or not arrow.open
            parts = max([parts] + [len(p) for p in arrow.stored.values()])
    got += logic.on_end().items
    want = _reference(recs, AGGS["sum"][1])
    assert _norm(got) == want
    assert parts > 1 if kind == "rocksdb" else parts == 1
    assert not any(columnar.is_cw(k) for k, _ in logic.state.items())
    # a restore from a checkpoint in the middle goes on to the same windows
    n, emitted, handle = handles[len(handles) // 2]
    again = spec.build(StepContext("w", 0, 1, "t", backend), handle)
    more, _ = _run(again, feed[n + 1:])
    assert _norm(got[:emitted] + more) == want


def test_a_key_column_arrow_cannot_group_by_takes_the_record_path():
    """Keys that are lists: the record path's outcome (here dead letters: a list is no
    key), not an error from Arrow at the window's firing."""
    spec = _spec(Count())
    recs = [{"k": [1, 2], "v": 1, "t": 1.0}, {"k": [3], "v": 2, "t": 2.0}]
    outs = []
    for batch in (pa.Table.from_pylist(recs), recs):
        logic = spec.build(StepContext("w", 0, 1))
        out = logic.process(batch, np.array([1.0, 2.0]))
        outs.append(([d.record for d in out.dead], logic.on_end().items))
    assert outs[0] == outs[1]
    assert outs[0][0] == recs


def test_aligned_windows_and_nan_values_name_and_count_as_on_the_record_path():
    """Windows aligned off the epoch get the record path's bounds; a batch with a NaN in
    the field takes the record path, whose comparisons say what its minimum is."""
    spec = Windowed(TumblingWindow(3.0, align_s=0.7), MinMax({"v": Field("v")}),
                    key_fn=Field("k"), clock=EventTime())
    recs = _records(n=1200, keys=7, span=30.0, seed=29)
    recs = [{**r, "v": float(r["v"])} for r in recs]
    recs[5]["v"] = math.nan
    feed = _feed(recs)
    got = {}
    for arrow in (True, False):
        res, _ = _run(spec.build(StepContext("w", 0, 1)), feed, arrow=arrow)
        got[arrow] = sorted((r.key, r.start, r.end, r.value["count"], r.value["min_v"],
                             r.value["max_v"]) for r in res if r.key != recs[5]["k"]
                            or r.start > recs[5]["t"] or r.end <= recs[5]["t"])
        assert len(res) == len({(r.key, r.start) for r in res})
    assert got[True] == got[False]
    assert {s for _, s, *_ in got[True]} == {0.7 + 3.0 * i for i in range(-1, 10)}


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_processing_time_windows_over_arrow_batches_close_on_tick(tmp_path, kind):
    """On processing time the clock names a batch's window, and a tick fires it; each
    window once, with the counts of every batch that fell in it."""
    import time

    spec = Windowed(TumblingWindow(60.0), Sum(Field("v")), key_fn=Field("k"))
    logic = spec.build(StepContext("w", 0, 1, "t", _backend(kind, tmp_path)))
    assert logic._arrow is not None
    fired = []
    for batch in ([{"k": "a", "v": 1}, {"k": "b", "v": 2}], [{"k": "a", "v": 10}]):
        fired += logic.process(pa.Table.from_pylist(batch), None).items
    logic.snapshot()  # (RocksDB: the window's columns leave memory; the firing reads them)
    out = logic.on_tick(time.time() + 61.0)
    fired += out.items if out is not None else []
    got: dict = defaultdict(int)
    for r in fired:  # (a batch may cross a minute's end: two windows, each once)
        got[r.key] += r.value
    assert dict(got) == {"a": 11, "b": 2}
    assert len(fired) == len({(r.key, r.start) for r in fired})
    assert logic.on_tick(time.time() + 200.0) is None


@pytest.mark.parametrize("group_rows", [1, 1 << 16])
@pytest.mark.parametrize("key_type", ["int", "string", "dictionary", "bool", "timestamp"])
def test_keys_of_every_groupable_type_merge_as_they_grow(monkeypatch, group_rows, key_type):
    """A window's tables merge many times (small thresholds), whichever way, whatever the
    key column's type: the sums are plain Python's, keys as the record path reads them."""
    import datetime

    monkeypatch.setattr(columnar, "COMPACT_ROWS", 8)
    monkeypatch.setattr(columnar, "GROUP_ROWS", group_rows)
    values = {"int": [3, 1, 4, 5, 9], "string": ["a", "b", "c", "d", "e"],
              "dictionary": ["a", "b", "c", "d", "e"], "bool": [True, False],
              "timestamp": [datetime.datetime(2026, 1, 1, h) for h in range(4)]}[key_type]
    logic = _spec(Sum(Field("v"))).build(StepContext("w", 0, 1))
    want: dict = defaultdict(int)
    for b in range(30):
        ks = [values[(b * 7 + i) % len(values)] for i in range(6)]
        table = pa.table({"k": ks, "v": list(range(b, b + 6))})
        if key_type == "dictionary":
            table = table.cast(pa.schema([("k", pa.dictionary(pa.int32(), pa.string())),
                                          ("v", pa.int64())]))
        logic.process(table, np.full(6, 1.0))
        for k, v in zip(ks, range(b, b + 6)):
            want[k] += v
    # every batch went in as columns: the window has none of the record path's state
    assert logic._arrow.has((0.0, SIZE))
    assert logic.state.read_partials((0.0, SIZE), logic._merge) == []
    assert {r.key: r.value for r in logic.on_end().items} == dict(want)
