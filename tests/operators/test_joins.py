"""Join logic without Ray, against plain-Python ground truth, on every state backend."""

import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from rayflow.core.operators import Rescaled, StepContext
from rayflow.operators.joins import IntervalJoin, WindowJoin
from rayflow.operators.windows import EventTime, SessionWindow, SlidingWindow, TumblingWindow
from rayflow.state import backend_from_name


@pytest.fixture(params=["memory", "filesystem", "rocksdb"])
def ctx(request, tmp_path):
    if request.param == "rocksdb":
        pytest.importorskip("rocksdict")
    return StepContext("join", 0, 1, "test", backend_from_name(request.param, str(tmp_path)))


def _side(seed, n, name):
    rng = np.random.default_rng(seed)
    return [(f"k{int(k)}", round(float(t), 3), f"{name}{i}")
            for i, (k, t) in enumerate(zip(rng.integers(0, 6, n), rng.uniform(0, 100, n)))]


def _drive(logic, left, right, delay=2.0, step=37):
    """Feed both sides in batches, roughly in time order but out of order by up to
    ``delay``, with a watermark of ``max seen - delay`` after each round."""
    rng = np.random.default_rng(0)

    def jittered(recs):
        return sorted(recs, key=lambda r: r[1] + rng.uniform(0, delay))

    left, right = jittered(left), jittered(right)
    out, late, top = [], [], [-math.inf, -math.inf]
    for lo in range(0, max(len(left), len(right)), step):
        for index, recs in ((0, left), (1, right)):
            part = recs[lo:lo + step]
            if not part:
                continue
            o = logic.process_input(index, part, None)
            out += o.items
            late += o.side.get("late", ([], None))[0]
            top[index] = max(r[1] for r in part) if lo + step < len(recs) else math.inf
        got = logic.on_watermark(min(top) - delay)  # the minimum over the two inputs
        out += got.items if got else []
    end = logic.on_end()
    out += end.items if end else []
    return out, late


def _window_reference(left, right, windows_of, how):
    lw, rw = defaultdict(list), defaultdict(list)
    for k, t, v in left:
        for w in windows_of(t):
            lw[(k, w)].append((k, t, v))
    for k, t, v in right:
        for w in windows_of(t):
            rw[(k, w)].append((k, t, v))
    out = Counter()
    for kw in set(lw) | set(rw):
        ls, rs = lw.get(kw, []), rw.get(kw, [])
        if rs:
            out.update((kw[0], a, b) for a in ls for b in rs)
        elif how != "inner":
            out.update((kw[0], a, None) for a in ls)
        if how == "outer" and not ls:
            out.update((kw[0], None, b) for b in rs)
    return out


def _key(r):
    return r[0]


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
@pytest.mark.parametrize("window", [TumblingWindow(10.0), SlidingWindow(10.0, 5.0)],
                         ids=["tumbling", "sliding"])
def test_window_join_matches_python(ctx, how, window):
    left, right = _side(1, 400, "L"), _side(2, 300, "R")
    logic = WindowJoin(window, how, _key, _key, EventTime(timestamp=lambda r: r[1])).build(ctx)
    out, late = _drive(logic, left, right)
    assert late == []
    assert Counter(out) == _window_reference(left, right, window.windows_of, how)


def _session_reference(left, right, gap, how):
    by_key = defaultdict(list)
    for side, recs in ((0, left), (1, right)):
        for r in recs:
            by_key[r[0]].append((r[1], side, r))
    out = Counter()
    for k, evs in by_key.items():
        evs.sort(key=lambda e: e[0])
        groups, cur = [], [evs[0]]
        for e in evs[1:]:
            if e[0] - cur[-1][0] > gap:
                groups.append(cur)
                cur = []
            cur.append(e)
        groups.append(cur)
        for g in groups:
            ls = [r for _, s, r in g if s == 0]
            rs = [r for _, s, r in g if s == 1]
            if rs:
                out.update((k, a, b) for a in ls for b in rs)
            elif how != "inner":
                out.update((k, a, None) for a in ls)
            if how == "outer" and not ls:
                out.update((k, None, b) for b in rs)
    return out


@pytest.mark.parametrize("how", ["inner", "outer"])
def test_session_window_join_matches_python(ctx, how):
    left, right = _side(3, 150, "L"), _side(4, 150, "R")
    logic = WindowJoin(SessionWindow(1.5), how, _key, _key,
                       EventTime(timestamp=lambda r: r[1])).build(ctx)
    out, late = _drive(logic, left, right)
    assert late == []
    assert Counter(out) == _session_reference(left, right, 1.5, how)
    assert len(logic.inner.state) == 0  # every session closed, its state deleted


