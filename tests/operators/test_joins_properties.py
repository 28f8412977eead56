"""Property tests of the joins without Ray: Hypothesis draws two inputs (each from 1-3
partitions out of order by a drawn delay, event times on a coarse grid so that ties and
times on a bound are common, keys from a small set, some records older than those around
them, so that they come behind the watermark), the interleaving of their batches (after
each, each input's watermark and the step's, the minimum of both), the backend (RocksDB
with a cache of a few entries, so that it fills, empties and spills), checkpoints, a
failure after one of them (the rounds since it are replayed) and a rescale on the
restore. A plain-Python model of Flink's semantics says what each round must emit and
which records are late:

- the interval join: every pair of on-time records of a key with ``left.t + lower <=
  right.t <= left.t + upper``, in the round of the later of the two (a record is late when
  its time is below the step's watermark, the minimum of both inputs');
- the window join (tumbling, sliding, session; inner, left, outer): every window's pairs
  in the round whose watermark reaches its end (a record is late when all its windows have
  closed; a session join builds its sessions from the records of both sides);
- the event-time lookup join: each on-time record with its key's latest on-time table
  version at or before its time, in the round in which the table's own watermark (or the
  step's) passes that time."""

from __future__ import annotations

import math
import tempfile
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayflow.core.operators import Rescaled, StepContext, owns
from rayflow.operators.joins import IntervalJoin, WindowJoin
from rayflow.operators.lookup import LookupJoin
from rayflow.operators.windows import (
    EventTime,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
)
from tests.operators._props import GRID, backend_for, draw_partition

GAP = 1.0  # the session gap
LEFT, RIGHT = 0, 1
BACKENDS = ["memory", "filesystem", "rocksdb-0", "rocksdb-3"]
SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# (the windower, and the model's (length, slide, align) of its windows; None: sessions)
WINDOWS = {
    "tumbling": (lambda: TumblingWindow(2.0), (2.0, 2.0, 0.0)),
    "tumbling-aligned": (lambda: TumblingWindow(1.5, align_s=0.25), (1.5, 1.5, 0.25)),
    "sliding-sliced": (lambda: SlidingWindow(3.0, 1.0), (3.0, 1.0, 0.0)),
    "sliding-per-window": (lambda: SlidingWindow(2.5, 1.0), (2.5, 1.0, 0.0)),
    "session": (lambda: SessionWindow(GAP), None),
}


def _key(record):
    return record[0]


# -- the input ---------------------------------------------------------------------------------

def _older(t: float, arrival: float, m: int) -> tuple[float, float]:
    """One record in three is 3-6 s older than its place: behind the watermark."""
    return (t - (m - 6) * GRID * 4 if m > 8 else t), arrival


@st.composite
def two_inputs(draw):
    """Rounds ``(side, batch, (left watermark, right watermark))``: records ``(key, t, id)``
    (ids ``L..`` on the left, ``R..`` on the right) from 1-3 partitions per input, each in
    time order give or take its input's ``delay``, interleaved in batches of 1-9 records of
    one partition; a third of the records are 3-6 s older than the records around them.
    After each batch an input's watermark is the minimum over its partitions of the largest
    time each has shown, less the input's ``delay`` (an ended partition no longer holds it
    back)."""
    parts, delays, rid = [], [], 0
    for side in (LEFT, RIGHT):
        delay = draw(st.sampled_from([0.0, 0.5, 1.25]))
        delays.append(delay)
        for _ in range(draw(st.integers(1, 3))):
            part = draw_partition(draw, delay, "abc", 12, 40, _older)
            parts.append((side, [(key, t, f"{'LR'[side]}{rid + i}")
                                 for i, (key, t) in enumerate(part)]))
            rid += len(part)
    pos = [0] * len(parts)
    top = [-math.inf] * len(parts)
    rounds = []
    while any(p < len(part) for p, (_, part) in zip(pos, parts)):
        i = draw(st.sampled_from([j for j, (_, part) in enumerate(parts) if pos[j] < len(part)]))
        side, part = parts[i]
        batch = part[pos[i]:pos[i] + draw(st.integers(1, 9))]
        pos[i] += len(batch)
        top[i] = max(top[i], max(r[1] for r in batch))
        marks = tuple(
            min(math.inf if pos[j] == len(parts[j][1]) else top[j]
                for j in range(len(parts)) if parts[j][0] == s) - delays[s]
            for s in (LEFT, RIGHT))
        rounds.append((side, batch, marks))
    return rounds


