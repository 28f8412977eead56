"""Running a dataflow: actors up, wired, sources started; the job handle watches and reports.

    job = rayflow.run(flow)                    # run to completion
    job = rayflow.run(flow, background=True)   # returns at once
    job.status(); job.metrics(); job.stop(); job.wait()
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

from rayflow._raycontext import ensure_ray
from rayflow.batches import concat
from rayflow.config import RayflowConfig, load_config, with_overrides
from rayflow.dataflow import Dataflow
from rayflow.errors import START_UP, ConfigError, StepError
from rayflow.metrics import StepCounters, latency_windows, summarize_latency
from rayflow.operators.base import Rescaled, StepContext, describe_exception
from rayflow.operators.watermarks import split_position
from rayflow.runtime.channel import unwrap
from rayflow.runtime.plan import chains, make_plan

POLL_S = 0.5
EXIT_GRACE_S = 10.0  # a job that ended well: how long its actors may take to exit by themselves
log = logging.getLogger(__name__)


class Job:
    """Handle of a running (or finished) dataflow job."""

    def __init__(self, flow: Dataflow, config: RayflowConfig):
        self.flow, self.config = flow, config
        self.plan = make_plan(flow)
        self.chains = chains(flow, config.stream.chaining)  # step -> the step it runs with
        self.state = "CREATED"
        self.error: BaseException | None = None
        self.hosts: dict[tuple[str, int], Any] = {}
        self._runs: dict[Any, tuple[str, int]] = {}
        self._finals: dict[tuple[str, int], dict] = {}
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.finished_at: float | None = None
        self.coordinator: Any = None
        self.run_id = uuid.uuid4().hex[:12]  # one per run; recoveries keep it
        self.recoveries: list[dict] = []
        self._checkpoints: list[dict] = []
        self._latest: Any = None
        self.store_root: str | None = None  # the run's durable checkpoints
        self._ended = threading.Event()  # the supervisor is done (finished, failed, cancelled)
        self._cancelled = False
        self._stop_requested = False
        self._coupled: set[str] = set()  # source steps whose readers share an enumerator
        self._sink_waits: dict[tuple[str, int], tuple[Any, Any]] = {}  # key -> (actor, ref)

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
        self._spawn(latest, latest.checkpoint_id + 1 if latest else 1, {})
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

    def _meta(self) -> dict:
        chk = self.config.checkpoint
        return {"job": self.flow.name, "run_id": self.run_id,
                "plan": {s.step_id: s.parallelism for s in self.flow.steps},
                "state_backend": chk.state_backend, "state_dir": chk.state_dir,
                "processing_guarantee": chk.processing_guarantee}

    def _new_coordinator(self) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from rayflow.runtime.coordinator import CoordinatorActor

        chk = self.config.checkpoint
        # beside the driver (soft affinity): it should outlive the loss of a worker node
        here = ray.get_runtime_context().get_node_id()
        return CoordinatorActor.options(  # type: ignore[attr-defined]  # (added by ray.remote)
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
        ).remote(chk.interval_s, chk.timeout_s, store_root=self.store_root, meta=self._meta(),
                 durable_positions=chk.processing_guarantee == "at_most_once")

    def _spawn(self, latest: Any, first_id: int, positions: dict, fresh_state: bool = False,
               recovering: bool = False, only: frozenset | None = None) -> None:
        """Build, wire and start every instance (``only`` those of one failover region; the
        others run on). ``fresh_state``: operators and sinks start empty (at-most-once
        recovery: the sources resume past what already left, so old state would emit
        records a second time). While ``recovering``, a failure is raised as it is, for the
        supervisor to try again."""
        import ray

        from rayflow.runtime.coordinator import SplitClient
        from rayflow.runtime.host import StepHost
        from rayflow.runtime.inflight import replay, state_of
        from rayflow.state import backend_from_name

        opts, chk = self.config.stream, self.config.checkpoint
        backend = backend_from_name(chk.state_backend, chk.state_dir)
        steps = {s.step_id: s for s in self.flow.steps}
        checkpointed = latest.handles if latest is not None else {}
        handles_in = {k: state_of(h) for k, h in checkpointed.items()}
        # unaligned: the batches the checkpoint holds in flight, by the instance they go to
        replays = replay(checkpointed, latest.finished_tasks, self.plan.parallelism,
                         {(e.upstream, s.step_id): (e.partitioning, e.key_fn)
                          for s in self.flow.steps for e in s.inputs}) \
            if latest is not None and not fresh_state else {}
        old_par = Counter(s for s, _ in handles_in)
        spread = _spread_nodes() if opts.scheduling_strategy == "SPREAD" else []
        built: dict[tuple[str, int], tuple] = {}  # instance -> (step, ctx, resume)
        enumerators = self._enumerators(handles_in, positions, only)
        if only is None:
            self._coupled = set(enumerators)
        # before any reader is built: a reader asks for its first splits as it is built
        ray.get(self.coordinator.set_enumerators.remote(enumerators, only is not None))
        for key in self.plan.instances():
            if only is not None and key not in only:
                continue
            step_id, i = key
            step = steps[step_id]
            ctx = StepContext(step_id, i, step.parallelism, self.flow.name, backend,
                              chk.processing_guarantee, self.run_id,
                              SplitClient(self.coordinator, step_id, i)
                              if step_id in enumerators else None)
            resume = handles_in.get(key)
            if old_par.get(step_id, step.parallelism) != step.parallelism:
                n_old = old_par[step_id]
                resume = Rescaled(tuple(handles_in.get((step_id, j)) for j in range(n_old)),
                                  n_old)
            if step.kind == "source" and key in positions:
                resume = positions[key]  # at-most-once: never replay what already left
            elif fresh_state and step.kind != "source":
                resume = None
            built[key] = (step, ctx, resume)
        members = {h: ks for h, ks in self._members().items() if only is None or h in only}
        for n, (head, keys) in enumerate(members.items()):
            step = steps[head[0]]
            # per-step overrides (e.g. .map(..., actor_num_cpus=1) for a heavy step, so the
            # autoscaler sees its demand) win over the job's stream options. SPREAD deals
            # instances round-robin over the nodes with CPUs (soft affinity: a full or lost
            # node falls back to Ray's choice); Ray's own SPREAD is best effort and often
            # packs actors of 0 CPUs on one or two nodes.
            strategy = step.options.get("scheduling_strategy", opts.scheduling_strategy)
            if strategy == "SPREAD" and spread:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                strategy = NodeAffinitySchedulingStrategy(spread[n % len(spread)], soft=True)
            extra = {}
            if step.options.get("actor_env"):
                # environment variables of this chain's actor process (Ray merges them over
                # the job's), e.g. glibc malloc settings for a step that moves large buffers
                extra["runtime_env"] = {"env_vars": {k: str(v) for k, v in
                                                     step.options["actor_env"].items()}}
            actor = StepHost.options(  # type: ignore[attr-defined]  # (added by ray.remote)
                num_cpus=step.options.get("actor_num_cpus", opts.actor_num_cpus),
                scheduling_strategy=strategy, **extra,
            ).remote([built[k] for k in keys], opts, self.flow.dead_letter_sink,
                     self.coordinator, chk.tick_s, config=self.config,
                     replay={k: replays[k] for k in keys if k in replays})
            for k in keys:
                self.hosts[k] = actor
        handles: dict[str, list[Any]] = defaultdict(list)
        for key in self.plan.instances():
            handles[key[0]].append(self.hosts[key])
        sources = [k for k in self.hosts if steps[k[0]].kind == "source" and
                   (only is None or k in only)]
        # tasks that flushed before the failure must not flush again when restored
        done_before = set(latest.drained) if latest is not None else set()
        try:
            ray.get([
                self.hosts[head].mark_restored_final.remote([k for k in keys if k in done_before])
                for head, keys in members.items() if done_before.intersection(keys)
            ] + [
                self.hosts[head].connect.remote(
                    {k: self.plan.outputs[k] for k in keys}, dict(handles),
                    {k: self.plan.inputs[k] for k in keys})
                for head, keys in members.items()
            ])
            # the coordinator's clock starts once every task is built and connected (as
            # Flink triggers checkpoints only when all tasks run): a first checkpoint must
            # not wait for the actors' start-up
            ray.get(self.coordinator.attach.remote(dict(self.hosts), sources, first_id, latest,
                                                   positions) if only is None else
                    self.coordinator.resume_region.remote({k: self.hosts[k] for k in only},
                                                          sources))
            # what was in flight at the checkpoint goes first, before the sources read on
            ray.get([self.hosts[head].replay.remote() for head, keys in members.items()
                     if any(k in replays for k in keys)])
        except Exception as exc:  # noqa: BLE001 - a step failed to build (bad config, no topic)
            if recovering:
                raise unwrap(exc) from None
            self._fail_start(self._start_error(exc, members))
        if only is None:
            self._runs = {}
        else:
            self._runs = {r: k for r, k in self._runs.items() if k not in only}
        self._runs.update({self.hosts[k].run.remote(): k for k in sources})

    def _enumerators(self, handles_in: dict, positions: dict,
                     only: frozenset | None = None) -> dict[str, Any]:
        """Each source step's SplitEnumerator (if its spec makes one), rebuilt from what its
        readers finished: the checkpoint's snapshots, or at-most-once positions, which are
        recorded before each batch leaves and exist even when no checkpoint completed."""
        out = {}
        for step in self.flow.steps:
            make = getattr(step.spec, "enumerator", None)  # absent: not derived from SourceSpec
            if step.kind != "source" or make is None:
                continue
            if only is not None and (step.step_id, 0) not in only:
                continue  # its readers run on: the region holds all of a step's or none
            keys = sorted({k for k in [*handles_in, *positions] if k[0] == step.step_id})
            try:
                enum = make(step.parallelism, [split_position(positions.get(k, handles_in.get(k)))[0]
                                               for k in keys])
            except Exception as exc:  # noqa: BLE001 - e.g. no such directory
                self._fail_start(StepError(step.step_id, 0, START_UP,
                                           describe_exception(exc)))
            if enum is not None:
                out[step.step_id] = enum
        return out

    def _start_error(self, exc: BaseException, members: dict) -> StepError:
        """One StepError naming the step whose start failed, whatever Ray wrapped it in (a
        host reports a step that failed to build as a StepError; an actor that died while
        starting, e.g. its runtime_env failed, is found by asking each host)."""
        import ray

        cause = unwrap(exc)
        if isinstance(cause, StepError):
            return cause
        for head in members:
            try:
                ray.get(self.hosts[head].__ray_ready__.remote(), timeout=30)
            except Exception as dead:  # noqa: BLE001 - this host is the one
                cause = unwrap(dead)
                return StepError(head[0], head[1], START_UP,
                                 describe_exception(cause).splitlines()[0][:500])
        return StepError("?", -1, START_UP, describe_exception(cause).splitlines()[0][:500])

    def _fail_start(self, error: BaseException) -> None:
        """Starting the instances failed: nothing may keep running; raise ``error``."""
        self._teardown()
        self.state = "FAILED"
        self.error = error
        raise error from None

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
        old = {h._actor_id: h for k, h in self.hosts.items() if k in region}
        for h in old.values():
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        _wait_dead(list(old.values()), timeout_s=30.0)
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

    @property
    def startup_s(self) -> float | None:
        """Seconds from ``start`` until every instance was built and wired."""
        return None if self.ready_at is None else self.ready_at - self.started_at  # type: ignore[operator]  # (start sets both)

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
                continue

    def actors(self) -> list[Any]:
        """The job's step actors, one per chain of instances (``hosts`` maps every instance
        to its actor)."""
        seen: dict = {}
        for h in list(self.hosts.values()):  # the supervisor thread may be replacing them
            seen.setdefault(h._actor_id, h)
        return list(seen.values())

    def _members(self) -> dict[tuple[str, int], list[tuple[str, int]]]:
        """Chain head instance -> the instances its actor runs, head first."""
        out: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
        for key in self.plan.instances():
            out[(self.chains[key[0]], key[1])].append(key)
        return out

    def _teardown(self, keep_coordinator: bool = False, clean: bool = False) -> None:
        """Kill every step actor (and the coordinator unless kept) and wait until they are
        dead. ``clean`` (a job that ended well): each actor first exits by itself, so that
        Ray exports its last metrics; one still alive after EXIT_GRACE_S is killed."""
        import ray

        actors = self.actors()
        if clean and actors:
            for h in actors:
                try:
                    h.exit.remote()
                except Exception:  # noqa: BLE001 - already gone
                    pass
            _wait_dead(actors, timeout_s=EXIT_GRACE_S)
        if not keep_coordinator and self.coordinator is not None:
            actors.append(self.coordinator)
            self.coordinator = None
        for h in actors:
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        # ray.kill is asynchronous: return only once every actor is gone, so that a job
        # that stopped holds no actor (and no call reaches an old instance)
        _wait_dead(actors, timeout_s=30.0)
        self.hosts.clear()
        self._runs = {}

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


def _spread_nodes() -> list[str]:
    """IDs of the alive nodes with CPUs, in a stable order (empty on a single node)."""
    import ray

    nodes = sorted(n["NodeID"] for n in ray.nodes()
                   if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0)
    return nodes if len(nodes) > 1 else []


def _wait_dead(handles: list[Any], timeout_s: float) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    for h in handles:
        while time.monotonic() < deadline:
            try:
                ray.get(h.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except ray.exceptions.RayActorError:
                break
            except Exception:  # noqa: BLE001 - timeout or other: try again until the deadline
                pass
            time.sleep(0.05)


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
