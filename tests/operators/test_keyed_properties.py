"""Property tests of the keyed steps without Ray (``stateful_map``, ``stateful_map_batches``
and keyed process functions with event-time timers): Hypothesis draws the input as for the window
properties (several partitions out of order, batches of any length, records far behind
the watermark), the backend (RocksDB with a cache of a few entries among them) and the
moments of a restore or a rescale, and a plain-Python model says what each round must
emit."""

from __future__ import annotations

import math
import tempfile
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayflow.operators.process import KeyedProcessFunction, Process
from rayflow.operators.stateful import StatefulMap, StatefulMapBatches
from tests.operators._props import backend_for, run_rounds, streams

BACKENDS = ["memory", "filesystem", "rocksdb-0", "rocksdb-3"]
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def drive(spec, backend, batches, marks, restore_at, rescale_to, watermarks=True):
    """The step over the rounds (see :func:`run_rounds`; a watermark after each when
    ``watermarks``), each record with its time. Returns per round what it emitted, and
    the dead letters."""
    rounds = run_rounds(spec, backend, batches, marks if watermarks else None, restore_at,
                        rescale_to, with_times=True)
    return ([[item for out in outs for item in out.items] for outs in rounds],
            [d for outs in rounds for out in outs for d in out.dead])


# -- stateful_map -------------------------------------------------------------------------

def running(state, rec):
    """A key's record count and id sum; the key's state is dropped when the count reaches
    4 (so keys are dropped and made again). Emits (count, sum, id)."""
    n, total = state or (0, 0)
    n, total = n + 1, total + rec[2]
    return (None if n == 4 else (n, total)), (n, total, rec[2])


def _step(fn, state: dict, key, value):
    """``fn`` on ``key``'s state in the model: the new state kept (None drops the key);
    what ``fn`` emitted."""
    new, emitted = fn(state.get(key), value)
    if new is None:
        state.pop(key, None)
    else:
        state[key] = new
    return emitted


def model_stateful_map(batches):
    state: dict = {}
    out: dict = defaultdict(list)  # per key, in order
    for batch in batches:
        for rec in batch:
            out[rec[0]].append((rec[0], _step(running, state, rec[0], rec)))
    return out


@pytest.mark.parametrize("backend_name", BACKENDS)
@SETTINGS
@given(stream=streams(), cut=st.integers(-1, 60), rescale_to=st.sampled_from([1, 2, 3]))
def test_stateful_map_folds_each_key_in_order_through_restores_and_rescales(
        backend_name, stream, cut, rescale_to):
    batches, marks = stream
    spec = StatefulMap(running, key_fn=lambda r: r[0])
    with tempfile.TemporaryDirectory() as where:
        emitted, dead = drive(spec, backend_for(backend_name, where), batches, marks, cut,
                              rescale_to, watermarks=False)
    assert not dead
    got: dict = defaultdict(list)
    for rnd, batch in zip(emitted, batches):
        assert len(rnd) == len(batch)  # one output a record, in the round of its record
        for key, value in rnd:
            got[key].append((key, value))
    assert got == model_stateful_map(batches)


# -- stateful_map_batches ---------------------------------------------------------------

def running_batch(state, recs):
    """A key's record count and id sum over a batch's records of the key, dropped (state
    None) when the count reaches a multiple of 4; emits (count, sum, latest id) and, when
    the batch held three or more records, a second output."""
    n, total = state or (0, 0)
    n, total = n + len(recs), total + sum(r[2] for r in recs)
    outputs = [(n, total, recs[-1][2])] + ([("many", len(recs))] if len(recs) >= 3 else [])
    return (None if n % 4 == 0 else (n, total)), outputs


def model_stateful_map_batches(batches):
    """Per round: the outputs of each key (a key's records of the round, in order, in one
    call), each with the latest time of the key's records."""
    state: dict = {}
    rounds = []
    for batch in batches:
        groups: dict = defaultdict(list)
        for rec in batch:
            groups[rec[0]].append(rec)
        got = {}
        for key, recs in groups.items():
            outputs = _step(running_batch, state, key, recs)
            latest = max(r[1] for r in recs)
            got[key] = [((key, o), latest) for o in outputs]
        rounds.append(got)
    return rounds


