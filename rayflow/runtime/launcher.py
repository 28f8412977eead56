"""The job's actors: build, place, wire and start every instance, and tear them down.

:class:`Launcher` is the lowest of the three layers of a job's driver-side handle
(``Launcher`` -> ``Supervisor`` in ``supervisor.py`` -> ``Job`` in ``job.py``). It owns
the actors (``hosts``: every instance's actor, ``coordinator``) and how they are made:
placement (SPREAD over nodes, per-step actor options), the resume state each instance
gets (a checkpoint's handles, rescaled handles, at-most-once positions, in-flight batches
to replay) and the sources' split enumerators. It makes no decision about failures.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from rayflow.config import CheckpointOptions, RayflowConfig
from rayflow.core.operators import Rescaled, StepContext, describe_exception
from rayflow.dataflow import Dataflow
from rayflow.errors import START_UP, StepError
from rayflow.operators.watermarks import split_position
from rayflow.runtime.channel import unwrap
from rayflow.runtime.plan import chains, make_plan

if TYPE_CHECKING:
    from rayflow.state import StateBackend

EXIT_GRACE_S = 10.0  # a job that ended well: how long its actors may take to exit by themselves
log = logging.getLogger(__name__)


class Launcher:
    """The actors of one run of a flow, and how they are built and torn down."""

    def __init__(self, flow: Dataflow, config: RayflowConfig):
        self.flow, self.config = flow, config
        self.plan = make_plan(flow)
        self.chains = chains(flow, config.stream.chaining)  # step -> the step it runs with
        self.hosts: dict[tuple[str, int], Any] = {}
        self._runs: dict[Any, tuple[str, int]] = {}  # a source's run() -> its instance
        self.coordinator: Any = None
        self.run_id = uuid.uuid4().hex[:12]  # one per run; recoveries keep it
        self.store_root: str | None = None  # the run's durable checkpoints
        self._coupled: set[str] = set()  # source steps whose readers share an enumerator
        self._attempt = -1  # counts the starts: the first, then each recovery

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
                 durable_positions=chk.processing_guarantee == "at_most_once",
                 min_pause_s=chk.min_pause_s)

    def _spawn(self, latest: Any, first_id: int, positions: dict, fresh_state: bool = False,
               recovering: bool = False, only: frozenset | None = None) -> None:
        """Build, wire and start every instance (``only`` those of one failover region; the
        others run on). ``fresh_state``: operators start empty (at-most-once recovery: the
        sources resume past what already left, so old state would emit records a second
        time); sinks keep what they delivered. While ``recovering``, a failure is raised as
        it is, for the supervisor to try again."""
        import ray

        from rayflow.runtime.coordinator import SplitClient
        from rayflow.runtime.host import StepHost
        from rayflow.runtime.inflight import dead_letters_of, replay, state_of

        # channels: some step runs in an actor of its own, fed by others (not all chained)
        channels = any(self.chains[s.step_id] == s.step_id and s.kind != "source"
                       for s in self.flow.steps)
        opts, chk = self.config.job_stream(channels), self.config.checkpoint
        backend = backend_of(chk)
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
        # before any reader is built (a reader asks for its first splits as it is built):
        # from now on the coordinator drops what the replaced instances still send (a
        # request for splits from a killed reader would take files nobody reads)
        self._attempt += 1
        ray.get(self.coordinator.start_attempt.remote(
            self._attempt, [k for k in self.plan.instances() if only is None or k in only],
            enumerators, only is not None))
        for key in self.plan.instances():
            if only is not None and key not in only:
                continue
            step_id, i = key
            step = steps[step_id]
            ctx = StepContext(step_id, i, step.parallelism, self.flow.name, backend,
                              chk.processing_guarantee, self.run_id,
                              SplitClient(self.coordinator, step_id, i, self._attempt)
                              if step_id in enumerators else None, self._attempt)
            resume = handles_in.get(key)
            if old_par.get(step_id, step.parallelism) != step.parallelism:
                n_old = old_par[step_id]
                resume = Rescaled(tuple(handles_in.get((step_id, j)) for j in range(n_old)),
                                  n_old)
            if step.kind == "source" and key in positions:
                resume = positions[key]  # at-most-once: never replay what already left
            elif fresh_state and step.kind == "operator":
                # (a sink keeps its state: what it delivered, such as a collecting sink's
                # records, which nothing emits again)
                resume = None
            dead = dead_letters_of(checkpointed.get(key))
            if dead is not None and not isinstance(resume, Rescaled):
                # the dead letters made up to the checkpoint (a recovery of this run keeps
                # them, even where the state starts empty)
                resume = dataclasses.replace(dead, state=resume)
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
        raise error from None

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
        dead. ``clean`` (a job that ended well): each actor, the coordinator too, first
        exits by itself, so that Ray exports its last metrics and no call reaches an actor
        while Ray takes it down; one still alive after EXIT_GRACE_S is killed."""
        actors = self.actors()
        if not keep_coordinator and self.coordinator is not None:
            actors.append(self.coordinator)
            self.coordinator = None
        if clean:
            exit_or_kill(actors, EXIT_GRACE_S)
        else:
            kill(actors)
        self.hosts.clear()
        self._runs = {}


def backend_of(checkpoint: CheckpointOptions) -> StateBackend:
    """The state backend the ``checkpoint`` settings name, with their options."""
    from rayflow.state import backend_from_name

    return backend_from_name(checkpoint.state_backend, checkpoint.state_dir,
                             rocksdb_cache_entries=checkpoint.rocksdb_cache_entries)


def _spread_nodes() -> list[str]:
    """IDs of the alive nodes with CPUs, in a stable order (empty on a single node)."""
    import ray

    nodes = sorted(n["NodeID"] for n in ray.nodes()
                   if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0)
    return nodes if len(nodes) > 1 else []


def exit_or_kill(handles: list[Any], grace_s: float) -> list[Any]:
    """Ask each actor to exit by itself (its ``exit`` method), wait up to ``grace_s`` for
    them all, and kill those still there: the ones killed.

    An exit call's result comes (as the actor's death) once the actor has gone, so waiting
    on those sends an exiting actor no more calls (polling one while it shut down made Ray
    print a C++ trace). An actor whose exit came back gets no ``ray.kill`` either: a second
    exit signal can leave a threaded actor's process stuck in its shutdown for good."""
    import ray

    exits: dict = {}
    for h in handles:
        try:
            exits[h.exit.remote()] = h
        except Exception:  # noqa: BLE001 - already gone
            pass
    done: set = set()
    if exits:
        ready, _ = ray.wait(list(exits), num_returns=len(exits), timeout=grace_s)
        done = {id(exits[ref]) for ref in ready}
    stuck = [h for h in handles if id(h) not in done]
    kill(stuck)
    return stuck


def kill(handles: list[Any]) -> None:
    """Kill these actors and return once every one is gone (ray.kill is asynchronous), so
    that no call reaches an old instance after this."""
    import ray

    for h in handles:
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
    wait_dead(handles, timeout_s=30.0)


def wait_dead(handles: list[Any], timeout_s: float) -> None:
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

