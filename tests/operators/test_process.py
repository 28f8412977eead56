"""Keyed process functions and their timers without Ray, against plain Python, on every state
backend, through a restore and a rescale."""

import math
from collections import Counter

import numpy as np
import pytest

from rayflow.core.operators import StepContext
from rayflow.operators.process import KeyedProcessFunction, Process, TimerQueue
from tests.operators._drive import (
    collect,
    ctx_for,
    partitions,
    rescaled_run,
    rounds,
    run_logic,
    sessions_reference,
)

GAP = 3.0


class CountWithTimeout(KeyedProcessFunction):
    """Count a key's records per session (a gap of more than GAP seconds of event time ends
    one), emitted when the watermark passes the session's end. Records may arrive out of
    order and early, so each waits in the state for the timer at its own time, and the
    timers replay them in time order: the output does not depend on arrival order."""

    def process_element(self, rec, ctx):
        buffered, cnt, last = ctx.state.value(((), 0, -math.inf))
        ctx.state.update((buffered + (ctx.timestamp,), cnt, last))
        ctx.timers.register(event_time=ctx.timestamp)

    def on_timer(self, key, ts, ctx):
        assert ctx.time_domain == "event_time" and ctx.key == key and ctx.timestamp == ts
        buffered, cnt, last = ctx.state.value()
        due = sorted(t for t in buffered if t <= ts)
        for t in due:
            if cnt and t - last > GAP:
                yield (key, cnt, last)
                cnt = 0
            if cnt:
                ctx.timers.delete(event_time=last + GAP)  # the session goes on
            cnt, last = cnt + 1, t
        if due:
            ctx.timers.register(event_time=last + GAP)
        if cnt and not due and ts == last + GAP:
            yield (key, cnt, last)
            cnt = 0
        rest = tuple(t for t in buffered if t > ts)
        if rest or cnt:
            ctx.state.update((rest, cnt, last))
        else:
            ctx.state.clear()


def _records(seed=1, n=1500, keys=6, span=1500.0):
    rng = np.random.default_rng(seed)
    ts = rng.uniform(0, span, n)
    return [(f"k{int(k)}", float(t), i) for i, (k, t) in enumerate(zip(rng.integers(0, keys, n),
                                                                          ts))]





def test_timer_queue_orders_dedups_and_deletes():
    q = TimerQueue()
    for key, ts in [("b", 3.0), ("a", 3.0), ("c", 1.0), ("a", 3.0), ("d", 2.0)]:
        q.register(key, ts)
    assert len(q) == 4
    assert q.delete("d", 2.0) and not q.delete("d", 2.0)
    assert q.peek() == 1.0
    got = []
    for ts, key in q.pop_until(3.0):
        got.append((ts, key))
        if key == "c":
            q.register("e", 2.5)  # registered while firing, still due: fires in this pass
            q.register("f", 9.0)
    assert got == [(1.0, "c"), (2.5, "e"), (3.0, "a"), (3.0, "b")]
    assert len(q) == 1 and q.peek() == 9.0
    q.delete("f", 9.0)
    q.register("f", 9.0)  # re-registered after a delete: fires once
    assert list(q.pop_until(math.inf)) == [(9.0, "f")] and q.peek() == math.inf


def test_event_time_timers_match_python(backend):
    recs = _records()
    got = run_logic(Process(CountWithTimeout(), lambda r: r[0]).build(ctx_for(backend)),
                    rounds(partitions(recs, 3, delay=2.0), delay=2.0))
    assert Counter(got) == sessions_reference(recs, GAP)


