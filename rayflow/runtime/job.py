"""Running a dataflow: actors up, wired, sources started; the job handle watches and reports.

    job = rayflow.run(flow)                    # run to completion
    job = rayflow.run(flow, background=True)   # returns at once
    job.status(); job.metrics(); job.stop(); job.wait()
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any

from rayflow._raycontext import ensure_ray
from rayflow.config import RayflowConfig, load_config, with_overrides
from rayflow.core.records import concat
from rayflow.dataflow import Dataflow
from rayflow.errors import ConfigError
from rayflow.metrics import StepCounters, latency_windows, summarize_latency
from rayflow.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)


class Job(Supervisor):
    """Handle of a running (or finished) dataflow job.

    The user's side: start, wait, stop (with a savepoint), rescale, cancel, and the
    results. Recovery is the :class:`~rayflow.runtime.supervisor.Supervisor`'s; building
    and tearing down the actors the :class:`~rayflow.runtime.launcher.Launcher`'s.
    """

    def __init__(self, flow: Dataflow, config: RayflowConfig):
        super().__init__(flow, config)
        self.ready_at: float | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, resume_from: Any = None) -> Job:
        """Start every instance, from a completed checkpoint when ``resume_from`` is given
        (``job.last_checkpoint()``, or the path of a durable checkpoint or savepoint), and
        the job's supervisor, which recovers failures whether or not anyone waits."""
        ensure_ray(self.config.ray.address, self.config.ray.num_cpus,
                   process_env=self.config.ray.process_env(),
                   include_dashboard=self.config.ray.include_dashboard,
                   namespace=self.config.ray.namespace)
        from rayflow.checkpoint_store import CheckpointStore, run_root

        self.started_at = time.time()
        latest = self._resolve_resume(resume_from)
        self.store_root = run_root(self.config.checkpoint.state_dir, self.flow.name,
                                   self.run_id)
        try:
            CheckpointStore(self.store_root)
        except Exception as exc:  # noqa: BLE001 - say which setting, before any actor starts
            raise ConfigError(f"checkpoint.state_dir: cannot keep checkpoints under "
                              f"{self.store_root}: {type(exc).__name__}: {exc}") from None
        self.coordinator = self._new_coordinator()
        try:
            self._spawn(latest, latest.checkpoint_id + 1 if latest else 1, {})
        except BaseException as exc:  # (the launcher tore down what it had started)
            self.state, self.error = "FAILED", exc
            raise
        self._latest = latest
        self.ready_at = time.time()
        self.state = "RUNNING"
        log.info("job %r (run %s) running: %d instances in %d actors, resumed from %s",
                 self.flow.name, self.run_id, len(self.hosts), len(self.actors()),
                 getattr(latest, "path", None) or (latest and latest.checkpoint_id))
        self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                            name=f"rayflow-supervisor-{self.flow.name}")
        self._supervisor.start()
        return self

    def _resolve_resume(self, resume_from: Any) -> Any:
        """The checkpoint to start from; a path is read from the durable store. The
        checkpoint's state backend wins over the configuration's (its handles only make
        sense to it); a different processing guarantee is refused."""
        if resume_from is None:
            return None
        from rayflow.checkpoint import CompletedCheckpoint
        from rayflow.checkpoint_store import load_checkpoint, wait_until_released

        if isinstance(resume_from, (str, os.PathLike)):
            wait_until_released(os.fspath(resume_from))  # a dying run may still commit one
            resume_from = load_checkpoint(os.fspath(resume_from))
        if not isinstance(resume_from, CompletedCheckpoint):
            raise ConfigError(f"resume_from: expected job.last_checkpoint() or a checkpoint "
                              f"path, got {type(resume_from).__name__}")
        meta, chk = resume_from.meta, self.config.checkpoint
        if meta.get("processing_guarantee", chk.processing_guarantee) != \
                chk.processing_guarantee:
            raise ConfigError(
                f"resume_from: the checkpoint was taken with processing_guarantee="
                f"{meta['processing_guarantee']!r}, this job runs with "
                f"{chk.processing_guarantee!r}; resume with the checkpoint's guarantee")
        backend = meta.get("state_backend", chk.state_backend)
        if backend != chk.state_backend or meta.get("state_dir", chk.state_dir) != chk.state_dir:
            log.warning("resuming with the checkpoint's state backend %r (state_dir %r) "
                        "instead of the configured %r", backend, meta.get("state_dir"),
                        chk.state_backend)
            self.config = self.config.model_copy(update={"checkpoint": chk.model_copy(
                update={"state_backend": backend, "state_dir": meta.get("state_dir")})})
        return resume_from

    @property
    def startup_s(self) -> float | None:
        """Seconds from ``start`` until every instance was built and wired."""
        return None if self.ready_at is None else self.ready_at - self.started_at  # type: ignore[operator]  # (start sets both)

    def wait(self, timeout_s: float | None = None) -> Job:
        """Block until the job finishes; raise :class:`StepError` if a step failed.

        A failure of Ray itself (an actor or node died, the coordinator included) is
        recovered by the job's supervisor from the last completed checkpoint, up to
        ``checkpoint.max_restarts`` times, whether or not anyone waits; an error in user
        code is not (it would fail again) and ends the job.
        """
        if self.state == "CREATED":
            raise RuntimeError("the job has not been started")
        if not self._ended.wait(timeout_s):
            raise TimeoutError(f"job {self.flow.name!r} still running after {timeout_s}s")
        if self.error is not None:
            raise self.error
        return self

    def stop(self, timeout_s: float | None = 60.0, savepoint: bool = False) -> Job:
        """Graceful stop: sources end their streams, everything in flight is processed.

        With ``savepoint=True`` the sources first take a checkpoint and end exactly there, so
        ``rayflow.run(flow, resume_from=job.last_checkpoint())`` (or the savepoint's path,
        ``job.last_checkpoint().path``) continues without loss or duplicates. A failure
        during the savepoint is recovered and the savepoint taken again.
        """
        import ray

        if self.state == "RUNNING":
            self.state = "STOPPING"
            if savepoint:
                self._savepoint(timeout_s or 60.0)
            else:
                self._stop_requested = True
                try:
                    ray.get([self.hosts[k].stop.remote() for k in list(self._runs.values())],
                            timeout=30)
                except Exception:  # noqa: BLE001 - a recovery in progress re-sends it
                    pass
        return self.wait(timeout_s)

    def _savepoint(self, timeout_s: float) -> None:
        import ray

        deadline = time.monotonic() + timeout_s
        why = "no checkpoint could start"
        while time.monotonic() < deadline and not self._ended.is_set():
            try:
                got = ray.get(self.coordinator.request_savepoint.remote(), timeout=10)
            except Exception as exc:  # noqa: BLE001 - coordinator gone: the supervisor acts
                got, why = None, f"coordinator unavailable ({type(exc).__name__})"
            if isinstance(got, str):
                return  # the job has finished: its final checkpoint is where it stopped
            if isinstance(got, int):
                while time.monotonic() < deadline and not self._ended.is_set():
                    try:
                        outcome = ray.get(self.coordinator.outcome.remote(got), timeout=10)
                    except Exception:  # noqa: BLE001
                        outcome = "aborted: coordinator unavailable"
                    if outcome == "completed":
                        log.info("job %r: savepoint %d complete", self.flow.name, got)
                        return
                    if outcome is not None:
                        why = f"savepoint {got} {outcome}"
                        break  # aborted (a failure): the supervisor recovers; ask again
                    time.sleep(0.02)
            time.sleep(0.05)
        if self._ended.is_set():
            return
        try:
            missing = ray.get(self.coordinator.missing_acks.remote(), timeout=10)
        except Exception:  # noqa: BLE001
            missing = []
        self.state = "RUNNING"
        raise TimeoutError(f"the savepoint did not complete in {timeout_s:.0f} s ({why}"
                           f"{'; no acks from ' + str(missing) if missing else ''}); "
                           f"the job goes on running")

    def rescale(self, parallelism: dict[str, int], timeout_s: float = 60.0) -> Job:
        """Change steps' parallelism on a running job: stop at a savepoint, then start the
        same flow with the new parallelism from it. Keyed state moves to the instances that
        own its keys; Kafka partitions are spread over the new source instances. Returns the
        new job (this one is STOPPED)."""
        import copy

        unknown = set(parallelism) - {s.step_id for s in self.flow.steps}
        if unknown:
            raise ValueError(f"rescale: no such steps {sorted(unknown)}")
        log.info("job %r: rescaling %s from a savepoint", self.flow.name,
                 ", ".join(f"{s} to {n}" for s, n in sorted(parallelism.items())))
        self.stop(timeout_s, savepoint=True)
        flow = copy.copy(self.flow)
        flow._steps = {sid: (dataclasses.replace(s, parallelism=parallelism[sid])
                             if sid in parallelism else s) for sid, s in self.flow._steps.items()}
        job = Job(flow, self.config)
        job.start(self.last_checkpoint())
        return job

    def cancel(self) -> None:
        """Kill every actor now; in-flight records are lost. The durable checkpoints stay,
        so the job can be resumed from ``last_checkpoint()``."""
        self._cancelled = True
        self.last_checkpoint()
        self.state = "CANCELLED"
        self._teardown()
        self._ended.set()

    def status(self) -> str:
        return self.state

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        if self.state in ("RUNNING", "STOPPING"):
            self.cancel()

    # -- results -------------------------------------------------------------------------
    def collect(self, step_id: str) -> Any:
        """Records a :class:`CollectSink` step received, instance 0 first.

        Raises:
            ConfigError: ``step_id`` is not a sink step of this job (the message names them).
        """
        sinks = [s.step_id for s in self.flow.steps if s.kind == "sink"]
        if step_id not in sinks:
            kind = {s.step_id: s.kind for s in self.flow.steps}.get(step_id)
            what = (f"{step_id!r} is {'an' if kind == 'operator' else 'a'} {kind} step, not "
                    f"a sink of job {self.flow.name!r}" if kind else
                    f"job {self.flow.name!r} has no step {step_id!r}")
            raise ConfigError(f"collect: {what}; its sinks: {', '.join(map(repr, sinks))}")
        parts = [f["result"] for (s, i), f in sorted(self._finals.items()) if s == step_id]
        parts = [p for p in parts if p is not None]
        return concat(parts) if parts else []

    def dead_letters(self) -> list:
        """Dead letters kept by every step (all are counted; at most 10,000 per instance kept)."""
        return [d for f in self._finals.values() for d in f["dead_letters"]]

    def metrics(self) -> dict[str, dict]:
        """Per-step counters summed over instances (live while running, final after)."""
        if self.hosts and self.state in ("RUNNING", "STOPPING"):
            import ray

            refs = {k: h.status.remote(k) for k, h in list(self.hosts.items())}
            per = {}
            for k, ref in refs.items():
                try:
                    per[k] = ray.get(ref, timeout=30)["counters"]
                except Exception:  # noqa: BLE001 - an instance being recovered
                    continue
        else:
            per = {k: f["counters"] for k, f in self._finals.items()}
        out: dict[str, StepCounters] = {}
        for (step_id, _), d in per.items():
            c = StepCounters(**{**d, "first_in_time": d["first_in_time"] or float("inf")})
            out[step_id] = out[step_id].merge(c) if step_id in out else c
        return {s: c.as_dict() for s, c in out.items()}

    def latency(self, skip_s: float = 0.0) -> dict:
        """outTime - eventTime over all sinks: p50/p90/p99/max in ms."""
        return summarize_latency([f["latency"] for f in self._finals.values()], skip_s)

    def latency_windows(self, window_s: float = 1.0) -> list[dict]:
        return latency_windows([f["latency"] for f in self._finals.values()], window_s)

    def throughput(self, step_id: str | None = None, delivered: bool = False) -> float:
        """Records / (last outTime - first inTime), over the sinks (or one sink step): inTime
        is when a record's batch left its source, outTime when the sink wrote it.

        With ``delivered=True`` the span ends when the sinks' output was durable and
        visible instead: their final flush returned, or, for sinks that commit
        (exactly-once), their last commit. Start-up is in neither (``startup_s``)."""
        m = self.metrics()
        sinks = [s.step_id for s in self.flow.steps if s.kind == "sink"]
        chosen = [step_id] if step_id else sinks
        n = sum(m[s]["records_in"] for s in chosen)
        first = min((m[s]["first_in_time"] or float("inf")) for s in chosen)
        last = max(m[s]["delivered_time" if delivered else "last_out_time"] for s in chosen)
        return n / (last - first) if last > first else 0.0