# the checkpoints (see run_join): the one restored from, others, how many rounds the failed
# attempt runs past it, and how many instances go on from it
plans = st.tuples(st.integers(0, 40), st.sets(st.integers(0, 40), max_size=2),
                  st.integers(0, 3), st.sampled_from([1, 2, 3]))


# -- the models ----------------------------------------------------------------------------------

def _step_watermarks(rounds):
    """The step's watermark after each round: the minimum of both inputs' (never back)."""
    out, wm = [], -math.inf
    for _, _, marks in rounds:
        wm = max(wm, min(marks))
        out.append(wm)
    return out


def model_interval(rounds, lower, upper):
    """Per round (and at the end) the Counter of ``(key, left, right, event time)`` a
    round emits, and the late ids. A record is late when its time is below the step's
    watermark when it comes (Flink's ``timestamp < currentWatermark``); an on-time record
    pairs with every on-time record of the other side and its key that came before it and
    lies within the bounds, at once; the pair's time is the later of the two."""
    seen: list = []  # (side, record) of every on-time record so far
    emitted, late, wm = [], [], -math.inf
    for (side, batch, _), after in zip(rounds, _step_watermarks(rounds)):
        out: Counter = Counter()
        for rec in batch:
            if rec[1] < wm:
                late.append(rec[2])
                continue
            for other_side, other in seen:
                if other_side == side or other[0] != rec[0]:
                    continue
                left, right = (rec, other) if side == LEFT else (other, rec)
                if left[1] + lower <= right[1] <= left[1] + upper:
                    out[(rec[0], left, right, max(left[1], right[1]))] += 1
            seen.append((side, rec))
        wm = after
        emitted.append(out)
    emitted.append(Counter())  # the interval join has nothing left for the end
    return emitted, late


def _window_rows(key, lefts, rights, how, t) -> Counter:
    """What one window of a key emits: every left-right pair; with ``left`` or ``outer``
    each left record of a window without right ones alone, with ``outer`` each right
    record of a window without left ones alone."""
    out: Counter = Counter((key, a, b, t) for a in lefts for b in rights)
    if how in ("left", "outer") and not rights:
        out.update((key, a, None, t) for a in lefts)
    if how == "outer" and not lefts:
        out.update((key, None, b, t) for b in rights)
    return out


def _windows_of(t, length, slide, align):
    """The windows ``[start, start + length)`` with ``start = align + k * slide`` that
    hold ``t``."""
    k = math.floor((t - align) / slide)
    starts = [align + i * slide for i in range(k - int(length / slide) - 1, k + 2)]
    return [(s, s + length) for s in starts if s <= t < s + length]


def _last_instant(end):
    return float(np.nextafter(end, -math.inf))  # a window result's event time


def model_time_window_join(rounds, shape, how):
    """Tumbling or sliding: a record goes into each of its windows that has not closed
    (end > the watermark when it comes), and is late if none is open; a watermark fires
    every window that ends at or before it, with all the records either side put in it."""
    open_: dict = defaultdict(lambda: ([], []))  # (key, window) -> (lefts, rights)
    emitted, late, wm = [], [], -math.inf
    for (side, batch, _), after in zip(rounds, _step_watermarks(rounds)):
        for rec in batch:
            wins = [w for w in _windows_of(rec[1], *shape) if w[1] > wm]
            for w in wins:
                open_[(rec[0], w)][side].append(rec)
            if not wins:
                late.append(rec[2])
        wm = after
        out: Counter = Counter()
        for key, w in [kw for kw in open_ if kw[1][1] <= wm]:
            out += _window_rows(key, *open_.pop((key, w)), how, _last_instant(w[1]))
        emitted.append(out)
    end: Counter = Counter()
    for (key, w), (lefts, rights) in open_.items():
        end += _window_rows(key, lefts, rights, how, _last_instant(w[1]))
    emitted.append(end)
    return emitted, late


