"""The Nexmark benchmark's CPU meter counts the job's actor processes, not Ray's agents or the
idle workers Ray keeps in (and starts ahead for) its pool."""

import importlib.util
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_nexmark.py"


def _bench():
    sys.path.insert(0, str(BENCH.parent))  # (the benchmark imports its siblings)
    try:
        spec = importlib.util.spec_from_file_location("bench_nexmark_meter", BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH.parent))
    return module


def test_the_meter_counts_actor_processes_only():
    is_actor_title = _bench().is_actor_title
    # an actor's title, while idle and while it runs a method
    for title in ("ray::StepHost", "ray::StepHost.run", "ray::CoordinatorActor.exit",
                  "ray::StepHost" + " " * 30):  # (Ray pads the titles with spaces)
        assert is_actor_title(title), title
    # Ray's agents, an idle pooled worker, and a worker still starting (its interpreter)
    for title in ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE",
                  "ray::IDLE" + " " * 30, "/work/.venv/bin/python -u default_worker.py", "",
                  "   "):
        assert not is_actor_title(title), title


def test_the_meter_finds_a_running_job_s_actors_and_leaves_idle_workers_out(ray_session):
    """On the real Ray: while a job runs, the meter's processes are this one and the job's
    step hosts and coordinator; the idle workers beside them are not among them."""
    import psutil

    import rayflow as rf

    bench = _bench()
    flow = rf.Dataflow(f"meter-{time.time_ns()}")
    flow.source("in", rf.MemorySource(list(range(10)))).map(
        "slow", lambda x: time.sleep(0.3) or x).sink("out", rf.DiscardSink())
    job = flow.run(background=True)
    try:
        meter = bench.CpuMeter()
        procs = meter._procs()
        titles = {" ".join(p.cmdline()) for p, _ in procs[1:]}
        # each with its title as the peak's breakdown names it
        assert {t for _, t in procs[1:]} <= {t.split()[0] for t in titles}
        assert any(t.startswith("ray::StepHost") for t in titles), titles
        assert any(t.startswith("ray::CoordinatorActor") for t in titles), titles
        everything = {" ".join(p.cmdline()) for p in meter._raylet.children(recursive=True)
                      if p.is_running()}
        assert not any(t.startswith("ray::IDLE") for t in titles)
        assert everything - titles  # the agents and idle workers: present, not counted
        assert procs[0][0].pid == psutil.Process().pid and procs[0][1] == "driver"
        # the peak's breakdown: the job's processes, by title, pid and MiB (not the driver)
        meter._sample(first=True)
        assert meter.peak_rss > 0
        assert {t for t, _, _ in meter.peak_procs} >= {"ray::CoordinatorActor"}
        assert all(pid != psutil.Process().pid and mib > 0
                   for _, pid, mib in meter.peak_procs)
        assert round(meter.peak_rss / 2**20) == pytest.approx(
            sum(mib for _, _, mib in meter.peak_procs), abs=len(meter.peak_procs))
    finally:
        job.wait(120)


def test_the_meter_leaves_its_own_sampling_out(ray_session):
    """The meter samples from a thread of this process, which it counts: that thread's CPU
    is taken off, so a process that only sleeps meters (about) none, however busy the
    sampling is."""
    import psutil

    bench = _bench()
    me = psutil.Process()

    class Busy(bench.CpuMeter):
        spent = 0.0  # CPU the samples took, as this test counts it

        def _procs(self):
            return [(me, "driver")]

        def _sample(self, first=False):
            t0 = time.thread_time()
            while time.thread_time() < t0 + 0.002:  # a sample that costs 2 ms of CPU
                pass
            super()._sample(first)
            Busy.spent += time.thread_time() - t0

    with Busy(every_s=0.001) as meter:
        time.sleep(1.0)
    # the samples were busy (about 0.6 s of CPU on an idle machine, less on a loaded one);
    # what is left is this process's other threads (Ray's) and psutil's 10 ms ticks, far
    # below what the sampling cost
    assert Busy.spent > 0.1, Busy.spent
    assert meter.cpu_s < 0.03 + Busy.spent / 4, (meter.cpu_s, Busy.spent)