def run(flow: Dataflow, *, config: RayflowConfig | None = None, background: bool = False,
        timeout_s: float | None = None, resume_from: Any = None, **overrides: Any) -> Job:
    """Run ``flow`` and return its :class:`Job`.

    Args:
        flow: the dataflow.
        config: the configuration; ``load_config(**overrides)`` when None.
        background: return as soon as the job runs (then ``job.wait()`` or ``job.stop()``).
        timeout_s: how long ``wait`` may take when not in the background.
        resume_from: a completed checkpoint to start from: ``job.last_checkpoint()``, or
            the path of a durable checkpoint or savepoint (``job.last_checkpoint().path``,
            or a run directory under ``{state_dir}/checkpoints/{flow}/``: its newest).
            ``rayflow run --resume PATH`` sets it for a job script
            (``RAYFLOW_RESUME_FROM``).
        **overrides: configuration sections merged over ``config`` (or over
            ``load_config()``), e.g. ``stream={"batch_size": 1000}``.
    """
    config = load_config(**overrides) if config is None else with_overrides(config, **overrides)
    if resume_from is None and os.environ.get("RAYFLOW_RESUME_FROM"):
        resume_from = os.environ["RAYFLOW_RESUME_FROM"]  # `rayflow run --resume PATH`
    job = Job(flow, config).start(resume_from)
    if not background:
        job.wait(timeout_s)
    return job

