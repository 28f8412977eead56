"""Region failover: a flow whose instances form independent pipelines (forward edges only)
restarts only the pipeline whose actor died; the others run on, and the output stays
exactly once."""

from __future__ import annotations

import time
from collections import Counter

import pytest

import rayflow as rf
from rayflow.connectors.kafka import create_topic, produce, read_values
from rayflow.testing import wait_for

N = 4000
N_LONG = 4 * N  # the random kills' input: a run of N can end before a kill comes


def _slow_upper(raw: bytes) -> bytes:
    time.sleep(0.0005)  # stretch the run over several checkpoints
    return raw.upper()


def _input(kafka_broker, n: int) -> str:
    topic = f"region-in-{n}-{time.time_ns()}"
    create_topic(kafka_broker.bootstrap, topic, 4)
    produce(kafka_broker.bootstrap, topic, [f"r{i}".encode() for i in range(n)], partitions=4)
    return topic


@pytest.fixture(scope="module")
def region_input(kafka_broker):
    return _input(kafka_broker, N)


@pytest.fixture(scope="module")
def long_region_input(kafka_broker):
    return _input(kafka_broker, N_LONG)


def _run(bs, topic_in, strategy):
    out = f"region-out-{strategy}-{time.time_ns()}"
    create_topic(bs, out, 2)
    flow = rf.Dataflow(f"region-{strategy}")
    (flow.source("src", rf.KafkaSource(topic_in, bootstrap=bs, bounded=True), parallelism=2)
         .map("up", _slow_upper)
         .sink("out", rf.KafkaSink(out, bootstrap=bs), parallelism=2, disable_chaining=True))
    job = rf.run(flow, background=True, stream={"batch_size": 40},
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once",
                             "failover_strategy": strategy})
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
    before = {k: h._actor_id for k, h in job.hosts.items()}
    import ray

    ray.kill(job.hosts[("out", 0)], no_restart=True)
    wait_for(lambda: job.recoveries and job.recoveries[-1]["restart_s"] is not None, 120)
    after = {k: h._actor_id for k, h in job.hosts.items()}
    job.wait(240)
    return job, before, after, Counter(read_values(bs, out, "read_committed"))


@pytest.mark.parametrize("strategy", ["region", pytest.param("full", marks=pytest.mark.slow)])
def test_only_the_failed_region_restarts_and_output_is_exactly_once(
        ray_session, kafka_broker, region_input, strategy):
    job, before, after, got = _run(kafka_broker.bootstrap, region_input, strategy)
    assert got == Counter(f"R{i}".encode() for i in range(N))
    assert job.status() == "FINISHED" and len(job.recoveries) == 1
    restarted = {k for k in before if before[k] != after[k]}
    if strategy == "region":
        assert job.recoveries[0]["region"] == [("out", 0), ("src", 0), ("up", 0)]
        assert restarted == {("out", 0), ("src", 0), ("up", 0)}
    else:
        assert "region" not in job.recoveries[0]
        assert restarted == set(before)
    assert job.actors() == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_random_kills_in_a_flow_of_regions(ray_session, kafka_broker, long_region_input,
                                           seed):
    """One or two kills of any actor (the coordinator included: then everything restarts),
    the second maybe during the first recovery: exactly-once output every time."""
    import random

    import ray

    rng = random.Random(seed)
    bs = kafka_broker.bootstrap
    out = f"region-rand-{seed}-{time.time_ns()}"
    create_topic(bs, out, 2)
    flow = rf.Dataflow(f"region-rand-{seed}")
    (flow.source("src", rf.KafkaSource(long_region_input, bootstrap=bs, bounded=True),
                 parallelism=2)
         .map("up", _slow_upper, disable_chaining=rng.random() < 0.5)
         .sink("out", rf.KafkaSink(out, bootstrap=bs), parallelism=2,
               disable_chaining=rng.random() < 0.5))
    job = rf.run(flow, background=True, stream={"batch_size": 40},
                 checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once",
                             "max_restarts": 8})
    wait_for(lambda: any(c["status"] == "completed" for c in job.checkpoints()), 60)
    killed = []
    for _ in range(rng.choice([1, 2])):
        time.sleep(rng.uniform(0.0, 0.8))
        pool = job.actors() + ([job.coordinator] if job.coordinator is not None else [])
        if job.state != "RUNNING" or not pool:
            break
        try:
            ray.kill(rng.choice(pool), no_restart=True)
            killed.append(1)
        except Exception:  # noqa: BLE001 - already gone
            pass
    job.wait(240)
    assert killed, "no kill landed before the job ended: the trial proves nothing"
    assert Counter(read_values(bs, out, "read_committed")) == \
        Counter(f"R{i}".encode() for i in range(N_LONG)), \
        f"seed {seed}, recoveries {job.recoveries}"