def model_session_join(rounds, how):
    """Sessions of both sides' records together: a record's window ``[t, t + gap)`` merges
    with its key's open sessions that it touches or overlaps; it is late when even merged
    its session ends at or before the watermark. A watermark fires every session that ends
    at or before it."""
    sessions: dict = defaultdict(list)  # key -> [[start, end, lefts, rights], ...]
    emitted, late, wm = [], [], -math.inf
    for (side, batch, _), after in zip(rounds, _step_watermarks(rounds)):
        for rec in batch:
            key, t = rec[0], rec[1]
            new = [t, t + GAP, [], []]
            new[2 + side].append(rec)
            touched = [s for s in sessions[key] if s[0] <= new[1] and s[1] >= new[0]]
            for s in touched:
                new = [min(new[0], s[0]), max(new[1], s[1]), new[2] + s[2], new[3] + s[3]]
            if new[1] <= wm:
                late.append(rec[2])
                continue
            sessions[key] = [s for s in sessions[key] if s not in touched] + [new]
        wm = after
        out: Counter = Counter()
        for key, ss in sessions.items():
            for s in [s for s in ss if s[1] <= wm]:
                out += _window_rows(key, s[2], s[3], how, _last_instant(s[1]))
            ss[:] = [s for s in ss if s[1] > wm]
        emitted.append(out)
    end: Counter = Counter()
    for key, ss in sessions.items():
        for s in ss:
            end += _window_rows(key, s[2], s[3], how, _last_instant(s[1]))
    emitted.append(end)
    return emitted, late


def model_lookup(rounds, how):
    """Event-time lookup join, the left input the stream, the right one the table. A stream
    record is late below the step's watermark; a table record below the step's or the
    table's own watermark. An on-time stream record is emitted, with its key's latest
    on-time table record at or before its time (of equal times the last to come), as soon
    as the table's watermark (or the step's) is above its time: at once if it already is,
    else in the round whose watermark passes it, else at the end."""
    table: dict = defaultdict(list)  # key -> on-time table records, as they came
    waiting: list = []
    emitted, late = [], []
    wm = table_wm = -math.inf

    def joined(rec):
        value = None
        for v in table[rec[0]]:
            if v[1] <= rec[1] and (value is None or v[1] >= value[1]):
                value = v
        return Counter() if value is None and how == "inner" else Counter(
            [(rec[0], rec, value, rec[1])])

    for side, batch, marks in rounds:
        out: Counter = Counter()
        for rec in batch:
            if side == LEFT and rec[1] < wm or side == RIGHT and rec[1] < max(wm, table_wm):
                late.append(rec[2])
            elif side == RIGHT:
                table[rec[0]].append(rec)
            elif rec[1] < table_wm:
                out += joined(rec)
            else:
                waiting.append(rec)
        table_wm = max(table_wm, marks[RIGHT])
        wm = max(wm, min(marks))
        for rec in [r for r in waiting if r[1] < max(wm, table_wm)]:
            out += joined(rec)
            waiting.remove(rec)
        emitted.append(out)
    emitted.append(sum((joined(rec) for rec in waiting), Counter()))
    return emitted, late


# -- running the logic -------------------------------------------------------------------------

def _take(out, got: Counter, late: list) -> None:
    """Add an output's records, with their event times, to ``got``; its late ids to
    ``late``."""
    if out is None:
        return
    assert not out.dead, out.dead
    assert set(out.side) <= {"late"}
    if out.items:
        assert out.event_times is not None and len(out.event_times) == len(out.items)
        got.update((*item, t) for item, t in zip(out.items, out.event_times.tolist()))
    late += [rec[2] for rec in out.side.get("late", ([], None))[0]]


