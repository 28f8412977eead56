"""Delivery guarantees under random failures, through the public API only.

A keyed count window over sentences in 4 Kafka partitions, parallelism 2, checkpoints every
0.3 s, the embedded broker. Actors are killed with ``ray.kill`` (a machine failure: no
cleanup) at random moments: any step actor, the checkpoint coordinator, one or two at a
time, the second one while the job is recovering from the first, and a sink in the middle
of its Kafka transaction.

The windows' output ``(word, window index, count)`` does not depend on the order in which
partitions interleave, so every run must equal the plain-Python ground truth exactly:
exactly-once equals it, at-least-once contains all of it, at-most-once repeats no record.
The quick trials run in the suite; ``-m slow`` runs the random matrix.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter

import pytest

import rayflow as rf
from rayflow.connectors.kafka import create_topic, produce, read_values
from rayflow.core.connectors import FINAL_EPOCH
from rayflow.operators.windows import Count, CountWindow, Reduce
from rayflow.testing import CrashBeforeCommit, CrashDuringCommit, wait_for

N = 2400  # sentences
# the random-kill matrix (slow) reads 4x as many: a run of N ends about when its first
# checkpoint completes, so most kills came after the end and proved nothing
N_LONG = 4 * N
WORDS = [f"w{i}" for i in range(40)]


def _sentences(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    return [json.dumps({"id": i, "words": [rng.choice(WORDS) for _ in range(6)]}).encode()
            for i in range(n)]


def _parse(raw: bytes) -> list[tuple[str, int]]:
    time.sleep(0.0004)  # stretch the run over many checkpoints
    msg = json.loads(raw)
    return [(w, msg["id"] * 10 + k) for k, w in enumerate(msg["words"])]


def _expected(sentences: int = N) -> Counter:
    counts = Counter(w for raw in _sentences(sentences) for w in json.loads(raw)["words"])
    out: Counter = Counter()
    for w, n in counts.items():
        for i in range(n // 10):
            out[(w, i, 10)] += 1
        if n % 10:
            out[(w, n // 10, n % 10)] += 1
    return out


def _input(kafka_broker, n: int) -> str:
    bs = kafka_broker.bootstrap
    topic = f"chaos-in-{n}-{time.time_ns()}"
    create_topic(bs, topic, 4)
    produce(bs, topic, _sentences(n), partitions=4)
    return topic


@pytest.fixture(scope="module")
def chaos_input(kafka_broker):
    return _input(kafka_broker, N)


@pytest.fixture(scope="module")
def long_input(kafka_broker):
    """The random-kill matrix's input and its ground truth."""
    return _input(kafka_broker, N_LONG), _expected(N_LONG)


def _flow(bs, topic_in, topic_out, name, sink_par, sink_wrap=None):
    flow = rf.Dataflow(name)
    sink = rf.KafkaSink(topic_out, bootstrap=bs)
    (flow.source("src", rf.KafkaSource(topic_in, bootstrap=bs, bounded=True), parallelism=2)
         .flat_map("parse", _parse)
         .key_by(lambda r: r[0])
         .window("count", CountWindow(10), Count())
         .map("fmt", lambda r: json.dumps([r.key, r.start, r.value]).encode())
         .sink("out", sink_wrap(sink) if sink_wrap else sink, parallelism=sink_par))
    return flow


def _windows(bs, topic) -> Counter:
    return Counter(tuple(json.loads(v)) for v in read_values(bs, topic, "read_committed"))


class _Killer(threading.Thread):
    """Kills ``kills`` random actors of a running job: the first after ``first_s``, each
    next one ``gap_s`` later (inside the recovery the previous kill started)."""

    def __init__(self, job, rng, kills, first_s, gap_s, targets):
        super().__init__(daemon=True)
        self.job, self.rng, self.kills = job, rng, kills
        self.first_s, self.gap_s, self.targets = first_s, gap_s, targets
        self.killed: list[str] = []

    def run(self):
        import ray

        time.sleep(self.first_s)
        for _ in range(self.kills):
            if self.job.state not in ("RUNNING", "STOPPING"):
                return
            pool = []
            if "step" in self.targets:
                pool += [("step", a) for a in self.job.actors()]
            if "coordinator" in self.targets and self.job.coordinator is not None:
                pool.append(("coordinator", self.job.coordinator))
            if not pool:
                return
            what, actor = self.rng.choice(pool)
            try:
                ray.kill(actor, no_restart=True)
                self.killed.append(what)
            except Exception:  # noqa: BLE001 - already gone
                pass
            time.sleep(self.gap_s)


