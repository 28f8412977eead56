"""How a job that ended well takes its actors down: each exits by itself, and only one that
does not within the grace period is killed (a second exit signal can leave a threaded
actor's process stuck in its shutdown)."""

from __future__ import annotations

import time

import psutil
import pytest


def _gone(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_only_an_actor_that_does_not_exit_in_time_is_killed(ray_session):
    import os
    import threading

    import ray

    from rayflow.runtime.launcher import exit_or_kill

    @ray.remote(num_cpus=0, max_concurrency=4)
    class Polite:
        def __init__(self):
            self.running = True
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()

        def _tick(self):
            while self.running:
                time.sleep(0.05)

        def pid(self):
            return os.getpid()

        def exit(self):
            self.running = False
            self.ticker.join()
            ray.actor.exit_actor()

    @ray.remote(num_cpus=0, max_concurrency=4)
    class Stubborn:
        def pid(self):
            return os.getpid()

        def exit(self):
            time.sleep(600)  # never gets round to exiting

    polite, stubborn = Polite.remote(), Stubborn.remote()
    pids = ray.get([polite.pid.remote(), stubborn.pid.remote()])
    t0 = time.monotonic()
    killed = exit_or_kill([polite, stubborn], grace_s=2.0)
    assert killed == [stubborn]
    assert 2.0 <= time.monotonic() - t0 < 40.0
    assert all(_gone(pid) for pid in pids)
    for h in (polite, stubborn):
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(h.pid.remote(), timeout=30)


def test_a_coordinator_that_exits_leaves_no_process_behind(ray_session):
    """Its ticking thread ends before Ray shuts the process down (with the thread still
    running, 3 coordinator processes of 80 jobs stayed alive after their job)."""
    import ray

    from rayflow.runtime.coordinator import CoordinatorActor
    from rayflow.runtime.launcher import exit_or_kill

    coords = [CoordinatorActor.remote(1.0, 10.0, 0.01) for _ in range(3)]
    pids = ray.get([c.__ray_call__.remote(lambda self: __import__("os").getpid())
                    for c in coords])
    assert exit_or_kill(coords, grace_s=10.0) == []
    assert all(_gone(pid) for pid in pids)
