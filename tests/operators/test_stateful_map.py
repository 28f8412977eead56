"""stateful_map logic without Ray, against plain Python, on every state backend."""

from collections import defaultdict

import numpy as np
import pytest

from rayflow.core.operators import Rescaled, StepContext, owns
from rayflow.operators.stateful import StatefulMap, StatefulMapBatches
from rayflow.state import backend_from_name


@pytest.fixture(params=["memory", "filesystem", "rocksdb"])
def ctx(request, tmp_path):
    if request.param == "rocksdb":
        pytest.importorskip("rocksdict")
    return StepContext("sm", 0, 1, "test", backend_from_name(request.param, str(tmp_path)))


def _session_total(total, rec):
    """Sum per key; a record of 0 ends the key's run (its state is dropped)."""
    if rec[1] == 0:
        return None, ("end", total or 0)
    total = (total or 0) + rec[1]
    return total, ("sum", total)


def test_stateful_map_matches_python_and_drops_keys(ctx):
    rng = np.random.default_rng(3)
    recs = [(f"k{int(k)}", int(v)) for k, v in zip(rng.integers(0, 9, 3000),
                                                   rng.integers(0, 6, 3000))]
    logic = StatefulMap(_session_total, key_fn=lambda r: r[0]).build(ctx)
    times = np.arange(len(recs), dtype=np.float64)
    out, out_t = [], []
    for lo in range(0, len(recs), 101):
        o = logic.process(recs[lo:lo + 101], times[lo:lo + 101])
        out += o.items
        out_t += o.event_times.tolist()
    state, want = defaultdict(lambda: None), []
    for k, v in recs:
        new, value = _session_total(state[k], (k, v))
        state[k] = new
        want.append((k, value))
    assert out == want and out_t == times.tolist()
    live = {k: v for k, v in state.items() if v is not None}
    assert dict(logic.state.items()) == live


def test_stateful_map_restores_rescales_and_names_bad_records(ctx):
    spec = StatefulMap(lambda n, r: ((n or 0) + 1, (n or 0) + 1), key_fn=str)
    a = spec.build(ctx)
    a.process(["x", "y", "x"], None)
    handle = a.snapshot()
    assert spec.build(ctx, handle).process(["x"], None).items == [("x", 3)]
    for i in range(2):
        c2 = StepContext("sm", i, 2, "test", ctx.state_backend)
        part = spec.build(c2, Rescaled((handle,), 1))
        assert {k for k, _ in part.state.items()} == {k for k in "xy" if owns(k, c2)}
    bad = StatefulMap(lambda n, r: r, key_fn=str).build(ctx)
    out = bad.process(["z"], None)
    assert out.items == [] and "must return (state, output)" in out.dead[0].reason


def _fails_on_four(total, rec):
    """_session_total, but a value of 4 is a bad record."""
    if rec[1] == 4:
        raise ValueError("four")
    return _session_total(total, rec)


def test_bad_records_leave_state_and_times_of_the_rest_as_python_has_them(ctx):
    """Dead letters mid-batch, keys dropped and made again within a batch: the outputs keep
    their own event times, and the state is plain Python's with the bad records left out."""
    recs = [("a", 1), ("a", 0), ("a", 2), ("b", 4), ("b", 3), ("a", 4), ("b", 0), ("c", 5),
            ("a", 1), ("c", 0)]
    times = np.arange(len(recs), dtype=np.float64) * 10.0
    logic = StatefulMap(_fails_on_four, key_fn=lambda r: r[0]).build(ctx)
    out = logic.process(recs[:6], times[:6])
    out2 = logic.process(recs[6:], times[6:])
    state, want, want_t = defaultdict(lambda: None), [], []
    for (k, v), t in zip(recs, times.tolist()):
        if v == 4:
            continue
        state[k], value = _session_total(state[k], (k, v))
        want.append((k, value))
        want_t.append(t)
    assert out.items + out2.items == want
    assert out.event_times.tolist() + out2.event_times.tolist() == want_t
    assert [d.reason for d in out.dead] == ["ValueError: four"] * 2
    assert dict(logic.state.items()) == {k: v for k, v in state.items() if v is not None}


# -- stateful_map_batches ---------------------------------------------------------------------

def _batch_total(total, recs):
    """_session_total over a key's records of a batch, in one call: emits each record's
    output; a value of 4 fails the call."""
    outputs = []
    for rec in recs:
        if rec[1] == 4:
            raise ValueError("four")
        total, value = _session_total(total, rec)
        outputs.append(value)
    return total, outputs


def test_stateful_map_batches_is_stateful_map_once_per_key_and_batch(ctx):
    """Without failures, the per-batch fold gives each key stateful_map's outputs (keys
    grouped, in the order of their first record), at the latest time of the key's records,
    and the same state."""
    rng = np.random.default_rng(5)
    recs = [(f"k{int(k)}", int(v)) for k, v in zip(rng.integers(0, 9, 3000),
                                                   rng.integers(0, 4, 3000))]
    times = rng.uniform(0, 100, len(recs))
    logic = StatefulMapBatches(_batch_total, key_fn=lambda r: r[0]).build(ctx)
    state: dict = defaultdict(lambda: None)
    for lo in range(0, len(recs), 101):
        part, t = recs[lo:lo + 101], times[lo:lo + 101]
        got = logic.process(part, t)
        want, want_t, groups = [], [], defaultdict(list)
        for rec, x in zip(part, t.tolist()):
            groups[rec[0]].append((rec, x))
        for key, members in groups.items():
            for rec, _ in members:
                state[key], value = _session_total(state[key], rec)
                want.append((key, value))
                want_t.append(max(x for _, x in members))
        assert got.items == want and got.event_times.tolist() == want_t and not got.dead
    assert dict(logic.state.items()) == {k: v for k, v in state.items() if v is not None}


def test_stateful_map_batches_sends_a_failing_key_s_records_to_dead_letters(ctx):
    """A failing call leaves its key's state as it was and sends the key's records of the
    batch to dead letters; a failing key function, that record only; a bad return value is
    named. The other keys go on."""
    logic = StatefulMapBatches(_batch_total, key_fn=lambda r: r[0]).build(ctx)
    logic.process([("a", 1), ("b", 2)], None)
    out = logic.process([("a", 3), ("b", 4), ("a", 1), ("b", 1), None, ("c", 2)], None)
    assert out.items == [("a", ("sum", 4)), ("a", ("sum", 5)), ("c", ("sum", 2))]
    assert [(d.reason, d.record) for d in out.dead] == [
        ("TypeError: 'NoneType' object is not subscriptable", None),
        ("ValueError: four", ("b", 4)), ("ValueError: four", ("b", 1))]
    assert dict(logic.state.items()) == {"a": 5, "b": 2, "c": 2}
    bad = StatefulMapBatches(lambda s, rs: rs, key_fn=str).build(ctx)
    out = bad.process(["z", "z"], None)
    assert out.items == [] and len(out.dead) == 2
    assert "must return (state, outputs)" in out.dead[0].reason
    none = StatefulMapBatches(lambda s, rs: (None, None), key_fn=str).build(ctx)
    assert none.process(["z"], None).items == [] and list(none.state.items()) == []