def _trial(bs, chaos_input, guarantee, sink_par, seed, kills, targets, sink_wrap=None,
           backend="memory", tmp_path=None, unaligned=False):
    rng = random.Random(seed)
    out = f"chaos-out-{seed}-{time.time_ns()}"
    create_topic(bs, out, 2)
    chk = {"interval_s": 0.3, "processing_guarantee": guarantee, "max_restarts": 8,
           "state_backend": backend, "unaligned": unaligned}
    if tmp_path is not None:
        chk["state_dir"] = str(tmp_path)
    job = rf.run(_flow(bs, chaos_input, out, f"chaos-{seed}", sink_par, sink_wrap),
                 background=True, checkpoint=chk,
                 # unaligned: channels deep enough that checkpoints hold batches in flight
                 stream={"batch_size": 40, **({"channel_calls": 16} if unaligned else {})})
    killer = None
    if kills:
        wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
        killer = _Killer(job, rng, kills, rng.uniform(0.0, 0.8), rng.uniform(0.2, 1.5),
                         targets)
        killer.start()
    job.wait(240)
    if killer is not None:
        killer.join(10)
    return job, _windows(bs, out), (killer.killed if killer else [])


def _check(guarantee, got: Counter, expected: Counter, note: str) -> None:
    if guarantee == "exactly_once":
        assert got == expected, (note, "missing", expected - got, "extra", got - expected)
    elif guarantee == "at_least_once":
        assert not (expected - got), (note, "missing", expected - got)


@pytest.fixture(scope="module")
def expected():
    return _expected()


def test_failure_free_run_equals_ground_truth(ray_session, kafka_broker, chaos_input,
                                              expected):
    job, got, _ = _trial(kafka_broker.bootstrap, chaos_input, "exactly_once", 2, 0, 0, ())
    assert got == expected, ("missing", expected - got, "extra", got - expected,
                             "recoveries", job.recoveries, "checkpoints", job.checkpoints())
    assert job.recoveries == []
    assert sum(c["status"] == "completed" for c in job.checkpoints()) >= 2


def test_unaligned_failure_free_run_equals_ground_truth(ray_session, kafka_broker,
                                                        chaos_input, expected):
    """Barriers overtake the queued batches, which the checkpoints hold instead."""
    job, got, _ = _trial(kafka_broker.bootstrap, chaos_input, "exactly_once", 2, 3, 0, (),
                         unaligned=True)
    assert got == expected, ("missing", expected - got, "extra", got - expected)
    done = [c for c in job.checkpoints() if c["status"] == "completed"]
    assert len(done) >= 2 and job.recoveries == []
    assert any(c["inflight_batches"] > 0 for c in done), done


def test_unaligned_kill_restores_the_batches_in_flight(ray_session, kafka_broker,
                                                       chaos_input, expected):
    """A step dies after an unaligned checkpoint that held batches in flight: the restore
    hands them to their receivers first, and the output is still exactly the ground truth."""
    import ray

    bs = kafka_broker.bootstrap
    out = f"chaos-unaligned-{time.time_ns()}"
    create_topic(bs, out, 2)
    job = rf.run(_flow(bs, chaos_input, out, "chaos-unaligned", 2), background=True,
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once",
                             "unaligned": True},
                 stream={"batch_size": 40, "channel_calls": 16})  # (as _trial's unaligned)
    wait_for(lambda: any(c["status"] == "completed" and c["inflight_batches"] > 0
                         for c in job.checkpoints()), 60)
    ray.kill(job.hosts[("count", 1)], no_restart=True)
    job.wait(240)
    assert len(job.recoveries) == 1
    got = _windows(bs, out)
    words = Counter()
    for (w, _, n), k in (got - expected).items():
        words[w] += n * k
    for (w, _, n), k in (expected - got).items():
        words[w] -= n * k
    _check("exactly_once", got, expected, ("unaligned kill: records per word off by",
                                           dict(words), job.recoveries, job.checkpoints()))


def test_sink_dies_inside_its_transaction(ray_session, kafka_broker, chaos_input, expected,
                                          tmp_path):
    """Every record of the epoch reached the broker, the transaction did not commit: the
    restore writes only what is not there (on this broker: nothing of that epoch)."""
    marker = str(tmp_path / "crashed")
    job, got, _ = _trial(kafka_broker.bootstrap, chaos_input, "exactly_once", 2, 1, 0, (),
                         sink_wrap=lambda s: CrashDuringCommit(s, marker, instance=1))
    assert (tmp_path / "crashed").exists() and len(job.recoveries) == 1
    _check("exactly_once", got, expected, "mid-commit")


