"""Warm gangs: the gangs of finished stages, kept for a while and reused by the next stage.

Usage: ``g = warm_gangs.acquire(Gang(4))`` ... ``warm_gangs.release(g)`` (``mpimap`` does both)

Starting a gang (placement group, rank actors, channel setup) took 2.3-2.4 s here, running a
stage on a started one 7.5 ms. A stage without an explicit ``gang=`` therefore hands its gang
back to this pool instead of shutting it down, and the next stage with the same shape (size,
backend, strategy, CPUs and BLAS threads per rank) takes it. A pooled gang still holds its
placement group, so it never stays longer than ``hpc.warm_gang_idle_s`` (default 10 s:
an idle node is not pinned for long, and the autoscaler can remove it), and a stage that
needs CPUs held by idle gangs shuts them down before it places its own.
"""

from __future__ import annotations

import threading
import time

import ray

from rayflow.hpc.gang import Gang

#: Idle gangs kept at most (the oldest goes first).
MAX_IDLE_GANGS = 4


def _shape(g: Gang) -> tuple:
    return (g.size, g.backend, g.strategy, g._num_cpus, g.blas_threads)


def _session() -> str:
    # pooled actor handles belong to one Ray session (a new ray.init() starts another)
    return ray.get_runtime_context().get_job_id()


class WarmGangs:
    """A small pool of started, idle gangs, per shape, each with an idle deadline."""

    def __init__(self, max_idle: int = MAX_IDLE_GANGS):
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[tuple[float, str, Gang]] = []  # (expires at, session, gang)
        self._timer: threading.Timer | None = None
        self.hits = 0

    def acquire(self, fresh: Gang) -> Gang:
        """A started idle gang shaped like ``fresh`` (not started), or ``fresh`` itself.

        On a miss, idle gangs are shut down while the cluster lacks the CPUs ``fresh`` asks for.
        """
        session = _session()
        with self._lock:
            self._idle = [e for e in self._idle if e[1] == session]  # stale handles: dropped
            for i, (_, _, g) in enumerate(self._idle):
                if _shape(g) == _shape(fresh) and g.started:
                    del self._idle[i]
                    self.hits += 1
                    return g
            need = fresh.size * fresh.bundle["CPU"]
            evict = []
            if self._idle and ray.available_resources().get("CPU", 0.0) < need:
                evict, self._idle = self._idle, []
        for _, _, g in evict:
            g.shutdown()
        return fresh

    def release(self, g: Gang, idle_s: float) -> None:
        """Keep ``g`` for ``idle_s`` seconds (shut it down now if ``idle_s`` is 0 or it broke)."""
        if idle_s <= 0 or not g.started:
            g.shutdown()
            return
        with self._lock:
            self._idle.append((time.monotonic() + idle_s, _session(), g))
            extra = self._idle[: max(0, len(self._idle) - self.max_idle)]
            del self._idle[: len(extra)]
            self._arm()
        for _, _, old in extra:
            old.shutdown()

    def clear(self) -> None:
        """Shut every idle gang down now."""
        with self._lock:
            idle, self._idle = self._idle, []
        for _, _, g in idle:
            g.shutdown()

    def idle(self) -> list[Gang]:
        """The gangs waiting for a stage now."""
        with self._lock:
            return [g for _, _, g in self._idle]

    def _arm(self) -> None:
        # one timer for the earliest deadline (called with the lock held)
        if self._timer is not None:
            self._timer.cancel()
        if self._idle:
            wait = max(0.0, min(e[0] for e in self._idle) - time.monotonic())
            self._timer = threading.Timer(wait + 0.01, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            gone = [e for e in self._idle if e[0] <= now]
            self._idle = [e for e in self._idle if e[0] > now]
            self._arm()
        for _, _, g in gone:
            try:
                g.shutdown()
            except Exception:  # noqa: BLE001 - Ray already shut down: the actors are gone
                pass


#: The driver's pool, used by ``mpimap`` for stages without an explicit gang.
warm_gangs = WarmGangs()

