"""End-to-end flows on a real local Ray: exact outputs, partitioning, errors, dead letters,
backpressure and clean shutdown."""

import time
from collections import Counter

import numpy as np
import pytest
import ray

import rayflow as rf
from rayflow.errors import ConfigError, StepError


def _run(flow, **stream):
    return flow.run(stream=stream or {}, timeout_s=120)


@pytest.mark.parametrize("chaining", [True, False])
def test_map_filter_flat_map_exact_output(ray_session, chaining):
    """Chained (one actor for the five steps, plain calls between them) or not (five actors,
    channels between them): the same records, the same per-step counters."""
    lines = [f"w{i % 7} w{i % 3} x" for i in range(3000)]
    f = rf.Dataflow("exact")
    (f.source("in", rf.MemorySource(lines))
      .flat_map("split", str.split)
      .filter("no_x", lambda w: w != "x")
      .map("upper", str.upper)
      .sink("out", rf.CollectSink()))
    # batch_target_s 0: whole batches (the count below is batch_size's, not the receivers' pace)
    job = f.run(stream={"batch_size": 256, "chaining": chaining, "batch_target_s": 0},
                timeout_s=120, background=True)
    assert len(job.actors()) == (1 if chaining else 5)
    job.wait(120)
    expected = [w.upper() for line in lines for w in line.split() if w != "x"]
    assert job.collect("out") == expected  # one instance per step: order is kept
    m = job.metrics()
    assert m["split"]["records_in"] == 3000 and m["split"]["records_out"] == 9000
    assert m["out"]["records_in"] == len(expected)
    assert m["in"]["batches_out"] == -(-3000 // 256)
    assert job.status() == "FINISHED"


def _env(_):
    import os

    return (os.environ.get("RF_TEST_ENV"), os.environ.get("RF_TEST_OTHER", "unset"),
            os.environ.get("MALLOC_ARENA_MAX"), os.environ.get("MALLOC_TRIM_THRESHOLD_"))


def test_actor_env_sets_the_environment_of_its_steps_only(ray_session):
    f = rf.Dataflow("env")
    (f.source("in", rf.MemorySource([1, 2]))
      .map("plain", _env)
      .map("tuned", lambda r: (*r, *_env(None)), start_new_chain=True,
           actor_env={"RF_TEST_ENV": "yes", "MALLOC_TRIM_THRESHOLD_": 1 << 26})
      .sink("out", rf.CollectSink(),
            actor_env={"RF_TEST_ENV": "yes", "MALLOC_TRIM_THRESHOLD_": 1 << 26}))
    job = f.run(timeout_s=120, background=True)
    assert len(job.actors()) == 2  # in+plain | tuned+out
    job.wait(120)
    # every worker has the job's process profile ("default": two arenas, a 4 MiB trim
    # threshold); a step's actor_env goes on top of it, for that step only
    assert job.collect("out") == [(None, "unset", "2", str(4 << 20),
                                   "yes", "unset", "2", str(1 << 26))] * 2


def test_a_steps_process_profile_sets_the_environment_of_its_actor_only(ray_session):
    f = rf.Dataflow("profile")
    (f.source("in", rf.MemorySource([1]))
      .map("plain", _env)
      .map("whole", lambda r: (*r, *_env(None)), start_new_chain=True,
           process_profile="whole_pipeline", actor_env={"RF_TEST_ENV": "mine"})
      .sink("out", rf.CollectSink()))
    job = f.run(timeout_s=120, background=True)
    job.wait(120)
    # the job's "default" profile, then "whole_pipeline" (64 MiB trim) under the actor_env
    assert job.collect("out") == [(None, "unset", "2", str(4 << 20),
                                   "mine", "unset", "2", str(64 << 20))]
    with pytest.raises(ConfigError, match="step 'x': option process_profile: "
                                             "ray.process_profiles has no profile 'nope'"):
        f.source("again", rf.MemorySource([1])).map("x", _env, process_profile="nope")


def test_key_by_sends_equal_keys_to_one_instance(ray_session):
    words = [f"k{i % 37}" for i in range(5000)]
    f = rf.Dataflow("keyed")
    (f.source("in", rf.MemorySource(words), parallelism=2)
      .key_by(lambda w: w)
      .apply("tag", _TagInstance(), parallelism=3)
      .sink("out", rf.CollectSink(), parallelism=3))
    job = _run(f, batch_size=100)
    out = job.collect("out")
    assert Counter(w for w, _ in out) == Counter(words)
    owners = {}
    for w, inst in out:
        assert owners.setdefault(w, inst) == inst
    assert len(set(owners.values())) == 3


class _TagInstance(rf.dataflow.OperatorSpec):
    """Tags each record with the index of the instance that processed it."""

    def build(self, ctx, resume_state=None):
        from rayflow.core.operators import Logic, Output

        class L(Logic):
            def process(self, items, times):
                return Output([(x, self.ctx.instance) for x in items], times)

        return L(ctx)


class _SlowSnapshot(rf.dataflow.OperatorSpec):
    """Passes records on; each snapshot takes 0.1 s."""

    def build(self, ctx, resume_state=None):
        from rayflow.core.operators import Logic, Output

        class L(Logic):
            def process(self, items, times):
                return Output(items, times)

            def snapshot(self):
                time.sleep(0.1)
                return "state"

        return L(ctx)


def test_a_steps_checkpoint_time_leaves_out_the_steps_chained_after_it(ray_session):
    """Three steps chained in one actor, the last with a slow snapshot: passing the barrier
    on snapshots the chained steps within the first one's call, and their time is theirs,
    as a step's busy time leaves out the chained steps' work."""
    f = rf.Dataflow("chk-time")
    (f.source("in", rf.MemorySource(list(range(600))))
      .map("head", lambda x: time.sleep(0.002) or x)
      .apply("slow", _SlowSnapshot())
      .sink("out", rf.CollectSink()))
    job = f.run(stream={"batch_size": 20}, checkpoint={"interval_s": 0.2}, timeout_s=120)
    assert job.collect("out") == list(range(600))
    m = job.metrics()
    assert m["slow"]["checkpoints"] >= 2 and m["head"]["checkpoints"] == m["slow"]["checkpoints"]
    assert m["slow"]["checkpoint_s"] >= 0.1 * m["slow"]["checkpoints"]
    assert m["head"]["checkpoint_s"] < 0.02 * m["head"]["checkpoints"]


def test_rebalance_and_numpy_batches(ray_session):
    f = rf.Dataflow("np")
    (f.source("in", rf.GeneratorSource(lambda seq: seq, count=100_000, columnar=True))
      .rebalance()
      .map_batches("sq", lambda b: b * b, parallelism=2)
      .sink("out", rf.CollectSink()))
    job = _run(f, batch_size=5000)
    out = np.sort(job.collect("out"))
    assert np.array_equal(out, np.arange(100_000) ** 2)
    assert job.latency()["samples"] > 0


def test_user_error_names_step_instance_and_record(ray_session):
    f = rf.Dataflow("boom")
    (f.source("in", rf.MemorySource(list(range(100))))
      .map("div", lambda x: 1 // (x - 42))
      .sink("out", rf.CollectSink()))
    with pytest.raises(StepError) as info:
        _run(f, batch_size=10)
    err = info.value
    assert (err.step_id, err.instance, err.record) == ("div", 0, "42")
    assert "ZeroDivisionError" in err.reason
    assert "step 'div' instance 0 failed on record 42" in str(err)


def test_dead_letters_are_routed_and_counted(ray_session):
    f = rf.Dataflow("dlq")
    data = [str(i) if i % 10 else "bad" for i in range(1000)]
    (f.source("in", rf.MemorySource(data))
      .map("parse", int, on_error="dead_letter")
      .sink("out", rf.CollectSink()))
    job = _run(f, batch_size=64)
    assert job.collect("out") == [int(x) for x in data if x != "bad"]
    dead = job.dead_letters()
    assert len(dead) == 100 == job.metrics()["parse"]["dead_letters"]
    assert all(d.step_id == "parse" and d.record == "bad" and "ValueError" in d.reason
               for d in dead)


class _SlowSink(rf.core.connectors.SinkSpec):
    def build(self, ctx, resume_state=None):
        from rayflow.core.connectors import SinkWriter

        class W(SinkWriter):
            def write(self, items, times, in_time):
                time.sleep(0.05)

        return W()


class _FailsAtEndSink(rf.core.connectors.SinkSpec):
    """Writes every batch, then fails to flush at its end of stream: with a user error, or
    with a Ray error (it flushes through ``service``, an actor that has died)."""

    def __init__(self, service=None):
        self.service = service

    def build(self, ctx, resume_state=None):
        from rayflow.core.connectors import SinkWriter

        service = self.service

        class W(SinkWriter):
            def write(self, items, times, in_time):
                pass

            def flush(self):
                if service is None:
                    raise OSError("disk full at the end")
                ray.get(service.ping.remote())

        return W()


def _fails_at_end_flow(sink):
    f = rf.Dataflow("fails-at-end")
    # its own actor, two hops from the source
    (f.source("in", rf.MemorySource(list(range(100))))
      .map("id", lambda x: x, disable_chaining=True)
      .sink("out", sink, disable_chaining=True))
    return f


@pytest.mark.parametrize("checkpoint", [
    {"interval_s": 0, "processing_guarantee": "at_most_once"},
    {"interval_s": 0.2, "processing_guarantee": "exactly_once"}])
def test_a_sink_that_fails_at_its_end_fails_the_job(ray_session, checkpoint):
    """A sink whose last flush fails has ended, but not finished: the job fails, names it,
    and never reports FINISHED."""
    with pytest.raises(StepError, match="disk full at the end") as info:
        rf.run(_fails_at_end_flow(_FailsAtEndSink()), checkpoint=checkpoint, timeout_s=120)
    assert info.value.step_id == "out"


def test_a_sink_lost_to_a_ray_error_at_its_end_is_not_finished(ray_session):
    """The sink's end of stream fails with a Ray error (what it flushes through has died):
    the job recovers (a Ray failure), and fails once the restarts are spent. It used to
    report FINISHED: the error reached the supervisor through the upstream steps, and the
    sink, having ended, passed for finished, so the error was taken for a death after the
    end."""

    @ray.remote(num_cpus=0)
    class Service:
        def ping(self):
            return True

    service = Service.remote()
    ray.get(service.ping.remote())
    ray.kill(service, no_restart=True)
    job = rf.run(_fails_at_end_flow(_FailsAtEndSink(service)), background=True,
                 checkpoint={"interval_s": 0, "max_restarts": 1})
    with pytest.raises(StepError, match="ActorDiedError|died"):
        job.wait(120)
    assert job.status() == "FAILED" and len(job.recoveries) == 1


class _RefusesCommitSink(rf.core.connectors.SinkSpec):
    """A two-phase-commit sink whose commit fails (as a transaction the broker refused)."""

    def build(self, ctx, resume_state=None):
        from rayflow.core.connectors import SinkWriter

        class W(SinkWriter):
            def write(self, items, times, in_time):
                pass

            def uncommitted(self):
                return True

            def commit(self, checkpoint_id):
                raise OSError("transaction refused")

        return W()


def test_a_sink_whose_commit_fails_fails_the_job(ray_session):
    """The commit runs on a notification the coordinator does not wait for: its error must
    still reach the job (it used to be logged only, and the job waited for ever)."""
    f = rf.Dataflow("commit-fails")
    (f.source("in", rf.GeneratorSource(lambda i: i, count=2000, rate=2000))
      .sink("out", _RefusesCommitSink(), disable_chaining=True))
    with pytest.raises(StepError, match=r"commit after checkpoint \d+: OSError: transaction "
                                        "refused") as info:
        rf.run(f, checkpoint={"interval_s": 0.2, "processing_guarantee": "exactly_once"},
               timeout_s=120)
    assert info.value.step_id == "out"


def test_slow_sink_backpressures_the_source(ray_session):
    """The source cannot run ahead of a slow sink by more than the channel windows."""
    batch = 1000
    payload = b"x" * 1000  # ~1 MB per batch
    f = rf.Dataflow("bp")
    # three actors: channels between actors are what this test measures (chained steps
    # would call each other directly, and a slow sink would simply slow its caller)
    (f.source("in", rf.GeneratorSource(lambda i: payload, count=200 * batch))
      .map("id", lambda x: x, disable_chaining=True)
      .sink("out", _SlowSink()))
    job = rf.run(f, background=True,
                 stream={"batch_size": batch, "channel_bytes": 4 * 2**20, "channel_calls": 64})
    ray = ray_session
    src = job.hosts[("in", 0)]
    sink = job.hosts[("out", 0)]
    max_ahead = 0
    max_inflight = 0
    for _ in range(20):
        time.sleep(0.1)
        s_src, s_sink = ray.get([src.status.remote(), sink.status.remote()])
        ahead = s_src["counters"]["records_out"] - s_sink["counters"]["records_in"]
        max_ahead = max(max_ahead, ahead)
        max_inflight = max(max_inflight, s_src["inflight_bytes"])
    job.stop()
    # two channels of <= 4 MB (about 4 batches each) plus the batch in each host's hands
    assert max_ahead <= 12 * batch
    assert max_inflight <= 4 * 2**20 + batch * 1100
    assert job.metrics()["in"]["backpressure_s"] > 0.5
    assert job.status() == "STOPPED"


def test_unbounded_source_runs_until_stopped_and_leaves_no_actors(ray_session):
    f = rf.Dataflow("forever")
    f.source("in", rf.GeneratorSource(lambda i: i, rate=2000)).sink("out", rf.CollectSink())
    job = rf.run(f, background=True)
    handles = list(job.hosts.values())
    time.sleep(1.5)
    assert job.status() == "RUNNING"
    live = job.metrics()
    assert live["out"]["records_in"] > 0
    job.stop()
    out = job.collect("out")
    assert out == list(range(len(out))) and len(out) >= 1000
    for h in handles:  # every host actor is gone
        with pytest.raises(ray_session.exceptions.RayActorError):
            ray_session.get(h.status.remote(), timeout=30)
    lat = job.latency()
    assert lat["samples"] > 0 and lat["p50_ms"] < 1000


def test_missing_kafka_topic_fails_fast_with_its_name(ray_session, kafka_broker):
    f = rf.Dataflow("nokafka")
    f.source("in", rf.KafkaSource("no-such-topic", bootstrap=kafka_broker.bootstrap)).sink(
        "out", rf.CollectSink())
    with pytest.raises(Exception, match="no-such-topic"):
        _run(f)


def _gc_settings(_):
    import gc

    return gc.get_threshold(), gc.get_freeze_count() > 0


def test_step_actors_tune_the_garbage_collector_as_configured(ray_session):
    def flow(name):
        f = rf.Dataflow(name)
        f.source("in", rf.MemorySource([1])).map("gc", _gc_settings).sink("out", rf.CollectSink())
        return f

    # the default: fewer collections, and what the built steps hold is frozen out of them
    assert flow("gc-default").run(timeout_s=120).collect("out") == [((200_000, 20, 100), True)]
    job = flow("gc-set").run(timeout_s=120, stream={"gc_threshold": [700, 10, 10],
                                                    "gc_freeze": False})
    assert job.collect("out") == [((700, 10, 10), False)]
    with pytest.raises(ConfigError, match="gc_threshold"):
        flow("gc-bad").run(timeout_s=120, stream={"gc_threshold": [700, -1, 10]})


def test_delivered_throughput_ends_when_the_sink_flushed(ray_session):
    f = rf.Dataflow("delivered")
    f.source("in", rf.MemorySource(list(range(10_000)))).map("m", str).sink("out", rf.CollectSink())
    job = f.run(timeout_s=120)
    m = job.metrics()["out"]
    assert m["first_in_time"] <= m["last_out_time"] <= m["delivered_time"]
    assert 0 < job.throughput(delivered=True) <= job.throughput()