def test_sink_dies_committing_its_last_epoch(ray_session, kafka_broker, chaos_input, expected,
                                             tmp_path):
    """A checkpoint holding the sink's final state is complete (its windows flushed), then
    the sink dies committing its last epoch: the restore commits the rest and flushes no
    window a second time."""
    marker = str(tmp_path / "crashed")
    job, got, _ = _trial(kafka_broker.bootstrap, chaos_input, "exactly_once", 2, 2, 0, (),
                         sink_wrap=lambda s: CrashBeforeCommit(s, FINAL_EPOCH, marker))
    assert (tmp_path / "crashed").exists() and len(job.recoveries) == 1
    assert job.recoveries[0]["restored_checkpoint"] is not None
    _check("exactly_once", got, expected, "final commit")


def test_coordinator_killed_and_recovered_without_anyone_waiting(ray_session, kafka_broker,
                                                                 chaos_input, expected):
    """The coordinator dies: the job's supervisor starts a new one from the durable store
    and restores the tasks, before anyone calls wait()."""
    import ray

    bs = kafka_broker.bootstrap
    out = f"chaos-coord-{time.time_ns()}"
    create_topic(bs, out, 1)
    job = rf.run(_flow(bs, chaos_input, out, "chaos-coord", 1), background=True,
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once"},
                 stream={"batch_size": 40})
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
    ray.kill(job.coordinator, no_restart=True)
    wait_for(lambda: job.recoveries and job.recoveries[-1]["restart_s"] is not None, 120)
    job.wait(240)
    assert job.status() == "FINISHED" and len(job.recoveries) == 1
    _check("exactly_once", _windows(bs, out), expected, "coordinator")
    assert job.actors() == []  # nothing left running


def test_coordinator_lost_after_the_sources_finished(ray_session, kafka_broker, tmp_path):
    """The coordinator dies after the sources finished, while the barriers they sent still
    travel through a slow step: the sink's acknowledgements and its last epoch cannot
    complete without it. The job recovers, and every record is committed once."""
    import ray

    bs = kafka_broker.bootstrap
    out = f"chaos-coord-late-{time.time_ns()}"
    create_topic(bs, out, 2)
    n, held = 400, 200
    gate = str(tmp_path / "open")

    def slow(i):
        # records from `held` on wait for the gate: the source ends while the barriers it
        # sent after them are held in this step, however fast or slow the machine is
        deadline = time.monotonic() + 120
        while i >= held and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return i

    flow = rf.Dataflow("chaos-coord-late")
    (flow.source("src", rf.GeneratorSource(lambda i: i, count=n))
         .map("slow", slow, parallelism=2)
         .map("fmt", lambda i: str(i).encode(), parallelism=2)
         .sink("out", rf.KafkaSink(out, bootstrap=bs)))
    # room in flight for the 200 records the slow step holds: 16 whole batches of 10 per
    # channel (a source without a rate sends whole batches; batch_target_s 0 keeps the
    # blocked step from being sent parts of them, channel_target_s 0 from fewer calls)
    job = rf.run(flow, background=True,
                 stream={"batch_size": 10, "channel_calls": 16, "channel_target_s": 0,
                         "batch_target_s": 0},
                 checkpoint={"interval_s": 0.2, "processing_guarantee": "exactly_once"})
    wait_for(lambda: job.metrics().get("src", {}).get("records_out") == n, 60, every_s=0.02)
    assert job.metrics()["out"]["records_in"] <= held  # the sink is still far behind
    ray.kill(job.coordinator, no_restart=True)
    open(gate, "w").close()
    job.wait(240)
    assert job.status() == "FINISHED" and len(job.recoveries) == 1, job.recoveries
    got = Counter(int(v) for v in read_values(bs, out, "read_committed"))
    assert got == Counter(range(n)), ("missing", Counter(range(n)) - got,
                                      "extra", got - Counter(range(n)))


class _SlowRestoreSink(rf.core.connectors.SinkSpec):
    """``inner``, whose restored instances take seconds to build: a window in which a
    recovery has started the new coordinator but not yet attached the new tasks to it."""

    def __init__(self, inner):
        self.inner = inner

    def build(self, ctx, resume_state=None):
        if resume_state is not None:
            time.sleep(4.0)
        return self.inner.build(ctx, resume_state)


