"""Running a dataflow: actors up, wired, sources started; the job handle watches and reports.

    job = rayflow.run(flow)                    # run to completion
    job = rayflow.run(flow, background=True)   # returns at once
    job.status(); job.metrics(); job.stop(); job.wait()
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

from rayflow._raycontext import ensure_ray
from rayflow.batches import concat
from rayflow.config import RayflowConfig, load_config
from rayflow.dataflow import Dataflow
from rayflow.errors import StepError
from rayflow.metrics import StepCounters, latency_windows, summarize_latency
from rayflow.operators.base import Rescaled, StepContext, describe_exception
from rayflow.runtime.channel import unwrap
from rayflow.runtime.plan import chains, make_plan

POLL_S = 0.5


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
        self.started_at = self.ready_at = self.finished_at = None
        self.coordinator: Any = None
        self.run_id = uuid.uuid4().hex[:12]  # one per run; recoveries keep it
        self.recoveries: list[dict] = []
        self._checkpoints: list[dict] = []
        self._latest: Any = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, resume_from: Any = None) -> Job:
        """Start every instance (from a completed checkpoint when ``resume_from`` is given)."""
        ray = ensure_ray(self.config.ray.address, self.config.ray.num_cpus,
                         include_dashboard=self.config.ray.include_dashboard)
        from rayflow.runtime.coordinator import CoordinatorActor

        self.started_at = time.time()
        chk = self.config.checkpoint
        # the coordinator lives beside the driver (soft affinity): it must outlive the loss
        # of any worker node, since recovery starts by asking it for the last checkpoint
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        self.coordinator = CoordinatorActor.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
        ).remote(chk.interval_s, chk.timeout_s)
        latest = resume_from
        self._spawn(latest, latest.checkpoint_id + 1 if latest else 1, {})
        self.ready_at = time.time()
        self.state = "RUNNING"
        return self

    def _spawn(self, latest: Any, first_id: int, positions: dict) -> None:
        import ray

        from rayflow.runtime.coordinator import SplitClient
        from rayflow.runtime.host import StepHost
        from rayflow.state import backend_from_name

        opts, chk = self.config.stream, self.config.checkpoint
        backend = backend_from_name(chk.state_backend, chk.state_dir)
        steps = {s.step_id: s for s in self.flow.steps}
        handles_in = latest.handles if latest is not None else {}
        old_par = Counter(s for s, _ in handles_in)
        spread = _spread_nodes() if opts.scheduling_strategy == "SPREAD" else []
        built: dict[tuple[str, int], tuple] = {}  # instance -> (step, ctx, resume)
        enumerators = self._enumerators(handles_in, positions)
        # before any reader is built: a reader asks for its first splits as it is built
        ray.get(self.coordinator.set_enumerators.remote(enumerators))
        for key in self.plan.instances():
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
            built[key] = (step, ctx, resume)
        members = self._members()
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
            actor = StepHost.options(
                num_cpus=step.options.get("actor_num_cpus", opts.actor_num_cpus),
                scheduling_strategy=strategy, **extra,
            ).remote([built[k] for k in keys], opts, self.flow.dead_letter_sink,
                     self.coordinator, chk.tick_s)
            for k in keys:
                self.hosts[k] = actor
        handles: dict[str, list[Any]] = defaultdict(list)
        for key in self.plan.instances():
            handles[key[0]].append(self.hosts[key])
        sources = [k for k in self.hosts if steps[k[0]].kind == "source"]
        try:
            ray.get([
                self.hosts[head].connect.remote(
                    {k: self.plan.outputs[k] for k in keys}, dict(handles),
                    {k: self.plan.inputs[k] for k in keys})
                for head, keys in members.items()
            ] + [self.coordinator.attach.remote(dict(self.hosts), sources, first_id, latest)])
        except Exception as exc:  # noqa: BLE001 - a step failed to build (bad config, no topic)
            self._fail_start(unwrap(exc))
        self._runs = {self.hosts[k].run.remote(): k for k in sources}

    def _enumerators(self, handles_in: dict, positions: dict) -> dict[str, Any]:
        """Each source step's SplitEnumerator (if its spec makes one), rebuilt from what its
        readers finished: the checkpoint's snapshots, or at-most-once positions, which are
        recorded before each batch leaves and exist even when no checkpoint completed."""
        out = {}
        for step in self.flow.steps:
            make = getattr(step.spec, "enumerator", None)  # absent: not derived from SourceSpec
            if step.kind != "source" or make is None:
                continue
            keys = sorted({k for k in [*handles_in, *positions] if k[0] == step.step_id})
            try:
                enum = make(step.parallelism, [positions.get(k, handles_in.get(k)) for k in keys])
            except Exception as exc:  # noqa: BLE001 - e.g. no such directory
                self._fail_start(StepError(step.step_id, 0, "(split enumerator)",
                                           describe_exception(exc)))
            if enum is not None:
                out[step.step_id] = enum
        return out

    def _fail_start(self, error: BaseException) -> None:
        """Starting the instances failed: nothing may keep running; raise ``error``."""
        self._teardown()
        self.state = "FAILED"
        self.error = error
        raise error from None

    def _recover(self, cause: BaseException) -> None:
        """Restore every instance from the last completed checkpoint and go on."""
        import ray

        t0 = time.time()
        restore = ray.get(self.coordinator.detach.remote())
        # every old instance must be gone before the new ones start (teardown waits for
        # that): an old sink that is still alive could commit an epoch the new sink commits too
        self._teardown(keep_coordinator=True)
        latest = restore["latest"]
        positions = restore["positions"] if self.config.checkpoint.processing_guarantee == \
            "at_most_once" else {}
        self._spawn(latest, restore["next_id"], positions)
        self.recoveries.append({
            "cause": f"{type(cause).__name__}: {str(cause).splitlines()[0][:200]}",
            "restored_checkpoint": latest.checkpoint_id if latest else None,
            "restart_s": round(time.time() - t0, 3),
            "at": t0,
        })

    @property
    def startup_s(self) -> float | None:
        """Seconds from ``start`` until every instance was built and wired."""
        return None if self.ready_at is None else self.ready_at - self.started_at

    def wait(self, timeout_s: float | None = None) -> Job:
        """Block until the job finishes; raise :class:`StepError` if a step failed.

        A failure of Ray itself (an actor or node died) is recovered from the last completed
        checkpoint, up to ``checkpoint.max_restarts`` times; an error in user code is not
        (it would fail again) and ends the job.
        """
        import ray

        if self.state not in ("RUNNING", "STOPPING"):
            if self.error is not None:
                raise self.error
            return self
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            sinks = [k for k in self.hosts if self.flow.step(k[0]).kind == "sink"]
            pending = list(self._runs) + [self.hosts[k].wait_done.remote(None, k)
                                          for k in sinks]
            failure = None
            while pending and failure is None:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.flow.name!r} still running after {timeout_s}s")
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
                for ref in ready:
                    try:
                        ray.get(ref)
                    except Exception as exc:  # noqa: BLE001
                        failure = unwrap(exc)
                        break
                if failure is None and pending:
                    failure = self._poll_failure()
            if failure is None or (not isinstance(failure, StepError)
                                   and self._sinks_finished(sinks)):
                break  # finished (an instance that died after its sinks finished changes nothing)
            if isinstance(failure, StepError) or \
                    len(self.recoveries) >= self.config.checkpoint.max_restarts:
                self._finish_failed(failure)
            self._recover(failure)
        self._collect()
        self.state = "STOPPED" if self.state == "STOPPING" else "FINISHED"
        self.finished_at = time.time()
        self._teardown()
        return self

    def stop(self, timeout_s: float | None = 60.0, savepoint: bool = False) -> Job:
        """Graceful stop: sources end their streams, everything in flight is processed.

        With ``savepoint=True`` the sources first take a checkpoint and end exactly there, so
        ``rayflow.run(flow, resume_from=job.last_checkpoint())`` continues without loss or
        duplicates.
        """
        import ray

        if self.state == "RUNNING":
            self.state = "STOPPING"
            if savepoint:
                cid = ray.get(self.coordinator.savepoint.remote(True, timeout_s or 60.0))
                if not isinstance(cid, int):
                    raise TimeoutError(f"the savepoint did not complete: {cid}")
            else:
                ray.get([self.hosts[k].stop.remote() for k in self._runs.values()])
        return self.wait(timeout_s)

    def rescale(self, parallelism: dict[str, int], timeout_s: float = 60.0) -> Job:
        """Change steps' parallelism on a running job: stop at a savepoint, then start the
        same flow with the new parallelism from it. Keyed state moves to the instances that
        own its keys; Kafka partitions are spread over the new source instances. Returns the
        new job (this one is STOPPED)."""
        import copy

        unknown = set(parallelism) - {s.step_id for s in self.flow.steps}
        if unknown:
            raise ValueError(f"rescale: no such steps {sorted(unknown)}")
        self.stop(timeout_s, savepoint=True)
        flow = copy.copy(self.flow)
        flow._steps = {sid: (dataclasses.replace(s, parallelism=parallelism[sid])
                             if sid in parallelism else s) for sid, s in self.flow._steps.items()}
        job = Job(flow, self.config)
        job.start(self.last_checkpoint())
        return job

    def last_checkpoint(self) -> Any:
        """The last completed checkpoint (a picklable object to ``resume_from``), or None."""
        import ray

        if self.coordinator is not None:
            self._latest = ray.get(self.coordinator.latest.remote())
        return self._latest

    def checkpoints(self) -> list[dict]:
        """Every checkpoint so far: id, duration and status."""
        import ray

        if self.coordinator is not None:
            self._checkpoints = ray.get(self.coordinator.checkpoints.remote())
        return self._checkpoints

    def cancel(self) -> None:
        """Kill every actor now; in-flight records are lost."""
        self.state = "CANCELLED"
        self._teardown()

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
            return all(ray.get([self.hosts[k].wait_done.remote(0, k) for k in keys], timeout=30))
        except Exception:  # noqa: BLE001 - a sink is gone: not finished
            return False

    def _poll_failure(self) -> BaseException | None:
        """The first error any instance reports, or the error of a dead instance."""
        import ray

        refs = [h.status.remote(k) for k, h in self.hosts.items()]
        for ref in refs:
            try:
                st = ray.get(ref, timeout=30)
            except Exception as exc:  # noqa: BLE001 - the actor is gone
                return unwrap(exc)
            if st["error"] is not None:
                return st["error"]
        return None

    def _finish_failed(self, exc: BaseException) -> None:
        if not isinstance(exc, StepError):
            exc = StepError("?", -1, "-", f"{type(exc).__name__}: {exc}")
        if self.recoveries:  # a new error, so that its message carries the note too
            exc = StepError(exc.step_id, exc.instance, exc.record,
                            f"{exc.reason} (after {len(self.recoveries)} recoveries)")
        self.error = exc
        self.state = "FAILED"
        try:
            self._collect()
        except Exception:  # noqa: BLE001 - keep the first error
            pass
        self.finished_at = time.time()
        self._teardown()
        raise exc

    def _collect(self) -> None:
        import ray

        if self.coordinator is not None:
            self._latest = ray.get(self.coordinator.latest.remote())
            self._checkpoints = ray.get(self.coordinator.checkpoints.remote())
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
        for h in self.hosts.values():
            seen.setdefault(h._actor_id, h)
        return list(seen.values())

    def _members(self) -> dict[tuple[str, int], list[tuple[str, int]]]:
        """Chain head instance -> the instances its actor runs, head first."""
        out: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
        for key in self.plan.instances():
            out[(self.chains[key[0]], key[1])].append(key)
        return out

    def _teardown(self, keep_coordinator: bool = False) -> None:
        import ray

        actors = self.actors()
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
        """Records a :class:`CollectSink` step received, instance 0 first."""
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

            keys = list(self.hosts)
            live = ray.get([self.hosts[k].status.remote(k) for k in keys])
            per = {k: st["counters"] for k, st in zip(keys, live)}
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

    def throughput(self, step_id: str | None = None) -> float:
        """Records / (last outTime - first inTime), over the sinks (or one sink step)."""
        m = self.metrics()
        sinks = [s.step_id for s in self.flow.steps if s.kind == "sink"]
        chosen = [step_id] if step_id else sinks
        n = sum(m[s]["records_in"] for s in chosen)
        first = min((m[s]["first_in_time"] or float("inf")) for s in chosen)
        last = max(m[s]["last_out_time"] for s in chosen)
        return n / (last - first) if last > first else 0.0


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
        resume_from: a completed checkpoint (``job.last_checkpoint()``) to start from.
        **overrides: configuration sections, e.g. ``stream={"batch_size": 1000}``.
    """
    config = config or load_config(**overrides)
    job = Job(flow, config).start(resume_from)
    if not background:
        job.wait(timeout_s)
    return job
