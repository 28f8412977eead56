"""Lookup joins and cached enrichment without Ray, against plain Python, on every state
backend, through a restore and a rescale."""

import math
from collections import Counter

import numpy as np
import pytest

from rayflow.core.operators import StepContext
from rayflow.operators.lookup import EnrichCached, LookupJoin
from rayflow.operators.windows import EventTime
from tests.operators._drive import (
    ctx_for,
    lookup_reference,
    partitions,
    rescaled_run,
    run_each_watermark,
    run_logic,
    two_inputs,
)

KEY = lambda r: r[0]  # noqa: E731


def _data(seed=0, n=900, versions=150, keys=7, span=200.0):
    rng = np.random.default_rng(seed)
    stream = [(f"k{int(k)}", float(t), f"r{i}") for i, (k, t) in
              enumerate(zip(rng.integers(0, keys, n), rng.uniform(0, span, n)))]
    table = [(f"k{int(k)}", float(t), f"v{i}") for i, (k, t) in
             enumerate(zip(rng.integers(0, keys, versions), rng.uniform(0, span, versions)))]
    return stream, table





def _feed(stream, table, seed=0):
    return two_inputs(partitions(stream, 3, seed=seed), partitions(table, 2, seed=seed + 1))


@pytest.mark.parametrize("how", ["inner", "left"])
def test_event_time_lookup_join_is_the_value_as_of_each_record(backend, how):
    stream, table = _data()
    feed, index = _feed(stream, table)
    logic = LookupJoin(KEY, KEY, how, EventTime()).build(ctx_for(backend))
    got = run_logic(logic, feed, index)
    assert Counter(got) == lookup_reference(stream, table, how)
    # only what a later record can still need is kept: of 150 versions, a few per key
    kept = [len(v) for k, v in logic.state.items() if k[0] == "__t"]
    assert len(kept) == 7 and max(kept) <= 2


def test_lookup_join_after_a_restore(backend):
    stream, table = _data(1)
    feed, index = _feed(stream, table, 1)
    spec = LookupJoin(KEY, KEY, "inner", EventTime())
    half = len(feed) // 2
    first = spec.build(ctx_for(backend))
    got = []
    for n, (batch, times, wm) in enumerate(feed[:half]):
        out = first.process_input(index[n], batch, times)
        got += out.items
        w = first.on_watermark(wm)
        got += w.items if w else []
    handle = first.snapshot()
    assert any(k[0] == "__l" for k, _ in first.state.items())  # records waiting
    rest_index = index[half:]
    got += run_logic(spec.build(ctx_for(backend), handle), feed[half:], rest_index)
    assert Counter(got) == lookup_reference(stream, table)


def test_lookup_join_rescaled(backend):
    stream, table = _data(2)
    feed, index = _feed(stream, table, 2)
    third = len(feed) // 3
    got = rescaled_run(LookupJoin(KEY, KEY, "left", EventTime()), backend, feed[:third],
                       feed[third:], lambda r, n: r[0], index=index)
    assert Counter(got) == lookup_reference(stream, table, "left")


@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("seed", [0, 3])
def test_records_join_once_the_tables_own_watermark_passes_them(backend, how, seed):
    """With each input's watermark given apart, a record is emitted once the table's has
    passed its time, before the stream's lets the step's watermark do it: the same joins
    as the plain reference, out of order, several partitions on each side."""
    stream, table = _data(seed)
    logic = LookupJoin(KEY, KEY, how, EventTime()).build(ctx_for(backend))
    got, early = run_each_watermark(logic, partitions(stream, 3, seed=seed),
                                    partitions(table, 2, seed=seed + 1))
    assert Counter(got) == lookup_reference(stream, table, how)
    assert early > len(stream) // 3  # (the table, shorter, ends first: then all are early)


