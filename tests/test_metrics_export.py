"""rayflow's metrics reach Prometheus through Ray's metrics export: a job runs on the test
Ray, and its series, scraped from the node's metrics endpoint, carry the job's labels and
the exact counts the job reports."""

from __future__ import annotations

import time
import urllib.request
import uuid

import numpy as np
import pytest

import rayflow as rf
from rayflow import metrics as m


def _scrape(ray) -> str:
    node = next(n for n in ray.nodes() if n["Alive"])
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _series(text: str, job: str) -> dict[tuple[str, str, str], float]:
    """(series name, step, instance) -> value, for the series labelled with ``job``;
    histogram buckets keyed by ``le`` are left out (their _sum and _count stay)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("job") != job or "le" in s.labels:
                continue
            key = (s.name, s.labels["step"], s.labels["instance"])
            out[key] = out.get(key, 0.0) + s.value  # one per worker process: they add up
    return out


def _per_step(series: dict, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, step, _), v in series.items():
        if n == name:
            out[step] = out.get(step, 0.0) + v
    return out


def _wait_for(ray, job: str, done, timeout_s: float = 180.0) -> dict:
    """Scrape until ``done(series)`` holds (Ray reports every few seconds) or time runs
    out; returns the last scrape either way, for the asserts to explain."""
    deadline = time.monotonic() + timeout_s
    while True:
        series = _series(_scrape(ray), job)
        if done(series) or time.monotonic() > deadline:
            return series
        time.sleep(1.0)


def _slow_on_tens(x: int) -> int:
    if x % 10 == 0:
        raise ValueError(f"no tens: {x}")
    time.sleep(0.0005)  # a slow step: its upstream waits on a full channel
    return x


def _slow_flow(job_name: str, rate: int) -> rf.Dataflow:
    """A generator, a keyed slow step of 2 instances that dead-letters every tenth record,
    and a collecting sink."""
    flow = rf.Dataflow(job_name)
    (flow.source("src", rf.GeneratorSource(lambda i: i, rate=rate))
         .key_by(lambda x: x % 7)
         .map("slow", _slow_on_tens, parallelism=2, on_error="dead_letter")
         .sink("out", rf.CollectSink()))
    return flow


def test_a_running_jobs_series_reach_prometheus_with_its_labels(ray_session):
    """While a job runs, the scrape shows its series, labelled by job, step and instance."""
    job_name = f"metrics-live-{uuid.uuid4().hex[:8]}"
    job = rf.run(_slow_flow(job_name, 2000), background=True, checkpoint={"interval_s": 0.3},
                 stream={"batch_size": 64})
    try:
        def every_instance(series):
            return {(s, i) for (n, s, i) in series if n == "ray_rayflow_records_in_total"} \
                >= {("slow", "0"), ("slow", "1"), ("out", "0")}

        live = _wait_for(ray_session, job_name, every_instance)
        assert every_instance(live), sorted(live)
        assert all(v > 0 for (n, _, _), v in live.items() if n == "ray_rayflow_records_in_total")
        assert live.get(("ray_rayflow_dead_letters_total", "slow", "0"), 0) + \
            live.get(("ray_rayflow_dead_letters_total", "slow", "1"), 0) > 0
    finally:
        job.cancel()


def _death(ray, handle) -> str:
    try:
        ray.get(handle.__ray_ready__.remote(), timeout=30)
    except ray.exceptions.RayActorError as exc:
        return str(exc)
    return "alive"


def test_a_finished_jobs_actors_exit_by_themselves_a_cancelled_ones_are_killed(ray_session):
    """Ray exports a worker's last metrics when it exits; ``ray.kill`` may cut it off
    first (under load the final counts then never reached Prometheus). A job that ended
    well lets its actors and its coordinator exit; a cancelled job kills them."""
    flow = rf.Dataflow(f"metrics-exit-{uuid.uuid4().hex[:8]}")
    (flow.source("src", rf.MemorySource(list(range(500))), parallelism=2)
         .map("m", lambda x: x + 1, parallelism=2)
         .sink("out", rf.CollectSink()))
    job = rf.run(flow, background=True)
    hosts = job.actors()
    coordinator = job.coordinator  # it exits by itself too: no call reaches it while dying
    assert coordinator is not None
    job.wait(60)
    assert sorted(job.collect("out")) == list(range(1, 501))
    assert len(hosts) == 2
    for h in [*hosts, coordinator]:
        assert "Worker exit type: INTENDED_USER_EXIT" in _death(ray_session, h)
    job = rf.run(_slow_flow(f"metrics-cancel-{uuid.uuid4().hex[:8]}", 1000),
                 background=True)  # unbounded: it runs until cancelled
    hosts = job.actors()
    coordinator = job.coordinator
    job.cancel()
    for h in [*hosts, coordinator]:
        assert "killed by `ray.kill`" in _death(ray_session, h)


# slow: it waits on Ray's 10 s metrics report; a clean-clone run under heavy load (twice
# the usual time) failed twice near this file, not yet attributed: kept out of the fast suite
@pytest.mark.slow
def test_a_jobs_series_reach_prometheus_with_its_labels_and_counts(ray_session):
    job_name = f"metrics-{uuid.uuid4().hex[:8]}"
    job = rf.run(_slow_flow(job_name, 1000), background=True, checkpoint={"interval_s": 0.3},
                 stream={"channel_calls": 1, "batch_size": 64, "latency_sample_every": 1})
    # while it runs: the gauge of the source's last snapshot (its position) is there
    live = _wait_for(ray_session, job_name,
                     lambda s: s.get(("ray_rayflow_checkpoint_size_bytes", "src", "0"), 0) > 0)
    assert live[("ray_rayflow_checkpoint_size_bytes", "src", "0")] > 0
    job.stop(savepoint=True)
    want = job.metrics()
    assert want["slow"]["dead_letters"] > 0 and want["src"]["checkpoints"] > 0

    def arrived(series):
        return _per_step(series, "ray_rayflow_records_in_total") == {
            s: float(c["records_in"]) for s, c in want.items()}

    got = _wait_for(ray_session, job_name, arrived)
    for name, (field, _) in m.STEP_COUNTERS.items():
        per_step = _per_step(got, f"ray_{name}_total")
        expect = {s: float(c[field]) for s, c in want.items() if c[field] > 0}
        assert per_step == pytest.approx(expect, rel=1e-9), name  # zero counts: no series
    # every instance has its own series
    assert {i for (n, s, i) in got if n == "ray_rayflow_records_in_total" and s == "slow"} \
        == {"0", "1"}
    # the latency histogram: the sinks' samples (1 in 1 here; the sink has the map's 2
    # instances), thinned only above MAX_LATENCY_OBSERVATIONS_PER_S per second and instance
    lat = job.latency()
    assert lat["samples"] == want["out"]["records_in"]
    count = _per_step(got, "ray_rayflow_latency_seconds_count")
    assert set(count) == {"out"}
    assert min(lat["samples"], m.MAX_LATENCY_OBSERVATIONS_PER_S) <= count["out"] <= lat["samples"]
    assert _per_step(got, "ray_rayflow_latency_seconds_sum")["out"] > 0  # Ray's agent keeps
    # bucket midpoints, so the sum is approximate
    # a snapshot per checkpoint and instance, each timed
    chk = _per_step(got, "ray_rayflow_checkpoint_duration_seconds_count")
    assert chk == {s: float(c["checkpoints"]) for s, c in want.items()}
    assert set(_per_step(got, "ray_rayflow_checkpoint_duration_seconds_sum")) == set(want)
    assert set(n for n, _, _ in got) <= set(m.SERIES)


def test_the_export_is_batched_and_sends_the_last_counts():
    """Pure: without Ray's metrics, the exporter's arithmetic on a fake metric."""
    calls: list = []

    class Fake:
        def inc(self, v, tags):
            calls.append(("inc", v, tags["step"]))

        def observe(self, v, tags):
            calls.append(("observe", v))

    ex = m.StepExporter("j", "s", 0, interval_s=1.0, max_observations_per_s=3)
    ex._last = time.monotonic() + 3600.0  # not due for an hour
    ex.enabled = True
    ex._counters = {name: (fld, Fake()) for name, (fld, _) in m.STEP_COUNTERS.items()}
    ex._latency = Fake()
    c = m.StepCounters(records_in=5)
    rec = m.LatencyRecorder(every=1)
    rec.record(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), out_time=10.0)
    assert not ex.due()  # within the interval: the hot path records nothing
    ex._last = time.monotonic()  # and now exactly one interval's worth: 3 samples
    ex.export(c, rec)
    assert [x for x in calls if x[0] == "inc"] == [("inc", 5, "s")]
    # 6 samples thinned evenly to 3: latencies 9, 7, 5 (samples 0, 2, 4)
    assert [x for x in calls if x[0] == "observe"] == [("observe", 9.0), ("observe", 7.0),
                                                         ("observe", 5.0)]
    calls.clear()
    c.records_in, c.busy_s = 8, 0.25
    ex.export(c, rec)  # deltas only; no new latency samples
    assert sorted(calls) == [("inc", 0.25, "s"), ("inc", 3, "s")]


def _rank_sum(comm, block):
    return comm.allreduce(block.sum())


@pytest.mark.slow  # a gang, then one report interval of Ray (10 s): ~25 s
def test_an_mpi_stages_timings_reach_prometheus(ray_session):
    from rayflow.hpc import BlockDataset, Gang, mpimap

    name = f"stage-{uuid.uuid4().hex[:8]}"
    with Gang(2, rank_num_cpus=0.25, gang_timeout_s=60) as g:
        out = mpimap(_rank_sum, BlockDataset.from_numpy(np.arange(8.0), 2), gang=g, name=name)
    info = out.stage
    assert out.blocks() == [28.0, 28.0]
    job = ray_session.get_runtime_context().get_job_id()
    got = _wait_for(ray_session, job, lambda s: ("ray_rayflow_stage_attempts_total", name,
                                                 "all") in s)
    assert got[("ray_rayflow_stage_attempts_total", name, "all")] == info.attempts == 1
    assert got[("ray_rayflow_stage_seconds_count", name, "all")] == 1
    for r in range(2):
        assert got[("ray_rayflow_stage_rank_seconds", name, str(r))] == pytest.approx(
            info.rank_wall_s[r])
        assert got[("ray_rayflow_stage_rank_maxrss_bytes", name, str(r))] == \
            info.rank_maxrss_bytes[r]
