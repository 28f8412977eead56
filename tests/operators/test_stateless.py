"""Operator logic without Ray: exact outputs, event-time propagation, dead letters."""

import numpy as np

from rayflow.core.operators import StepContext, apply_each
from rayflow.operators.stateless import BRANCH_REST, Branch, Filter, FlatMap, Map, MapBatches

CTX = StepContext("s", 2, 4)


def test_apply_each_calls_fn_once_per_record_and_reports_failures():
    calls = []

    def fn(x):
        calls.append(x)
        return 10 // x

    failures = []
    out, failed = apply_each(fn, [1, 0, 2, 0, 5], lambda r, e: failures.append(r))
    assert out == [10, 5, 2]
    assert failed == [1, 3]
    assert calls == [1, 0, 2, 0, 5]
    assert failures == [0, 0]
    calls.clear()
    out, failed = apply_each(fn, [0, 0, 4, 0], lambda r, e: None)  # first, twice, and last
    assert (out, failed, calls) == ([2], [0, 1, 3], [0, 0, 4, 0])


def test_map_keeps_event_times_of_surviving_records():
    out = Map(lambda x: 10 // x).build(CTX).process([1, 0, 5], np.array([1.0, 2.0, 3.0]))
    assert out.items == [10, 2]
    assert out.event_times.tolist() == [1.0, 3.0]
    assert len(out.dead) == 1
    d = out.dead[0]
    assert (d.step_id, d.instance, d.record) == ("s", 2, 0)
    assert "ZeroDivisionError" in d.reason


def test_filter_and_flat_map_match_python():
    data = ["a b c", "", "d e", "f"]
    f = Filter(lambda s: len(s) > 1).build(CTX).process(data, np.arange(4.0))
    assert f.items == [s for s in data if len(s) > 1]
    assert f.event_times.tolist() == [0.0, 2.0]
    fm = FlatMap(str.split).build(CTX).process(data, np.arange(4.0))
    assert fm.items == [w for s in data for w in s.split()]
    assert fm.event_times.tolist() == [0, 0, 0, 2, 2, 3]


def test_filter_and_branch_take_any_answer_by_its_truth_value_and_keep_times_aligned():
    """A predicate may answer with any value (Python's truth value decides), and a record
    whose predicate raises is a dead letter: the records and their times stay paired."""
    data = [3, 0, 4, None, 6, 7, "", 9]
    answers = {3: "x", 0: [], 4: 1, 6: 0.0, 7: [0], "": None, 9: float("nan")}
    times = np.arange(len(data)) * 10.0
    kept = [i for i, r in enumerate(data) if r is not None and answers[r]]
    f = Filter(answers.__getitem__).build(CTX).process(data, times)
    assert f.items == [data[i] for i in kept]
    assert f.event_times.tolist() == [times[i] for i in kept]
    assert [d.record for d in f.dead] == [None]
    b = Branch(answers.__getitem__).build(CTX).process(data, times)
    rest = [i for i, r in enumerate(data) if r is not None and not answers[r]]
    assert (b.items, b.event_times.tolist()) == (f.items, f.event_times.tolist())
    items, rest_times = b.side[BRANCH_REST]
    assert items == [data[i] for i in rest]
    assert rest_times.tolist() == [times[i] for i in rest]


def test_map_batches_numpy_and_failure_is_one_dead_letter():
    logic = MapBatches(lambda b: b * 2).build(CTX)
    out = logic.process(np.arange(5), None)
    assert out.items.tolist() == [0, 2, 4, 6, 8]
    bad = MapBatches(lambda b: b.nope).build(CTX).process(np.arange(3), None)
    assert len(bad.items) == 0 and len(bad.dead) == 1 and bad.dead[0].where == "batch"
