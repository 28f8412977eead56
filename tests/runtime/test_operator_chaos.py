"""Every keyed event-time operator through a failure and through a rescale, exactly-once.

Two generator source instances make records at a set rate (so the job runs for about three
seconds and takes several checkpoints), with event times from their sequence numbers. Each
operator's output is first taken from a failure-free run at parallelism 1; then the same
flow runs with other settings (parallelism, chaining, backend, all drawn from a fixed
seed) and either one of its actors killed at a drawn moment after its first checkpoint, or
the operator rescaled from a savepoint. Under exactly-once both must give the failure-free
output, record for record (the two jobs of a rescale together). The outputs do not depend
on how the source instances interleave: windows and joins fire on watermarks, and the
process function counts per second of event time.
"""

from __future__ import annotations

import random
import time

import pytest

import rayflow as rf
from rayflow.operators.process import KeyedProcessFunction
from rayflow.operators.windows import (
    Count,
    EventTime,
    SessionWindow,
    SlidingWindow,
    Sum,
    TumblingWindow,
)
from rayflow.testing import wait_for

N, KEYS, RATE = 3000, 10, 1000.0
KINDS = ["tumble", "slide", "session", "interval", "join", "process", "stateful_map"]
STEP = {"tumble": "w", "slide": "w", "session": "w", "interval": "j", "join": "j",
        "process": "p", "stateful_map": "m"}


def _time(r):
    return r[1] * 0.01


def _key(r):
    return r[0]


def _value(r):
    return r[1]


def _row(r):
    return (r.key, r.start, r.value)


def _running_sum(total, r):
    total = (total or 0) + r[1]
    return total, total


class PerSecond(KeyedProcessFunction):
    """Per key, a count per second of event time, emitted by that second's timer."""

    def process_element(self, value, ctx):
        second = value[1] // 100
        counts = dict(ctx.state.value() or {})
        counts[second] = counts.get(second, 0) + 1
        ctx.state.update(counts)
        ctx.timers.register(event_time=second + 1.0)

    def on_timer(self, key, ts, ctx):
        counts = dict(ctx.state.value() or {})
        n = counts.pop(int(ts) - 1, None)
        ctx.state.update(counts)
        return [(key, ts, n)]


def _source(flow, name, offset=0):
    make = (lambda i: (f"k{i % KEYS}", i)) if not offset else \
        (lambda i: (f"k{i % KEYS}", i + offset))
    return flow.source(name, rf.GeneratorSource(make, count=N, rate=RATE), parallelism=2,
                       watermarks=EventTime(timestamp=_time, max_delay_s=0.5), batch_size=20)


def _flow(kind, par, chained):
    flow = rf.Dataflow(f"chaos-{kind}-{time.time_ns()}")
    keyed = _source(flow, "a").key_by(_key)
    opts = {"parallelism": par, **({} if chained else {"disable_chaining": True})}
    clock = EventTime()
    if kind == "tumble":
        out = keyed.window("w", TumblingWindow(1.0), Count(), clock=clock, **opts).map("f", _row)
    elif kind == "slide":
        out = keyed.window("w", SlidingWindow(2.0, 0.5), Sum(_value), clock=clock,
                           **opts).map("f", _row)
    elif kind == "session":
        out = keyed.window("w", SessionWindow(0.05), Count(), clock=clock, **opts).map("f", _row)
    elif kind == "interval":
        right = _source(flow, "b", offset=7).key_by(_key)
        out = keyed.interval_join("j", right, -0.05, 0.05, **opts)
    elif kind == "join":
        right = _source(flow, "b", offset=3).key_by(_key)
        out = keyed.join("j", right, TumblingWindow(1.0), clock=clock, **opts)
    elif kind == "process":
        out = keyed.process("p", PerSecond(), **opts)
    else:
        out = keyed.stateful_map("m", _running_sum, **opts)
    out.sink("out", rf.CollectSink())
    return flow


def _checkpoints(backend, tmp_path):
    return {"interval_s": 0.3, "processing_guarantee": "exactly_once",
            "state_backend": backend, "state_dir": str(tmp_path), "max_restarts": 6}


def _out(*jobs):
    return sorted(repr(r) for job in jobs for r in job.collect("out"))


def _failure_free(kind, tmp_path):
    job = _flow(kind, 1, True).run(checkpoint=_checkpoints("memory", tmp_path / "ref"),
                                   timeout_s=240)
    return _out(job)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_an_operator_gives_the_failure_free_output_through_a_killed_actor(
        ray_session, tmp_path, kind):
    import ray

    rng = random.Random(f"kill-{kind}")
    par, chained = rng.choice([1, 3]), rng.random() < 0.5
    backend = rng.choice(["memory", "rocksdb"])
    expected = _failure_free(kind, tmp_path)
    job = _flow(kind, par, chained).run(background=True,
                                        checkpoint=_checkpoints(backend, tmp_path / "run"))
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
    time.sleep(rng.uniform(0.0, 1.0))
    actors = job.actors()
    ray.kill(actors[rng.randrange(len(actors))], no_restart=True)
    job.wait(240)
    assert job.recoveries, (kind, "the kill came after the end of the input")
    assert _out(job) == expected, (kind, par, chained, backend)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_an_operator_gives_the_failure_free_output_across_a_rescale(
        ray_session, tmp_path, kind):
    rng = random.Random(f"rescale-{kind}")
    par, backend = rng.choice([1, 3]), rng.choice(["memory", "rocksdb"])
    new_par = rng.choice([p for p in (1, 2, 3) if p != par])
    expected = _failure_free(kind, tmp_path)
    job = _flow(kind, par, False).run(background=True,
                                      checkpoint=_checkpoints(backend, tmp_path / "run"))
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
    time.sleep(rng.uniform(0.0, 1.0))
    assert job.state == "RUNNING", (kind, "the input ended before the rescale")
    rescaled = job.rescale({STEP[kind]: new_par})
    rescaled.wait(240)
    assert _out(job, rescaled) == expected, (kind, par, new_par, backend)