def test_window_join_state_is_restored_and_rescaled(ctx):
    spec = WindowJoin(TumblingWindow(10.0), "inner", _key, _key,
                      EventTime(timestamp=lambda r: r[1]))
    a = spec.build(ctx)
    a.process_input(0, [("x", 1.0, "l1"), ("y", 2.0, "l2")], None)
    handle = a.snapshot()
    b = spec.build(ctx, handle)
    b.process_input(1, [("x", 3.0, "r1"), ("y", 4.0, "r2")], None)
    assert sorted(b.on_watermark(10.0).items) == [
        ("x", ("x", 1.0, "l1"), ("x", 3.0, "r1")), ("y", ("y", 2.0, "l2"), ("y", 4.0, "r2"))]
    # rescaled to two instances: each takes the keys it owns
    from rayflow.core.operators import owns

    got = []
    for i in range(2):
        c2 = StepContext("join", i, 2, "test", ctx.state_backend)
        part = spec.build(c2, Rescaled((handle,), 1))
        # a window's state: ("__w", key, window), or a partial ("__p", window, key, seq)
        kept = {k[1] if k[0] == "__w" else k[2] for k, _ in part.inner.state.items()
                if k[0] in ("__w", "__p")}
        assert kept == {k for k in ("x", "y") if owns(k, c2)}
        part.process_input(1, [("x", 3.0, "r1"), ("y", 4.0, "r2")], None)
        got += part.on_end().items
    assert sorted(got) == [("x", ("x", 1.0, "l1"), ("x", 3.0, "r1")),
                           ("y", ("y", 2.0, "l2"), ("y", 4.0, "r2"))]


def _interval_reference(left, right, lo, hi):
    return Counter((a[0], a, b) for a in left for b in right
                   if a[0] == b[0] and a[1] + lo <= b[1] <= a[1] + hi)


@pytest.mark.parametrize("bounds", [(-1.0, 2.0), (0.0, 0.5), (1.0, 3.0)])
def test_interval_join_matches_python_and_drops_what_cannot_match(ctx, bounds):
    lo, hi = bounds
    left, right = _side(5, 500, "L"), _side(6, 500, "R")
    logic = IntervalJoin(lo, hi, _key, _key, EventTime(timestamp=lambda r: r[1])).build(ctx)
    out, late = _drive(logic, left, right)
    assert late == []
    assert Counter(out) == _interval_reference(left, right, lo, hi)
    logic.on_watermark(1000.0)
    assert len(logic.state) == 0  # the watermark dropped every kept record


def test_a_join_record_whose_time_is_not_a_number_is_a_dead_letter(ctx):
    """Kept for ever otherwise: no watermark passes NaN (the window join's inner window
    step does the same, its records given back without their side tag)."""
    nan = float("nan")
    ij = IntervalJoin(0.0, 5.0, _key, _key, EventTime(timestamp=lambda r: r[1])).build(ctx)
    out = ij.process_input(0, [("k", nan, "l"), ("k", 1.0, "m")], None)
    assert [(d.record[2], d.reason) for d in out.dead] == [
        ("l", "event time nan is not a finite number")]
    assert ij.process_input(1, [("k", 2.0, "r")], None).items == [
        ("k", ("k", 1.0, "m"), ("k", 2.0, "r"))]
    wj = WindowJoin(TumblingWindow(10.0), "inner", _key, _key,
                    EventTime(timestamp=lambda r: r[1])).build(ctx)
    out = wj.process_input(1, [("k", float("-inf"), "r")], None)
    assert [(d.record, d.reason) for d in out.dead] == [
        (("k", float("-inf"), "r"), "event time -inf is not a finite number")]


def test_interval_join_late_records_and_restore(ctx):
    spec = IntervalJoin(0.0, 5.0, _key, _key, EventTime(timestamp=lambda r: r[1]))
    a = spec.build(ctx)
    a.process_input(0, [("k", 10.0, "l")], None)
    a.on_watermark(12.0)
    b = spec.build(ctx, a.snapshot())
    o = b.process_input(1, [("k", 11.0, "late"), ("k", 14.0, "r")], None)
    assert o.side["late"][0] == [("k", 11.0, "late")]
    assert o.items == [("k", ("k", 10.0, "l"), ("k", 14.0, "r"))]
    assert o.event_times.tolist() == [14.0]
    with pytest.raises(ValueError, match="lower_s \\(2\\) is above upper_s \\(1\\)"):
        IntervalJoin(2, 1, _key, _key)
    with pytest.raises(ValueError, match="how must be 'inner', 'left' or 'outer'"):
        WindowJoin(TumblingWindow(1.0), "full", _key, _key)