def test_a_finished_static_table_joins_every_record_as_it_comes(backend):
    table = [(f"k{k}", 0.0, f"v{k}") for k in range(5)]
    logic = LookupJoin(KEY, KEY, "inner", EventTime()).build(ctx_for(backend))
    assert logic.process_input(1, table, np.zeros(5)).items == []
    assert logic.process_input(0, [("k1", 3.0, "a")], np.array([3.0])).items == []  # waits
    fired = logic.on_input_watermark(1, math.inf)  # the table ended
    assert fired.items == [("k1", ("k1", 3.0, "a"), ("k1", 0.0, "v1"))]
    out = logic.process_input(0, [("k4", 9.0, "b"), ("k9", 1.0, "c"), ("k2", 2.0, "d")],
                              np.array([9.0, 1.0, 2.0]))  # the stream's watermark: none yet
    assert out.items == [("k4", ("k4", 9.0, "b"), ("k4", 0.0, "v4")),
                         ("k2", ("k2", 2.0, "d"), ("k2", 0.0, "v2"))]
    assert out.event_times.tolist() == [9.0, 2.0]
    assert not [k for k, _ in logic.state.items() if k[0] == "__l"]  # nothing waits
    assert logic.on_watermark(100.0).items == [] and logic.on_end().items == []


def test_a_table_record_behind_the_tables_watermark_is_late():
    logic = LookupJoin(KEY, KEY, "inner", EventTime()).build(StepContext("l", 0, 1))
    logic.on_input_watermark(1, 10.0)
    out = logic.process_input(1, [("a", 4.0, "v"), ("a", 11.0, "w")], np.array([4.0, 11.0]))
    assert out.side["late"][0] == [("a", 4.0, "v")]
    # the stream record at 5 joined nothing (inner), the one at 12 the version at 11
    assert logic.process_input(0, [("a", 5.0, "x")], np.array([5.0])).items == []
    logic.on_input_watermark(1, 20.0)
    assert logic.process_input(0, [("a", 12.0, "y")], np.array([12.0])).items == [
        ("a", ("a", 12.0, "y"), ("a", 11.0, "w"))]


def test_the_tables_watermark_is_restored_with_the_state(backend):
    """A table record behind the table's watermark is late after a restore too, before any
    upstream instance has announced its watermark again: the failure-free run's output."""
    def run(restore: bool):
        spec = LookupJoin(KEY, KEY, "inner", EventTime())
        logic = spec.build(ctx_for(backend))
        logic.process_input(1, [("a", 1.0, "v1")], np.array([1.0]))
        logic.on_input_watermark(1, 10.0)
        if restore:
            logic = spec.build(ctx_for(backend), logic.snapshot())
        out = logic.process_input(1, [("a", 5.0, "v2")], np.array([5.0]))
        late = out.side["late"][0] if "late" in out.side else []
        joined = logic.process_input(0, [("a", 6.0, "x")], np.array([6.0])).items
        return late, joined

    assert run(restore=True) == run(restore=False) == (
        [("a", 5.0, "v2")], [("a", ("a", 6.0, "x"), ("a", 1.0, "v1"))])


def test_a_lookup_record_whose_time_is_not_a_number_is_a_dead_letter():
    logic = LookupJoin(KEY, KEY, "inner", EventTime()).build(StepContext("l", 0, 1))
    out = logic.process_input(0, [("a", 1.0, "x"), ("a", 2.0, "y")],
                              np.array([float("nan"), 2.0]))
    assert [(d.record, d.reason) for d in out.dead] == [
        (("a", 1.0, "x"), "event time nan is not a finite number")]
    logic.process_input(1, [("a", 0.0, "v")], np.array([0.0]))
    assert logic.on_end().items == [("a", ("a", 2.0, "y"), ("a", 0.0, "v"))]