def run_join(spec, backend, rounds, plan, kept=()):
    """The step over the rounds, as the runtime drives it: each batch to the instance that
    owns its records' keys, then each input's watermark where it advanced
    (``on_input_watermark``), then the step's (the minimum of both) to every instance.
    ``plan``: checkpoints after round ``cut`` and the rounds in ``more`` (each modulo one
    more than the number of rounds, less one: -1, none, now and then); the attempt fails
    ``replay`` rounds after ``cut`` and the job goes on from that checkpoint in ``rescale_to``
    instances, the rounds since replayed (the sources first say where the inputs'
    watermarks were, as restored sources do). Returns (per round and at the end the Counter
    of emitted ``(key, left, right, event time)``, the late ids), of the rounds' last runs,
    and the state keys ``(prefix, ...)`` with a prefix in ``kept`` left at the end. Closes
    the instances (RocksDB's, still open when their directory goes, take a second each)."""
    cut, more, replay, rescale_to = plan
    cut = cut % (len(rounds) + 1) - 1
    snaps = {r % (len(rounds) + 1) - 1 for r in more} | {cut}
    fail_at = min(cut + replay, len(rounds) - 1)

    def ctx(i=0, n=1):
        return StepContext("join", i, n, "prop", backend)

    logics = [spec.build(ctx())]
    try:
        return _run(spec, rounds, logics, ctx, cut, snaps, fail_at, rescale_to, kept)
    finally:
        for logic in logics:
            logic.close()


def _run(spec, rounds, logics, ctx, cut, snaps, fail_at, rescale_to, kept):
    """:func:`run_join`'s rounds, on ``logics`` (changed in place on the restore)."""
    emitted: list = [Counter() for _ in rounds]
    lates: list = [[] for _ in rounds]
    given = [-math.inf, -math.inf]
    handles: dict = {}
    restored, r = False, 0
    while r < len(rounds):
        side, batch, marks = rounds[r]
        got, late = Counter(), []
        for logic in logics:
            mine = [rec for rec in batch if owns(rec[0], logic.ctx)]
            if mine:
                _take(logic.process_input(side, mine, np.array([rec[1] for rec in mine])),
                      got, late)
        for i in (LEFT, RIGHT):
            if marks[i] > given[i]:
                given[i] = marks[i]
                for logic in logics:
                    _take(logic.on_input_watermark(i, marks[i]), got, late)
        if min(marks) > -math.inf:
            for logic in logics:
                _take(logic.on_watermark(min(marks)), got, late)
        emitted[r], lates[r] = got, late
        if r in snaps:
            handles[r] = tuple(logic.snapshot() for logic in logics)
        if r == fail_at and cut >= 0 and not restored:
            restored = True
            failed, logics[:] = list(logics), []
            for logic in failed:
                logic.close()
            old = handles[cut]
            resume = old[0] if len(old) == rescale_to == 1 else Rescaled(old, len(old))
            for i in range(rescale_to):
                logics.append(spec.build(ctx(i, rescale_to), resume))
            marks = rounds[cut][2]
            given = [-math.inf, -math.inf]
            for i in (LEFT, RIGHT):  # (nothing new: it was all emitted before the checkpoint)
                if marks[i] > given[i]:
                    given[i] = marks[i]
                    for logic in logics:
                        _take(logic.on_input_watermark(i, marks[i]), emitted[cut], lates[cut])
            if min(marks) > -math.inf:
                for logic in logics:
                    _take(logic.on_watermark(min(marks)), emitted[cut], lates[cut])
            r = cut + 1
            continue
        r += 1
    end, late = Counter(), []
    for logic in logics:
        _take(logic.on_end(), end, late)
    assert late == []
    emitted.append(end)
    left_over = [k for logic in logics for k, _ in logic.state.items()
                 if isinstance(k, tuple) and k[0] in kept]
    return emitted, [i for ids in lates for i in ids], left_over