def test_timers_fire_after_a_restore(backend):
    recs = _records(2)
    feed = list(rounds(partitions(recs, 3, delay=2.0), delay=2.0))
    spec = Process(CountWithTimeout(), lambda r: r[0])
    first = spec.build(ctx_for(backend))
    got = []
    for batch, times, wm in feed[:len(feed) // 2]:
        collect(first.process(batch, times), got)
        if wm > -math.inf:
            collect(first.on_watermark(wm), got)
    handle = first.snapshot()
    assert len(first.queues["event_time"]) > 0  # timers pending at the snapshot
    first.close()
    got += run_logic(spec.build(ctx_for(backend), handle), feed[len(feed) // 2:])
    assert Counter(got) == sessions_reference(recs, GAP)


def test_rescale_moves_values_and_timers_to_their_owners(backend):
    recs = _records(3)
    feed = list(rounds(partitions(recs, 3, delay=2.0), delay=2.0))
    got = rescaled_run(Process(CountWithTimeout(), lambda r: r[0]), backend,
                       feed[:len(feed) // 3], feed[len(feed) // 3:], lambda r, n: r[0])
    assert Counter(got) == sessions_reference(recs, GAP)


def test_processing_time_timers_fire_on_the_clock():
    clock = [100.0]

    def element(rec, ctx):
        ctx.state.update(rec)
        ctx.timers.register(processing_time=ctx.timers.current_processing_time() + 5)

    def on_timer(key, ts, ctx):
        assert ctx.time_domain == "processing_time"
        yield (key, ts, ctx.state.value())

    logic = Process((element, on_timer), str).build(StepContext("p", 0, 1))
    logic.now = lambda: clock[0]
    assert logic.process(["a", "b"], None).items == []
    clock[0] = 103.0
    logic.process(["a"], None)  # another timer of a, at 108
    assert logic.on_tick(0) is None
    clock[0] = 105.0
    out = logic.on_tick(0)
    assert out.items == [("a", 105.0, "a"), ("b", 105.0, "b")]
    assert out.event_times.tolist() == [105.0, 105.0]  # the time each timer was due at
    clock[0] = 200.0
    # a busy stream gets no ticks: due timers fire after a batch too, after its records
    out = logic.process(["c"], np.array([7.0]))
    assert out.items == [("a", 108.0, "a")] and out.event_times.tolist() == [108.0]
    clock[0] = 300.0
    assert logic.on_end().items == []  # processing-time timers never fire at end of stream
    assert len(logic.queues["processing_time"]) == 1  # c's, kept for a resume


def test_function_forms_and_errors():
    def only(rec, ctx):
        return [rec * 2]

    logic = Process(only, lambda r: r).build(StepContext("p", 0, 1))
    assert logic.process([1, 2], None).items == [2, 4]

    def registers(rec, ctx):
        ctx.timers.register(event_time=1.0)

    dead = Process(registers, lambda r: r).build(StepContext("p", 0, 1)).process([1], None).dead
    assert len(dead) == 1 and "no on_timer" in dead[0].reason

    def both(rec, ctx):
        ctx.timers.register(event_time=1.0, processing_time=2.0)

    dead = Process((both, lambda *a: None), lambda r: r).build(
        StepContext("p", 0, 1)).process([1], None).dead
    assert "exactly one of" in dead[0].reason
    for bad in (float("nan"), "soon", None):
        def at(rec, ctx, bad=bad):
            ctx.timers.register(event_time=bad) if bad is not None else \
                ctx.timers.register(processing_time=math.nan)

        dead = Process((at, lambda *a: None), lambda r: r).build(
            StepContext("p", 0, 1)).process([1], None).dead
        assert "must be a number of seconds" in dead[0].reason, bad
    with pytest.raises(ValueError, match="process_element"):
        Process(42, lambda r: r)
    with pytest.raises(ValueError, match="two callables"):
        Process((only,), lambda r: r)
    with pytest.raises(ValueError, match="ttl_s"):
        Process(only, lambda r: r, ttl_s=0)


def test_value_state_is_per_key_and_cleared_state_is_deleted(backend):
    def element(rec, ctx):
        seen = ctx.state.value(0) + 1
        if seen == 3:
            ctx.state.clear()
        else:
            ctx.state.update(seen)
        yield (ctx.key, seen)

    logic = Process(element, lambda r: r).build(ctx_for(backend))
    assert logic.process(list("aabab"), None).items == [
        ("a", 1), ("a", 2), ("b", 1), ("a", 3), ("b", 2)]
    assert dict(logic.state.items()) == {("__v", "b"): 2}
    assert logic.process(list("a"), None).items == [("a", 1)]


def test_the_context_is_the_current_records_during_each_call(backend):
    """As Flink's, the context is valid for its call: an instance sets one context to each
    record's key and time (and each timer's), and its state follows that key."""
    seen = []

    def element(rec, ctx):
        seen.append((ctx.key, ctx.timestamp, ctx.time_domain, ctx.state.value()))
        ctx.state.update(rec[1])
        ctx.timers.register(event_time=rec[1] + 1.0)

    def on_timer(key, ts, ctx):
        seen.append((ctx.key, ctx.timestamp, ctx.time_domain, ctx.state.value()))
        yield (key, ts, ctx.state.value())

    logic = Process((element, on_timer), lambda r: r[0]).build(ctx_for(backend))
    recs = [("a", 1.0), ("b", 2.0), ("a", 3.0)]
    logic.process(recs, np.array([t for _, t in recs]))
    fired = logic.on_watermark(10.0)
    assert seen == [("a", 1.0, None, None), ("b", 2.0, None, None), ("a", 3.0, None, 1.0),
                    ("a", 2.0, "event_time", 3.0), ("b", 3.0, "event_time", 2.0),
                    ("a", 4.0, "event_time", 3.0)]
    assert fired.items == [("a", 2.0, 3.0), ("b", 3.0, 2.0), ("a", 4.0, 3.0)]
    assert fired.event_times.tolist() == [2.0, 3.0, 4.0]
    # every timer fired: a snapshot holds the values, and no timer
    logic.snapshot()
    assert {k for k, _ in logic.state.items() if isinstance(k, tuple)} == {
        ("__v", "a"), ("__v", "b")}


def test_a_timer_without_on_timer_is_a_dead_letter_and_registers_nothing():
    def element(value, ctx):
        ctx.timers.register(event_time=ctx.timestamp + 1.0)

    logic = Process(element, key_fn=lambda r: r).build(StepContext("p", 0, 1))
    out = logic.process(["a"], np.array([1.0]))
    assert [d.record for d in out.dead] == ["a"]
    assert "no on_timer" in out.dead[0].reason
    assert len(logic.queues["event_time"]) == 0
