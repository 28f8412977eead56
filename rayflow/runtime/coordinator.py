"""The checkpoint coordinator's actor: the pure :class:`rayflow.checkpoint.Coordinator` plus
a timer thread that carries out its actions on the step hosts."""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import ray

from rayflow.checkpoint import Abort, Complete, CompletedCheckpoint, Coordinator, Trigger


@ray.remote(num_cpus=0, max_concurrency=4)
class CoordinatorActor:
    def __init__(self, interval_s: float, timeout_s: float, tick_s: float = 0.05):
        self.interval_s, self.timeout_s, self.tick_s = interval_s, timeout_s, tick_s
        self.lock = threading.Lock()
        self.core: Coordinator | None = None
        self.sources: dict[tuple[str, int], Any] = {}
        self.hosts: dict[tuple[str, int], Any] = {}
        self.positions: dict[tuple[str, int], Any] = {}
        self.history: list[dict] = []
        self._stop_waiters: dict[int, threading.Event] = {}
        self._aborted: dict[int, str] = {}  # savepoints aborted, and why
        self._running = True
        self.enumerators: dict[str, Any] = {}  # source step -> SplitEnumerator
        self.split_lock = threading.Lock()  # not self.lock: a checkpoint must not delay reads
        threading.Thread(target=self._loop, daemon=True).start()

    def attach(self, hosts: dict, sources: list, first_id: int,
               latest: CompletedCheckpoint | None) -> bool:
        """(Re)start coordinating a set of hosts, after a start or a recovery."""
        with self.lock:
            if self.core is not None:
                self.history.extend(self.core.history)
            self.core = Coordinator(set(hosts), self.interval_s, self.timeout_s, first_id, latest)
            self.hosts = dict(hosts)
            self.sources = {k: hosts[k] for k in sources}
        return True

    def detach(self) -> dict:
        """Stop coordinating (a failure): abort what is in flight; return what to restore."""
        with self.lock:
            if self.core is None:
                return {"latest": None, "next_id": 1, "positions": dict(self.positions)}
            self._do(self.core.failure(time.time()))  # a savepoint waiting gets its answer
            out = {"latest": self.core.latest, "next_id": self.core.next_id,
                   "positions": dict(self.positions)}
            self.history.extend(self.core.history)
            self.core.history = []
            self.core = None
            self.hosts, self.sources = {}, {}
            return out

    def ack(self, checkpoint_id: int, task: tuple[str, int], handle: Any) -> None:
        with self.lock:
            if self.core is not None:
                self._do(self.core.ack(checkpoint_id, task, handle, time.time()))

    def task_finished(self, task: tuple[str, int]) -> None:
        with self.lock:
            if self.core is not None:
                self._do(self.core.task_finished(task, time.time()))

    def set_enumerators(self, enumerators: dict[str, Any]) -> bool:
        """The split enumerators of the source steps (replaced at each start or recovery)."""
        with self.split_lock:
            self.enumerators = dict(enumerators)
        return True

    def assign_splits(self, step_id: str, instance: int) -> list | None:
        """A source reader asks its step's enumerator for more splits."""
        with self.split_lock:
            return self.enumerators[step_id].assign(instance)

    def position(self, task: tuple[str, int], pos: Any) -> None:
        """At-most-once sources record their position before emitting."""
        self.positions[task] = pos

    def savepoint(self, stop_after: bool, timeout_s: float) -> int | str:
        """Trigger a checkpoint now (sources stop after it when ``stop_after``); wait for it.
        Returns its id, or why it did not complete."""
        from rayflow.checkpoint import _Pending

        deadline = time.monotonic() + timeout_s
        while True:  # let a periodic checkpoint in flight finish first
            with self.lock:
                core = self.core
                if core is None:
                    return "no tasks are attached (the job is failing or recovering)"
                if core.finished:
                    return f"tasks have finished: {sorted(core.finished)[:10]}"
                if core.pending is None:
                    cid = core.next_id
                    core.next_id += 1
                    core.pending = _Pending(cid, time.time())
                    done = self._stop_waiters[cid] = threading.Event()
                    for h in self.sources.values():
                        h.trigger_checkpoint.remote(cid, stop_after)
                    break
                if time.monotonic() > deadline:
                    return (f"checkpoint {core.pending.checkpoint_id} was still in flight, "
                            f"without acks from {self._missing(core)}")
            time.sleep(0.02)
        if done.wait(timeout_s):
            reason = self._aborted.pop(cid, None)
            return cid if reason is None else f"savepoint {cid} aborted: {reason}"
        with self.lock:
            core = self.core
            missing = self._missing(core) if core is not None and core.pending is not None \
                else []
        return f"savepoint {cid} not complete after {timeout_s:.0f} s; no acks from {missing}"

    @staticmethod
    def _missing(core: Coordinator) -> list:
        return sorted(set(core.tasks) - set(core.pending.acks))[:10]

    def latest(self) -> CompletedCheckpoint | None:
        with self.lock:
            return None if self.core is None else self.core.latest

    def checkpoints(self) -> list[dict]:
        with self.lock:
            return self.history + (self.core.history if self.core else [])

    def shutdown(self) -> None:
        self._running = False

    def _loop(self) -> None:
        while self._running:
            time.sleep(self.tick_s)
            with self.lock:
                if self.core is not None:
                    self._do(self.core.tick(time.time()))

    def _do(self, actions: list) -> None:
        for act in actions:
            if isinstance(act, Trigger):
                for h in self.sources.values():
                    h.trigger_checkpoint.remote(act.checkpoint_id)
            elif isinstance(act, Complete):
                # one call per actor: chained instances share one, which notifies them all
                for h in {h._actor_id: h for h in self.hosts.values()}.values():
                    h.notify_complete.remote(act.checkpoint_id)
                ev = self._stop_waiters.pop(act.checkpoint_id, None)
                if ev is not None:
                    ev.set()
            elif isinstance(act, Abort):
                ev = self._stop_waiters.pop(act.checkpoint_id, None)
                if ev is not None:  # a savepoint waiting for it: it has its answer
                    self._aborted[act.checkpoint_id] = act.reason
                    ev.set()


class SplitClient:
    """``ctx.splits`` of a source reader under the runtime: asks the step's enumerator,
    which lives in the coordinator actor, without blocking (a Future of its answer)."""

    def __init__(self, coordinator: Any, step_id: str, instance: int):
        self.coordinator, self.step_id, self.instance = coordinator, step_id, instance

    def request(self) -> _Reply:
        return _Reply(self.coordinator.assign_splits.remote(self.step_id, self.instance))


class _Reply:
    """The part of a Future's API a reader uses, over an ObjectRef (``ObjectRef.future()``
    took 0.4-0.9 ms to report a reply that had long arrived; ``ray.get`` takes ~0.1 ms)."""

    def __init__(self, ref: Any):
        self.ref = ref

    def result(self, timeout: float | None = None) -> Any:
        try:
            return ray.get(self.ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise FutureTimeout() from None