def test_a_kill_before_the_new_coordinator_took_over(ray_session, kafka_broker, chaos_input,
                                                     expected):
    """The coordinator dies; while the recovery builds the new tasks (before they are
    attached to the new coordinator, which knows no checkpoint yet), a step dies too. The
    second recovery restores the last completed checkpoint, not nothing (it used to run
    everything again, committing the windows the sinks had committed once more)."""
    import ray

    bs = kafka_broker.bootstrap
    out = f"chaos-coord-twice-{time.time_ns()}"
    create_topic(bs, out, 2)
    # small batches: the job must still run when its coordinator dies, on a fast machine too
    job = rf.run(_flow(bs, chaos_input, out, "chaos-coord-twice", 2, _SlowRestoreSink),
                 background=True, stream={"batch_size": 10},
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once",
                             "max_restarts": 4})
    wait_for(lambda: sum(c["status"] == "completed" for c in job.checkpoints()) >= 2, 60)
    assert job.status() == "RUNNING" and job.coordinator is not None, "ended before the kill"
    old = {a._actor_id for a in job.actors()}
    ray.kill(job.coordinator, no_restart=True)
    # the old actors go first (the teardown waits until they are dead), then the new start
    new = wait_for(lambda: [a for a in job.actors() if a._actor_id not in old], 60,
                   every_s=0.05)
    time.sleep(0.5)  # the new tasks are being built: the restored sinks take 4 s
    assert job.recoveries[-1]["restart_s"] is None  # still recovering
    ray.kill(new[0], no_restart=True)
    job.wait(240)
    assert len(job.recoveries) == 2, job.recoveries
    assert job.recoveries[1]["restored_checkpoint"] == job.recoveries[0]["restored_checkpoint"]
    _check("exactly_once", _windows(bs, out), expected, "coordinator, then a step")


@pytest.mark.slow
def test_two_kills_the_second_during_recovery(ray_session, kafka_broker, chaos_input,
                                              expected):
    job, got, killed = _trial(kafka_broker.bootstrap, chaos_input, "exactly_once", 2, 11, 2,
                              ("step",))
    assert len(killed) == 2 and len(job.recoveries) >= 2
    _check("exactly_once", got, expected, f"killed {killed}")


@pytest.mark.slow
def test_at_most_once_stateful_repeats_no_record(ray_session, kafka_broker, chaos_input):
    """The windows collect the ids of their records: after a kill no id appears twice."""
    import ray

    bs = kafka_broker.bootstrap
    flow = rf.Dataflow("chaos-amo")
    (flow.source("src", rf.KafkaSource(chaos_input, bootstrap=bs, bounded=True),
                 parallelism=2)
         .flat_map("parse", _parse)
         .key_by(lambda r: r[0])
         .window("ids", CountWindow(10), Reduce(lambda acc, r: acc + (r[1],), ()))
         .sink("out", rf.CollectSink()))
    job = rf.run(flow, background=True, stream={"batch_size": 40},
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "at_most_once"})
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
    wait_for(lambda: job.metrics()["out"]["records_in"] > 50, 60)
    ray.kill(job.hosts[("ids", 1)], no_restart=True)
    job.wait(240)
    assert len(job.recoveries) == 1
    ids = Counter(i for r in job.collect("out") for i in r.value)
    assert ids and max(ids.values()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 112))
def test_random_kills(ray_session, kafka_broker, long_input, seed, tmp_path):
    chaos_input, expected = long_input
    rng = random.Random(seed)
    guarantee = rng.choice(["exactly_once", "exactly_once", "at_least_once"])
    sink_par = rng.choice([1, 2])
    kills = rng.choice([1, 2])
    backend = rng.choice(["memory", "filesystem", "rocksdb"])
    job, got, killed = _trial(kafka_broker.bootstrap, chaos_input, guarantee, sink_par, seed,
                              kills, ("step", "coordinator"), backend=backend,
                              tmp_path=tmp_path)
    print(f"seed={seed} {guarantee} sink_par={sink_par} backend={backend} killed={killed} "
          f"recoveries={len(job.recoveries)}")
    assert killed, "no kill landed before the job ended: the trial proves nothing"
    _check(guarantee, got, expected, f"seed {seed}: killed {killed}")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(200, 208))
def test_unaligned_random_kills(ray_session, kafka_broker, long_input, seed, tmp_path):
    """Unaligned exactly-once checkpoints under random kills (steps and the coordinator, one
    or two at a time): the batches a checkpoint held in flight are handed over once."""
    chaos_input, expected = long_input
    rng = random.Random(seed)
    sink_par = rng.choice([1, 2])
    kills = rng.choice([1, 2])
    backend = rng.choice(["memory", "filesystem", "rocksdb"])
    job, got, killed = _trial(kafka_broker.bootstrap, chaos_input, "exactly_once", sink_par,
                              seed, kills, ("step", "coordinator"), backend=backend,
                              tmp_path=tmp_path, unaligned=True)
    held = [c["inflight_batches"] for c in job.checkpoints() if c["status"] == "completed"]
    print(f"seed={seed} unaligned sink_par={sink_par} backend={backend} killed={killed} "
          f"recoveries={len(job.recoveries)} in flight={held}")
    assert killed, "no kill landed before the job ended: the trial proves nothing"
    _check("exactly_once", got, expected, f"seed {seed}: killed {killed}")
