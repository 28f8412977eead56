"""The checkpoint coordinator's actor: the pure :class:`rayflow.checkpoint.Coordinator` plus
a timer thread that carries out its actions on the step hosts."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import ray

from rayflow.checkpoint import Abort, Complete, CompletedCheckpoint, Coordinator, Trigger

log = logging.getLogger(__name__)


# (Ray's overloads of remote() omit max_concurrency)
@ray.remote(num_cpus=0, max_concurrency=4, max_restarts=0)  # type: ignore[call-overload]
class CoordinatorActor:
    """Runs the pure coordinator for a job: triggers checkpoints at the sources, collects
    acks, writes each completed checkpoint to the durable store *before* it tells the sinks
    to commit (so a commit never stands on a checkpoint that could be lost), and keeps the
    split enumerators of file sources.

    If this actor dies, the job's supervisor starts a new one from the store's newest
    checkpoint: nothing here is needed that the store does not hold.
    """

    def __init__(self, interval_s: float, timeout_s: float, tick_s: float = 0.05,
                 store_root: str | None = None, meta: dict | None = None,
                 durable_positions: bool = False, min_pause_s: float = 0.0):
        from rayflow._log import worker_logging
        from rayflow.checkpoint_store import CheckpointStore

        worker_logging()  # its log lines reach Ray's worker logs
        self.interval_s, self.timeout_s, self.tick_s = interval_s, timeout_s, tick_s
        self.min_pause_s = min_pause_s
        self.lock = threading.Lock()
        self.core: Coordinator | None = None
        self.sources: dict[tuple[str, int], Any] = {}
        self.hosts: dict[tuple[str, int], Any] = {}
        self.positions: dict[tuple[str, int], Any] = {}
        self.history: list[dict] = []
        self.outcomes: dict[int, str] = {}  # checkpoint id -> "completed" or "aborted: why"
        self.restore_point: dict = {"latest": None, "next_id": 1}
        self.error: str | None = None  # a checkpoint that could not be made durable
        self.store = CheckpointStore(store_root) if store_root else None
        self.meta = dict(meta or {})
        self.durable_positions = durable_positions and self.store is not None
        self._running = True
        self.paused = False  # a failover region is restarting: no checkpoint starts
        self.enumerators: dict[str, Any] = {}  # source step -> SplitEnumerator
        # task -> the attempt (start or recovery) that built its running instance: a call
        # from an older instance (killed, but its calls may still be on the way) is dropped
        self.attempts: dict[tuple[str, int], int] = {}
        self.split_lock = threading.Lock()  # not self.lock: a checkpoint must not delay reads
        self._ticker = threading.Thread(target=self._loop, daemon=True)
        self._ticker.start()

    def attach(self, hosts: dict, sources: list, first_id: int,
               latest: CompletedCheckpoint | None, positions: dict | None = None) -> bool:
        """(Re)start coordinating a set of hosts, after a start or a recovery."""
        with self.lock:
            if self.core is not None:
                self.history.extend(self.core.history)
            self.core = Coordinator(set(hosts), self.interval_s, self.timeout_s, first_id,
                                    latest, sources=set(sources),
                                    min_pause_s=self.min_pause_s)
            self.hosts = dict(hosts)
            self.sources = {k: hosts[k] for k in sources}
            self.restore_point = {"latest": latest, "next_id": first_id}
            self.paused = False
            if positions:
                self.positions.update(positions)
        return True

    def restart_region(self, tasks: list) -> dict | None:
        """A failover region (``tasks``) restarts from the last completed checkpoint while
        the other tasks go on: abort what is in flight, start no checkpoint until
        :meth:`resume_region` hands over the region's new hosts, and return what the region
        restores (as :meth:`detach` does). None when detached: the whole job recovers."""
        with self.lock:
            if self.core is None:
                return None
            self._do(self.core.restart(set(map(tuple, tasks)), time.time()))
            self.paused = True
            self.restore_point = {"latest": self.core.latest, "next_id": self.core.next_id}
            return {**self.restore_point, "positions": dict(self.positions)}

    def resume_region(self, hosts: dict, sources: list) -> bool:
        """The restarted region's hosts are up: coordinate them with the others."""
        with self.lock:
            if self.core is None:
                return False
            self.hosts.update(hosts)
            for k in hosts:
                self.sources.pop(k, None)
            self.sources.update({k: hosts[k] for k in sources})
            self.paused = False
            return True

    def detach(self) -> dict:
        """Stop coordinating (a failure): abort what is in flight; return what to restore."""
        with self.lock:
            if self.core is None:  # detached already (a failure during the recovery)
                return {**self.restore_point, "positions": dict(self.positions)}
            self._do(self.core.failure(time.time()))
            self.restore_point = {"latest": self.core.latest, "next_id": self.core.next_id}
            out = {**self.restore_point, "positions": dict(self.positions)}
            self.history.extend(self.core.history)
            self.core.history = []
            self.core = None
            self.hosts, self.sources = {}, {}
            return out

    def _stale(self, task: tuple[str, int], attempt: int, what: str) -> bool:
        """Whether a call comes from an instance that a later attempt replaced."""
        current = self.attempts.get(tuple(task), 0)  # type: ignore[arg-type]
        if attempt < current:
            log.debug("dropped %s from %s of attempt %d (attempt %d runs)", what, task,
                      attempt, current)
            return True
        return False

    def ack(self, checkpoint_id: int, task: tuple[str, int], handle: Any,
            attempt: int = 0) -> None:
        with self.lock:
            if self.core is not None and not self._stale(task, attempt, "an ack"):
                self._do(self.core.ack(checkpoint_id, task, handle, time.time()))

    def task_finished(self, task: tuple[str, int], handle: Any = None,
                      drained: bool = True, attempt: int = 0) -> None:
        with self.lock:
            if self.core is not None and not self._stale(task, attempt, "an end of task"):
                self._do(self.core.task_finished(task, time.time(), handle, drained))

    def start_attempt(self, attempt: int, tasks: list, enumerators: dict[str, Any],
                      merge: bool = False) -> bool:
        """Attempt ``attempt`` (a start, a recovery) builds new instances of ``tasks``:
        from now on, calls from their older instances are dropped. ``enumerators``: the
        split enumerators of the source steps (replaced at each attempt; with ``merge``,
        only those of the steps given: a region's restart)."""
        with self.lock, self.split_lock:
            self.attempts.update({tuple(t): attempt for t in tasks})
            self.enumerators = {**self.enumerators, **enumerators} if merge else \
                dict(enumerators)
        return True

    def assign_splits(self, step_id: str, instance: int, attempt: int = 0) -> list | None:
        """A source reader asks its step's enumerator for more splits. A reader that a
        later attempt replaced gets none: what it took would be lost with it."""
        with self.split_lock:
            if self._stale((step_id, instance), attempt, "a request for splits"):
                return []
            return self.enumerators[step_id].assign(instance)

    def position(self, task: tuple[str, int], pos: Any, attempt: int = 0) -> None:
        """At-most-once sources record their position before emitting (durably, when the
        job has a store: a new coordinator must never replay what already left)."""
        if self._stale(task, attempt, "a position"):
            return
        self.positions[task] = pos
        if self.durable_positions:
            self.store.write_position(task, pos)  # type: ignore[union-attr]  # (durable: a store)

    def request_savepoint(self) -> int | str | None:
        """Start a savepoint now: its id; None while another checkpoint is in flight (ask
        again); a string when none can be taken."""
        with self.lock:
            core = self.core
            if core is None or self.paused:
                return None  # failing or recovering: the supervisor attaches new tasks
            if core.done:
                return "the job has finished"
            acts = core.trigger(time.time(), savepoint=True)
            if not acts:  # one in flight, or the last tasks finishing (the final follows)
                return None
            cid = core.next_id - 1
            self._do(acts)
            return cid

    def outcome(self, checkpoint_id: int) -> str | None:
        """``completed``, ``aborted: why``, or None while in flight."""
        with self.lock:
            return self.outcomes.get(checkpoint_id)

    def health(self) -> str | None:
        """Why the job cannot go on (a checkpoint store that fails), or None."""
        return self.error

    def exit(self) -> None:
        """End this actor the clean way, as a step actor does: a call sent to an actor that
        ``ray.kill`` is taking down could crash its worker on the way (Ray printed a C++
        ``bad_optional_access`` trace from a coordinator polled while it died, at the end of
        ``rayflow demo``)."""
        self._running = False
        # the ticking thread ends first: a thread of ours still alive while the process
        # shut down left it hanging after Ray's shutdown, alive and holding its memory
        # (3 coordinators of 80 jobs, before)
        self._ticker.join(timeout=5 * self.tick_s + 1.0)
        ray.actor.exit_actor()

    def done(self) -> bool:
        with self.lock:
            return self.core is not None and self.core.done

    def unfinished(self) -> list:
        """The tasks that have not reported their end (the first 10)."""
        with self.lock:
            core = self.core
            return [] if core is None else sorted(core.tasks - set(core.finished))[:10]

    def missing_acks(self) -> list:
        with self.lock:
            core = self.core
            if core is None or core.pending is None:
                return []
            return sorted(set(core.tasks) - set(core.pending.acks))[:10]

    def latest(self) -> CompletedCheckpoint | None:
        with self.lock:
            return None if self.core is None else self.core.latest

    def checkpoints(self) -> list[dict]:
        with self.lock:
            return self.history + (self.core.history if self.core else [])

    def _loop(self) -> None:
        from rayflow.checkpoint_store import LEASE_S

        renewed = 0.0
        while self._running:
            time.sleep(self.tick_s)
            if self.store is not None and time.monotonic() - renewed >= LEASE_S:
                renewed = time.monotonic()
                try:
                    self.store.renew_lease()
                except Exception:  # noqa: BLE001 - removed after the job finished
                    pass
            with self.lock:
                if self.core is not None and not self.paused:
                    self._do(self.core.tick(time.time()))

    def _do(self, actions: list) -> None:
        for act in actions:
            if isinstance(act, Trigger):
                live = self.core.live_sources if self.core is not None else set()
                for k, h in self.sources.items():
                    if k in live:
                        h.trigger_checkpoint.remote(act.checkpoint_id, act.stop_after)
            elif isinstance(act, Complete):
                chk = self.core.latest if self.core is not None else None
                if self.store is not None and chk is not None and \
                        chk.checkpoint_id == act.checkpoint_id:
                    try:
                        self.store.write(chk, self.meta)
                    except Exception as exc:  # noqa: BLE001 - not durable: not complete
                        log.error("checkpoint %d could not be written to %s: %s",
                                  act.checkpoint_id, self.store.root, exc)
                        self.outcomes[act.checkpoint_id] = f"aborted: not durable: {exc}"
                        self.error = (f"checkpoint {act.checkpoint_id} could not be written "
                                      f"to {self.store.root}: {type(exc).__name__}: {exc}")
                        continue
                log.debug("checkpoint %d complete%s", act.checkpoint_id,
                         " (final)" if chk is not None and chk.final else "")
                self.outcomes[act.checkpoint_id] = "completed"
                # one call per actor: chained instances share one, which notifies them all
                for h in {h._actor_id: h for h in self.hosts.values()}.values():
                    h.notify_complete.remote(act.checkpoint_id, act.final)
            elif isinstance(act, Abort):
                log.info("checkpoint %d aborted: %s", act.checkpoint_id, act.reason)
                self.outcomes[act.checkpoint_id] = f"aborted: {act.reason}"


class SplitClient:
    """``ctx.splits`` of a source reader under the runtime: asks the step's enumerator,
    which lives in the coordinator actor, without blocking (a Future of its answer)."""

    def __init__(self, coordinator: Any, step_id: str, instance: int, attempt: int = 0):
        self.coordinator, self.step_id, self.instance = coordinator, step_id, instance
        self.attempt = attempt

    def request(self) -> _Reply:
        return _Reply(self.coordinator.assign_splits.remote(self.step_id, self.instance,
                                                            self.attempt))


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