def _check(got, want):
    """Round by round, then the late ids: the first round that differs is named."""
    emitted, late = got
    want_emitted, want_late = want
    assert len(emitted) == len(want_emitted)
    for r, (g, w) in enumerate(zip(emitted, want_emitted)):
        assert g == w, (f"round {r}: emitted and not in the model {g - w}, "
                        f"in the model and not emitted {w - g}")
    assert sorted(late) == sorted(want_late)


# -- the properties ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend_name", BACKENDS)
@SETTINGS
@given(rounds=two_inputs(), plan=plans,
       bounds=st.tuples(st.integers(-8, 4), st.integers(0, 8)))
def test_interval_join_emits_what_the_model_emits_through_restores_and_rescales(
        backend_name, rounds, plan, bounds):
    """Each round emits exactly the model's pairs (with the later time of the two), late
    records go aside exactly as the model says, a failure after any round (restored, the
    rounds since replayed, on as many instances as drawn) changes nothing, and once the
    watermark has passed everything no record is kept."""
    lower, upper = bounds[0] * GRID, (bounds[0] + bounds[1]) * GRID
    spec = IntervalJoin(lower, upper, _key, _key, EventTime())
    with tempfile.TemporaryDirectory() as where:
        *got, left_over = run_join(spec, backend_for(backend_name, where), rounds, plan, ("__i",))
    _check(got, model_interval(rounds, lower, upper))
    assert left_over == []


@pytest.mark.parametrize("window", sorted(WINDOWS))
@pytest.mark.parametrize("backend_name", BACKENDS)
@SETTINGS
@given(rounds=two_inputs(), plan=plans, how=st.sampled_from(["inner", "left", "outer"]))
def test_window_join_emits_what_the_model_emits_through_restores_and_rescales(
        window, backend_name, rounds, plan, how):
    """Each round emits exactly the pairs (and with ``left``/``outer`` the unmatched
    records) of the windows the model fires in it, stamped with the window's last instant;
    late records go aside exactly as the model says; a failure after any round changes
    nothing."""
    make, shape = WINDOWS[window]
    spec = WindowJoin(make(), how, _key, _key, EventTime())
    with tempfile.TemporaryDirectory() as where:
        *got, left_over = run_join(spec, backend_for(backend_name, where), rounds, plan,
                                   ("__w", "__s"))
    _check(got, model_session_join(rounds, how) if shape is None
           else model_time_window_join(rounds, shape, how))
    assert left_over == []


@pytest.mark.parametrize("backend_name", BACKENDS)
@SETTINGS
@given(rounds=two_inputs(), plan=plans, how=st.sampled_from(["inner", "left"]))
def test_event_time_lookup_join_emits_what_the_model_emits_through_restores_and_rescales(
        backend_name, rounds, plan, how):
    """The left input as the stream, the right one as the table: each round emits exactly
    the records the model releases in it, each with its key's value as of its time; late
    records of both inputs go aside as the model says; a failure after any round changes
    nothing; nothing waits at the end."""
    spec = LookupJoin(_key, _key, how, EventTime())
    with tempfile.TemporaryDirectory() as where:
        *got, left_over = run_join(spec, backend_for(backend_name, where), rounds, plan, ("__l",))
    _check(got, model_lookup(rounds, how))
    assert left_over == []


def test_the_inputs_reach_late_records_ties_and_pairs_on_a_bound():
    """The strategy reaches what the properties are about: late records on both sides,
    interval pairs exactly on a bound, a lookup of a version at the record's very time."""
    from hypothesis import Phase, find

    def interesting(rounds):
        emitted, late = model_interval(rounds, -0.5, 0.5)
        on_bound = any(abs(row[1][1] - row[2][1]) == 0.5 for out in emitted for row in out)
        lookups, _ = model_lookup(rounds, "inner")
        same_time = any(row[1][1] == row[2][1] for out in lookups for row in out)
        sides = {i[0] for i in late}
        return on_bound and same_time and sides == {"L", "R"}

    find(two_inputs(), interesting,
         settings=settings(max_examples=1000, database=None, phases=[Phase.generate],
                           derandomize=True))