@pytest.mark.parametrize("backend_name", BACKENDS)
@SETTINGS
@given(stream=streams(), cut=st.integers(-1, 60), rescale_to=st.sampled_from([1, 2, 3]))
def test_stateful_map_batches_folds_each_key_once_a_round_through_restores_and_rescales(
        backend_name, stream, cut, rescale_to):
    batches, marks = stream
    spec = StatefulMapBatches(running_batch, key_fn=lambda r: r[0])
    with tempfile.TemporaryDirectory() as where:
        rounds = run_rounds(spec, backend_for(backend_name, where), batches, None, cut,
                            rescale_to, with_times=True)
    assert not [d for outs in rounds for out in outs for d in out.dead]
    for outs, want in zip(rounds, model_stateful_map_batches(batches)):
        got: dict = defaultdict(list)
        for out in outs:
            # a key's outputs together, keys in the order of their first record
            keys = list(dict.fromkeys(item[0] for item in out.items))
            assert keys == [k for k in want if k in keys]
            for item, t in zip(out.items, out.event_times.tolist()):
                got[item[0]].append((item, t))
        assert dict(got) == want
    assert rounds[-1] == []  # nothing at the end of the input


# -- keyed process functions with event-time timers ----------------------------------------

class Timers(KeyedProcessFunction):
    """Per key: the ids seen since the key's state was last cleared. Every third record
    sets a timer 1 s after its time, every fifth deletes the timer at its own time plus
    0.5 s (one that an earlier record may have set). A timer emits ``(key, ts, ids)``; one
    at a whole second clears the key's ids, another sets a follow-up 0.25 s later while the
    key has an odd number of ids (a timer set from a timer, due in the same round when the
    watermark is past it already)."""

    def process_element(self, rec, ctx):
        ids = ctx.state.value(())
        ctx.state.update((*ids, rec[2]))
        if rec[2] % 3 == 0:
            ctx.timers.register(event_time=rec[1] + 1.0)
        if rec[2] % 5 == 0:
            ctx.timers.register(event_time=rec[1] + 0.5)
        if rec[2] % 5 == 1:
            ctx.timers.delete(event_time=rec[1] - 0.5)

    def on_timer(self, key, ts, ctx):
        ids = ctx.state.value(())
        if ts == int(ts):
            ctx.state.clear()
        elif len(ids) % 2 and ts < 30:
            ctx.timers.register(event_time=ts + 0.25)
        return [(key, ts, ids)]


def model_timers(batches, marks):
    """Per round: what the records' calls emit (nothing) and then what the watermark fires,
    every due timer in time order, those set meanwhile at or before it too."""
    state: dict = {}
    timers: set = set()  # (ts, key)
    wm, out = -math.inf, []

    def fire(until):
        got = []
        while True:
            due = sorted((t for t in timers if t[0] <= until), key=lambda t: (t[0], str(t[1])))
            if not due:
                return got
            ts, key = due[0]
            timers.discard((ts, key))
            ids = state.get(key, ())
            if ts == int(ts):
                state.pop(key, None)
            elif len(ids) % 2 and ts < 30:
                timers.add((ts + 0.25, key))
            got.append((key, ts, ids))

    for batch, mark in zip(batches, marks):
        for key, t, rid in batch:
            state[key] = (*state.get(key, ()), rid)
            if rid % 3 == 0:
                timers.add((t + 1.0, key))
            if rid % 5 == 0:
                timers.add((t + 0.5, key))
            if rid % 5 == 1:
                timers.discard((t - 0.5, key))
        got = []
        if mark > wm:
            wm = mark
            got = fire(wm)
        out.append(got)
    out.append(fire(math.inf))
    return out


def _per_key(rounds: list) -> list:
    """Each round's output as per-key sequences: keys fire in their own order (a restored
    or rescaled instance may interleave keys differently within a round)."""
    out = []
    for rnd in rounds:
        by_key: dict = defaultdict(list)
        for item in rnd:
            by_key[item[0]].append(item)
        out.append(dict(by_key))
    return out


@pytest.mark.parametrize("backend_name", BACKENDS)
@SETTINGS
@given(stream=streams(), cut=st.integers(-1, 60), rescale_to=st.sampled_from([1, 2, 3]))
def test_event_time_timers_fire_as_the_model_through_restores_and_rescales(
        backend_name, stream, cut, rescale_to):
    """Each watermark fires exactly the due timers, each key's in time order, with the
    values its records and earlier timers left; a restore or a rescale after any round
    changes nothing (timers and values move with their keys)."""
    batches, marks = stream
    spec = Process(Timers(), key_fn=lambda r: r[0])
    with tempfile.TemporaryDirectory() as where:
        emitted, dead = drive(spec, backend_for(backend_name, where), batches, marks, cut,
                              rescale_to)
    assert not dead
    assert _per_key(emitted) == _per_key(model_timers(batches, marks))