def test_processing_time_lookup_join_takes_the_latest_value(backend):
    logic = LookupJoin(KEY, KEY, "left").build(ctx_for(backend))
    assert logic.process_input(1, [("a", 0, "a1"), ("b", 0, "b1"), ("a", 0, "a2")],
                               None).items == []
    out = logic.process_input(0, [("a", 5, "x"), ("c", 6, "y")], np.array([5.0, 6.0]))
    assert out.items == [("a", ("a", 5, "x"), ("a", 0, "a2")), ("c", ("c", 6, "y"), None)]
    assert out.event_times.tolist() == [5.0, 6.0]
    logic.process_input(1, [("a", 0, "a3")], None)
    assert logic.process_input(0, [("a", 7, "z")], None).items == [
        ("a", ("a", 7, "z"), ("a", 0, "a3"))]


def test_late_records_go_to_late():
    logic = LookupJoin(KEY, KEY, "inner", EventTime()).build(StepContext("l", 0, 1))
    logic.on_watermark(10.0)
    out = logic.process_input(0, [("a", 5.0, "x"), ("a", 12.0, "y")], np.array([5.0, 12.0]))
    assert out.side["late"][0] == [("a", 5.0, "x")]


def test_bad_arguments():
    with pytest.raises(ValueError, match="how"):
        LookupJoin(KEY, KEY, "outer")
    with pytest.raises(ValueError, match="ttl_s is required"):
        EnrichCached(str, KEY, None)
    with pytest.raises(ValueError, match="batch"):
        EnrichCached(str, KEY, 1.0, batch="yes")


# -- enrich_cached ---------------------------------------------------------------------------

def _enrich(batch, fail=()):
    calls = []

    def one(key):
        calls.append(key)
        if key in fail:
            raise KeyError(key)
        return key.upper()

    def many(keys):
        calls.append(list(keys))
        return [k.upper() for k in keys]

    logic = EnrichCached(many if batch else one, KEY, 10.0, batch).build(StepContext("e", 0, 1))
    clock = [0.0]
    logic.now = lambda: clock[0]
    return logic, calls, clock


@pytest.mark.parametrize("batch", [False, True])
def test_enrich_cached_looks_each_key_up_once_per_ttl(batch):
    logic, calls, clock = _enrich(batch)
    recs = [("a", 1), ("b", 2), ("a", 3)]
    out = logic.process(recs, np.array([1.0, 2.0, 3.0]))
    assert out.items == [("a", r, "A") if r[0] == "a" else ("b", r, "B") for r in recs]
    assert out.event_times.tolist() == [1.0, 2.0, 3.0]
    clock[0] = 5.0
    logic.process([("a", 4), ("c", 5)], None)
    assert calls == ([["a", "b"], ["c"]] if batch else ["a", "b", "c"])
    clock[0] = 10.5  # a and b were fetched at 0: stale; c (at 5) is still fresh
    assert logic.on_tick(0).expired == 2
    logic.process([("a", 6), ("c", 7)], None)
    assert calls[-1] == (["a"] if batch else "a") and len(calls) == (3 if batch else 4)


def test_enrich_cached_failures_are_dead_letters_per_key():
    logic, calls, clock = _enrich(False, fail={"b"})
    out = logic.process([("a", 1), ("b", 2), ("b", 3)], None)
    assert out.items == [("a", ("a", 1), "A")]
    assert [d.record for d in out.dead] == [("b", 2), ("b", 3)]
    assert "KeyError" in out.dead[0].reason
    logic.process([("b", 4)], None)
    assert calls.count("b") == 2  # a failure is not cached


def test_enrich_cached_batch_results_checked():
    logic = EnrichCached(lambda keys: ["x"], KEY, 1.0, True).build(StepContext("e", 0, 1))
    out = logic.process([("a", 1), ("b", 2)], None)
    assert out.items == [] and "returned 1 values for 2 keys" in out.dead[0].reason
    logic = EnrichCached(lambda keys: {"a": 1}, KEY, 1.0, True).build(StepContext("e", 0, 1))
    out = logic.process([("a", 1), ("b", 2)], None)
    assert out.items == [("a", ("a", 1), 1)] and "no value for key 'b'" in out.dead[0].reason
