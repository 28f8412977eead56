"""The job's supervisor: a driver thread that watches the instances, recovers failures from
the last completed checkpoint (all of them, or one failover region), and ends the job.

:class:`Supervisor` sits between :class:`~rayflow.runtime.launcher.Launcher` (which builds
and tears down the actors) and :class:`~rayflow.runtime.job.Job` (the user's handle). It
holds what a run has been through: its state, recoveries, checkpoints and the instances'
final reports.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
from typing import Any

from rayflow.config import RayflowConfig
from rayflow.dataflow import Dataflow
from rayflow.errors import StepError
from rayflow.runtime.channel import unwrap
from rayflow.runtime.launcher import Launcher, kill

POLL_S = 0.5
log = logging.getLogger(__name__)


class Supervisor(Launcher):
    """Failure handling and the end of a run, over the actors the launcher made."""

    def __init__(self, flow: Dataflow, config: RayflowConfig):
        super().__init__(flow, config)
        self.state = "CREATED"
        self.error: BaseException | None = None
        self._finals: dict[tuple[str, int], dict] = {}
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.recoveries: list[dict] = []
        self._checkpoints: list[dict] = []
        self._latest: Any = None
        self._ended = threading.Event()  # the supervisor is done (finished, failed, cancelled)
        self._cancelled = False
        self._stop_requested = False
        self._sink_waits: dict[tuple[str, int], tuple[Any, Any]] = {}  # key -> (actor, ref)

    def _recover(self, cause: BaseException) -> None:
        """Restore every instance from the last completed checkpoint and go on. Re-entrant:
        if it fails (another actor died meanwhile), the supervisor calls it again, from the
        same checkpoint, until the restart budget is spent. If the coordinator is gone, a
        new one starts from the durable store."""
        import ray

        from rayflow.checkpoint_store import CheckpointStore

        t0 = time.time()
        self.recoveries.append({
            "cause": f"{type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''}",
            "restored_checkpoint": None, "restart_s": None, "at": t0,
        })
        log.info("job %r: recovering (%d of at most %d) after %s", self.flow.name,
                 len(self.recoveries), self.config.checkpoint.max_restarts,
                 self.recoveries[-1]["cause"])
        region = self._failed_region()
        if region is not None and self._recover_region(region, t0):
            return
        restore = None
        try:
            restore = ray.get(self.coordinator.detach.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - the coordinator is gone
            log.info("job %r: the coordinator is gone; starting a new one from %s",
                     self.flow.name, self.store_root)
        # every old instance must be gone before the new ones start (teardown waits for
        # that): an old sink that is still alive could commit an epoch the new sink commits too
        self._teardown(keep_coordinator=restore is not None)
        store = CheckpointStore(self.store_root)  # type: ignore[arg-type]  # (set by start)
        if restore is None:
            restore = {"latest": None, "next_id": 1, "positions": store.positions()}
            self.coordinator = self._new_coordinator()
        # The newest checkpoint anyone knows: a coordinator started by a recovery that failed
        # before the new tasks were attached to it knows none yet (restoring from nothing
        # would run everything again, after the sinks had committed part of it), and a
        # resumed job's first checkpoint is not in its own store yet.
        known = _newest(restore["latest"], self._latest)
        latest = _newest(known, store.latest(newer_than=known.checkpoint_id if known else None))
        restore["latest"] = latest
        restore["next_id"] = max(restore["next_id"], (latest.checkpoint_id if latest else 0) + 1)
        if latest is not None:
            self._latest = latest
        at_most_once = self.config.checkpoint.processing_guarantee == "at_most_once"
        self.recoveries[-1]["restored_checkpoint"] = latest.checkpoint_id if latest else None
        self._spawn(latest, restore["next_id"], restore["positions"] if at_most_once else {},
                    fresh_state=at_most_once, recovering=True)
        if self._stop_requested:  # a graceful stop asked before the failure still holds
            ray.get([self.hosts[k].stop.remote() for k in self._runs.values()])
        self.recoveries[-1]["restart_s"] = round(time.time() - t0, 3)
        log.info("job %r: recovered from checkpoint %s in %.2f s", self.flow.name,
                 self.recoveries[-1]["restored_checkpoint"], time.time() - t0)

    def _failed_region(self) -> frozenset | None:
        """The failover region to restart: the regions of the instances whose actor died,
        when that is not every instance; None for a full restart (the strategy says so, the
        coordinator is gone, or which actors died cannot be told)."""
        import ray

        if self.config.checkpoint.failover_strategy != "region" or not self.hosts or \
                self.coordinator is None:
            return None
        from rayflow.runtime.plan import regions

        parts = regions(self.plan, self._coupled)  # readers sharing an enumerator: one region
        if len(parts) < 2:
            return None
        probes = {h._actor_id: (h, h.__ray_ready__.remote()) for h in self.actors()}
        probes["coordinator"] = (None, self.coordinator.__ray_ready__.remote())
        dead: set = set()
        for aid, (_, ref) in probes.items():
            try:
                ray.get(ref, timeout=10)
            except ray.exceptions.RayActorError:
                if aid == "coordinator":
                    return None
                dead.add(aid)
            except Exception:  # noqa: BLE001 - unresponsive: cannot tell, restart all
                return None
        failed = {k for k, h in self.hosts.items() if h._actor_id in dead}
        if not failed:
            return None
        region = frozenset().union(*(r for r in parts if r & failed))
        return None if len(region) == len(self.hosts) else region

    def _recover_region(self, region: frozenset, t0: float) -> bool:
        """Restart only ``region`` from the last completed checkpoint while the rest of the
        job runs on (Flink's region failover): no record crosses between regions, so each
        region's progress since the checkpoint stands on its own. False if the coordinator
        cannot take part (the caller then restarts everything)."""
        import ray

        try:
            restore = ray.get(self.coordinator.restart_region.remote(sorted(region)),
                              timeout=30)
        except Exception:  # noqa: BLE001 - the coordinator is gone
            return False
        if restore is None:
            return False
        kill(list({h._actor_id: h for k, h in self.hosts.items() if k in region}.values()))
        for k in region:
            self.hosts.pop(k, None)
        latest = restore["latest"]
        if latest is not None:
            self._latest = latest
        at_most_once = self.config.checkpoint.processing_guarantee == "at_most_once"
        rec = self.recoveries[-1]
        rec["restored_checkpoint"] = latest.checkpoint_id if latest else None
        rec["region"] = sorted(region)
        self._spawn(latest, restore["next_id"], restore["positions"] if at_most_once else {},
                    fresh_state=at_most_once, recovering=True, only=region)
        if self._stop_requested:
            ray.get([self.hosts[k].stop.remote() for k in self._runs.values() if k in region])
        rec["restart_s"] = round(time.time() - t0, 3)
        log.info("job %r: restarted %d of %d instances (their failover region) from "
                 "checkpoint %s in %.2f s", self.flow.name, len(region),
                 sum(1 for _ in self.plan.instances()),
                 rec["restored_checkpoint"], time.time() - t0)
        return True

    def _supervise(self) -> None:
        """The job's own watcher (a driver thread): recovers failures as they happen, and
        ends the job when its sinks have finished."""
        try:
            failure: BaseException | None = None
            while True:
                if failure is None:
                    failure = self._watch()
                    if failure is None:
                        break
                if self._cancelled:
                    return
                if isinstance(failure, StepError) or \
                        len(self.recoveries) >= self.config.checkpoint.max_restarts:
                    self._finish_failed(failure)
                try:
                    self._recover(failure)
                    failure = None
                except StepError as exc:
                    self._finish_failed(exc)
                except Exception as exc:  # noqa: BLE001 - a failure during the recovery
                    failure = unwrap(exc)
                    if self._cancelled:
                        return
            if self._cancelled:
                return
            self._await_final_checkpoint()
            self._collect()
            self._finish_clean()
        except BaseException as exc:  # noqa: BLE001 - kept for wait()
            if self.error is None and not self._cancelled:
                self.error = exc
                self.state = "FAILED"
                try:
                    self._teardown()
                except Exception:  # noqa: BLE001
                    pass
        finally:
            self._ended.set()

    def _watch(self) -> BaseException | None:
        """Block until the sinks have finished (None) or an instance failed (its error)."""
        import ray

        sinks = [k for k in self.hosts if self.flow.step(k[0]).kind == "sink"]
        # one blocking wait per sink instance and actor: a region failover keeps the other
        # sinks' actors, and a second wait would hold a second of their wait threads
        for k in sinks:
            aid = self.hosts[k]._actor_id
            if self._sink_waits.get(k, (None,))[0] != aid:
                self._sink_waits[k] = (aid, self.hosts[k].wait_done.remote(None, k))
        pending = list(self._runs) + [self._sink_waits[k][1] for k in sinks]
        failure = None
        while pending and failure is None and not self._cancelled:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in ready:
                try:
                    got = ray.get(ref)
                except Exception as exc:  # noqa: BLE001
                    failure = unwrap(exc)
                    break
                if isinstance(got, BaseException):  # a sink that ended with an error
                    failure = unwrap(got)
                    break
            if failure is None and pending:
                failure = self._poll_failure()
        if failure is not None and not isinstance(failure, StepError) and \
                self._sinks_finished(sinks):
            return None  # an instance that died after its sinks finished changes nothing
        return failure

    def _await_final_checkpoint(self, limit_s: float = 30.0) -> bool:
        """Wait until the coordinator holds the final checkpoint (every task's final state).
        A task tells the coordinator of its end without waiting, after it passed the end of
        stream on: the sinks can be done while the last reports are still on their way, and
        the final checkpoint, which stands in for an instance lost at the end, would be
        missing. It follows within milliseconds; ``limit_s`` bounds the wait should a task
        never report (its actor died on the way)."""
        import ray

        deadline = time.monotonic() + limit_s
        while True:
            try:
                if ray.get(self.coordinator.done.remote(), timeout=limit_s):
                    return True
            except Exception:  # noqa: BLE001 - the coordinator is gone: nothing to wait for
                return False
            if time.monotonic() >= deadline or self._cancelled:
                log.warning("job %r: its sinks finished, but the final checkpoint did not "
                            "complete within %.0f s (tasks that did not report their end: "
                            "%s)", self.flow.name, limit_s, _unfinished(self.coordinator))
                return False
            time.sleep(0.02)

    def _sinks_finished(self, keys) -> bool:
        """Whether every sink instance has written its end of stream (asked, not assumed)."""
        import ray

        try:
            done = ray.get([self.hosts[k].wait_done.remote(0, k) for k in keys], timeout=30)
            return all(d is True for d in done)  # (an error is not a finish)
        except Exception:  # noqa: BLE001 - a sink is gone: not finished
            return False

    def _poll_failure(self) -> BaseException | None:
        """The first error any instance reports, or the error of a dead instance."""
        import ray

        refs = [h.status.remote(k) for k, h in self.hosts.items()]
        for ref in refs:
            try:
                st = ray.get(ref, timeout=30)
            except ray.exceptions.GetTimeoutError:
                continue  # slow (a loaded machine), not dead: asked again at the next poll
            except Exception as exc:  # noqa: BLE001 - the actor is gone
                return unwrap(exc)
            if st["error"] is not None:
                return st["error"]
        try:  # the coordinator too: sinks wait for it to commit their last epoch
            why = ray.get(self.coordinator.health.remote(), timeout=30)
        except ray.exceptions.GetTimeoutError:
            return None
        except Exception as exc:  # noqa: BLE001 - it is gone
            return unwrap(exc)
        if why is not None:  # not a lost actor: a restart would fail the same way
            return StepError("(checkpoints)", 0, "-", why)
        return None

    def _finish_clean(self) -> None:
        self.state = "STOPPED" if self.state == "STOPPING" else "FINISHED"
        self.finished_at = time.time()
        if self.state == "FINISHED":
            self._release_snapshots()
        self._teardown(clean=True)
        if self.state == "FINISHED":
            self._clean_state()
        log.info("job %r %s after %.2f s, %d recoveries", self.flow.name, self.state.lower(),
                 self.finished_at - self.started_at,  # type: ignore[operator]  # (start set it)
                 len(self.recoveries))

    def _finish_failed(self, exc: BaseException) -> None:
        if not isinstance(exc, StepError):
            exc = StepError("?", -1, "-", f"{type(exc).__name__}: {exc}")
        try:
            self._collect()
        except Exception:  # noqa: BLE001 - keep the first error
            pass
        note = f" (after {len(self.recoveries)} recoveries)" if self.recoveries else ""
        latest = self._latest
        if latest is not None and latest.path and not latest.final:
            note += f"; resume with rayflow.run(flow, resume_from={latest.path!r})"
        if note:  # a new error, so that its message carries the note too
            exc = StepError(exc.step_id, exc.instance, exc.record, f"{exc.reason}{note}")
        self.error = exc
        self.state = "FAILED"
        self.finished_at = time.time()
        self._teardown()
        raise exc

    def _collect(self) -> None:
        import ray

        self.last_checkpoint()
        self.checkpoints()
        refs = {k: h.final.remote(k) for k, h in self.hosts.items()}
        self._finals = {}
        for k, ref in refs.items():
            try:
                self._finals[k] = ray.get(ref, timeout=60)
            except Exception:  # noqa: BLE001 - an instance that died after finishing
                final = self._final_from_checkpoint(k)
                if final is not None:
                    self._finals[k] = final

    def _final_from_checkpoint(self, key: tuple[str, int]) -> dict | None:
        """What the driver keeps of an instance that died after it finished, from its final
        state in the last checkpoint: a collecting sink's records and the dead letters, with
        their count. Its other counters and its latency samples went with it (they read as
        none). None where the checkpoint holds no final state of it."""
        import numpy as np

        from rayflow.core.connectors import restored_by_run
        from rayflow.core.operators import StepContext
        from rayflow.metrics import StepCounters
        from rayflow.runtime.inflight import dead_letters_of, state_of

        latest = self._latest
        if latest is None or key not in latest.finished_tasks or key not in latest.handles:
            return None
        handle = latest.handles[key]
        state, dead = state_of(handle), dead_letters_of(handle)
        counters = StepCounters()
        counters.dead_letters = dead.count if dead is not None else 0
        log.warning("job %r: %s instance %d died after it finished; its output and dead "
                    "letters are taken from its final checkpoint", self.flow.name, key[0],
                    key[1])
        # (what a recovery of this run would restore into the sink's writer)
        result = restored_by_run(state, StepContext(key[0], key[1], 1, run_id=self.run_id))
        return {"counters": counters.as_dict(), "latency": np.empty((0, 2)),
                "dead_letters": list(dead.kept) if dead is not None else [],
                "result": result[0] if result else None, "error": None}

    def _release_snapshots(self) -> None:
        """Before the actors go: each operator deletes the snapshots it still keeps (the
        final checkpoint subsumes them; ``_clean_state`` then deletes the final one's)."""
        import ray

        refs = [h.release_snapshots.remote() for h in self.actors()]
        for ref in refs:
            try:
                ray.get(ref, timeout=30)
            except Exception:  # noqa: BLE001 - best effort: an actor that died after finishing
                continue

    def _clean_state(self) -> None:
        """A job that ran to its end leaves nothing to resume: delete its durable
        checkpoints and the state files its last checkpoint names."""
        import shutil

        from rayflow.checkpoint_store import CheckpointStore

        try:
            CheckpointStore(self.store_root).remove()  # type: ignore[arg-type]  # (set by start)
        except Exception:  # noqa: BLE001 - best effort
            pass
        chk = self.config.checkpoint
        if chk.state_backend == "memory":
            return
        # only what the state backend made: its instance directories of this job (a
        # source's handle may name input files, which are the user's)
        base = chk.state_dir or (os.path.join(tempfile.gettempdir(), "rayflow-rocksdb")
                                 if chk.state_backend == "rocksdb" else None)
        if not base:
            return
        root = os.path.realpath(os.path.join(base, self.flow.name))
        from rayflow.runtime.inflight import state_of

        handles = self._latest.handles if self._latest else {}
        for path in _paths_in({k: state_of(h) for k, h in handles.items()}):
            real = os.path.realpath(path)
            if real.startswith(root + os.sep) and os.path.exists(real):
                if os.path.isdir(real):
                    shutil.rmtree(real, ignore_errors=True)
                else:
                    os.unlink(real)
        # and what no checkpoint names: a snapshot an exiting actor was still writing
        for step in self.flow.steps:
            shutil.rmtree(os.path.join(root, step.step_id), ignore_errors=True)

    def last_checkpoint(self) -> Any:
        """The last completed checkpoint (to pass as ``resume_from``; its ``path`` is where
        the durable copy lies, resumable by a new driver), or None. It outlives the
        coordinator and the job: after a failure it is read from the durable store."""
        import ray

        if self.coordinator is not None:
            try:
                got = ray.get(self.coordinator.latest.remote(), timeout=30)
                if got is not None:
                    self._latest = got
            except Exception:  # noqa: BLE001 - the coordinator is gone: the store knows
                pass
        if self.store_root is not None:
            from rayflow.checkpoint_store import CheckpointStore

            try:
                stored = CheckpointStore(self.store_root).latest()
            except Exception:  # noqa: BLE001 - removed after a finished job
                stored = None
            if stored is not None and (self._latest is None or
                                       stored.checkpoint_id > self._latest.checkpoint_id):
                self._latest = stored
        return self._latest

    def checkpoints(self) -> list[dict]:
        """Every checkpoint so far: id, ``duration_s``, status, and ``acked_s``: when each
        task acknowledged it, in seconds from its start, by ``"step[instance]"`` (where a
        slow checkpoint waited); a completed one also has ``inflight_batches``, the batches
        an unaligned checkpoint stored from the channels (0 when aligned)."""
        import ray

        if self.coordinator is not None:
            try:
                self._checkpoints = ray.get(self.coordinator.checkpoints.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - the coordinator is gone: what we saw last
                pass
        return self._checkpoints


def _unfinished(coordinator: Any) -> str:
    """The tasks that did not report their end, for a log line."""
    import ray

    try:
        return ", ".join(f"{s}[{i}]" for s, i in
                         ray.get(coordinator.unfinished.remote(), timeout=5)) or "-"
    except Exception:  # noqa: BLE001
        return "?"


def _newest(*checkpoints: Any) -> Any:
    """The checkpoint with the highest id among those given (None ones left out)."""
    known = [c for c in checkpoints if c is not None]
    return max(known, key=lambda c: c.checkpoint_id) if known else None


def _paths_in(obj: Any) -> list[str]:
    """Every string inside a (nested) state handle: the candidates for state files."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [p for v in obj.values() for p in _paths_in(v)]
    if isinstance(obj, (list, tuple)):
        return [p for v in obj for p in _paths_in(v)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [p for f in dataclasses.fields(obj) for p in _paths_in(getattr(obj, f.name))]
    return []

