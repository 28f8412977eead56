"""The operator-host actor: one per chain of step instances (see :mod:`rayflow.runtime.plan`
for what chains), each instance a task of :mod:`rayflow.runtime.tasks` (a source, an operator
or a sink).

Methods run in concurrency groups of their own (listed at :class:`StepHost`), so a host
that is blocked by backpressure still answers the job, and a barrier never queues behind a
commit for a thread. Actors reserve ``stream.actor_num_cpus`` CPUs (default 0): a stream's
steps mostly wait on each other and on I/O, and with 1 CPU each a graph larger than the
core count would never be scheduled.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import ray

from rayflow._log import worker_logging
from rayflow.config import RayflowConfig, StreamOptions, set_current
from rayflow.core.connectors import SinkSpec
from rayflow.core.operators import StepContext, describe_exception
from rayflow.core.records import Batch
from rayflow.dataflow import Step
from rayflow.errors import START_UP, StepError
from rayflow.runtime.tasks import SourceTask, StepTask, make_task


def tune_gc(options: StreamOptions) -> None:
    """The garbage collector of a step actor's process, as ``stream.gc_threshold`` and
    ``stream.gc_freeze`` say (the steps are built: what is alive now stays alive)."""
    if options.gc_threshold is not None:
        gc.set_threshold(*options.gc_threshold)
    if options.gc_freeze:
        gc.freeze()


# (Ray's overloads of remote() omit concurrency_groups)
@ray.remote(concurrency_groups={"data": 1, "barrier": 1, "commit": 2, "wait": 4,  # type: ignore[call-overload]
                                "control": 3})
class StepHost:
    """The actor of one chain of step instances: its head (a source, or an instance fed by
    other actors) and the instances chained to it, which take their input from the previous
    member by a plain call, as Flink's operator chaining does: no serialization, no Ray call,
    no channel between them. Methods address a member by its key; the head by default.

    Methods run in concurrency groups, each with threads of its own, so that nothing slow
    holds up a barrier: ``data`` (one thread: the source loop, or ``push`` calls in arrival
    order), ``barrier`` (an unaligned checkpoint's barrier, out of band), ``commit``
    (checkpoint notifications: a sink's commit, which may take long; a second thread folds
    the notifications that arrive meanwhile into the next one), ``wait`` (the job's waits
    for its sinks to finish, which block until then) and ``control`` (status, stop,
    triggers, results).
    """

    def __init__(self, members: list[tuple[Step, StepContext, Any]], options: StreamOptions,
                 dead_letter_sink: SinkSpec | None = None, coordinator: Any = None,
                 tick_s: float = 0.2, config: RayflowConfig | None = None,
                 replay: dict | None = None):
        set_current(config)  # what code inside the steps reads: the job's, not this node's
        worker_logging()
        self.tasks: dict[tuple[str, int], StepTask] = {}
        # A step that fails to build (no such topic, no broker, no directory) must not kill
        # the actor: Ray would report a dead actor with the cause deep in its tracebacks.
        # connect() raises the one StepError instead.
        self.start_error: StepError | None = None
        # one message at a time: a push, or an overtaking barrier's snapshot
        self._data = threading.Lock()
        chk = config.checkpoint if config is not None else None
        unaligned = bool(chk is not None and chk.unaligned and coordinator is not None)
        replay = replay or {}
        for step, ctx, resume in members:
            key = (ctx.step_id, ctx.instance)
            try:
                self.tasks[key] = make_task(step, ctx, options, dead_letter_sink, resume,
                                            coordinator, tick_s, unaligned, replay.get(key))
            except Exception as exc:  # noqa: BLE001 - any build error, reported once
                self.start_error = StepError(ctx.step_id, ctx.instance, START_UP,
                                             describe_exception(exc))
                break
        self.head = next(iter(self.tasks.values()), None)
        tune_gc(options)

    def _task(self, key: tuple[str, int] | None) -> StepTask:
        # (a key comes back from Ray as a list; a built actor has a head)
        return self.head if key is None else self.tasks[tuple(key)]  # type: ignore[return-value,index]

    def connect(self, outputs: dict, handles: dict[str, list[Any]], inputs: dict) -> bool:
        if self.start_error is not None:
            raise self.start_error
        for key, task in self.tasks.items():
            task.connect(outputs[key], handles, inputs[key], self.tasks)
        return True

    def mark_restored_final(self, keys: list) -> bool:
        """These members were restored from their final state (they had finished)."""
        for key in keys:
            self.tasks[tuple(key)].restored_final = True
        return True

    @ray.method(concurrency_group="data")
    def run(self) -> dict:
        assert isinstance(self.head, SourceTask), "run() is the source loop of a source's host"
        return self.head.run()

    @ray.method(concurrency_group="data")
    def push(self, msg: Any, sender: tuple[str, int], seq: int,
             target: tuple[str, int] | None = None) -> float | None:
        task = self._task(target)
        if task.unaligned and task.emitter is not None and isinstance(msg, Batch):
            # held back by a slow receiver: wait here, outside the lock, where an overtaking
            # barrier may snapshot
            task.emitter.wait_for_room()
        with self._data:
            return task.push(msg, sender, seq)

    @ray.method(concurrency_group="barrier")
    def barrier(self, checkpoint_id: int, sender: tuple[str, int], seq: int,
                target: tuple[str, int] | None = None) -> None:
        """An unaligned checkpoint's barrier, out of band: it follows message ``seq - 1``
        of the channel from ``sender``, which may still be queued here."""
        with self._data:
            self._task(target).on_overtaking_barrier(checkpoint_id, (sender[0], sender[1]))

    @ray.method(concurrency_group="data")
    def replay(self) -> bool:
        """Handle what the restored checkpoint held in flight to these tasks."""
        with self._data:
            for task in self.tasks.values():
                task.replay()
        return True

    @ray.method(concurrency_group="control")
    def trigger_checkpoint(self, checkpoint_id: int, stop_after: bool = False) -> None:
        # (None: its step failed to build, the job is failing)
        if isinstance(self.head, SourceTask):
            self.head.trigger_checkpoint(checkpoint_id, stop_after)

    @ray.method(concurrency_group="commit")
    def notify_complete(self, checkpoint_id: int, final: frozenset = frozenset()) -> None:
        for task in self.tasks.values():
            task.notify_complete(checkpoint_id, final)

    @ray.method(concurrency_group="control")
    def release_snapshots(self) -> None:
        for task in self.tasks.values():
            task.release_snapshots()

    @ray.method(concurrency_group="control")
    def stop(self) -> None:
        if self.head is not None:
            self.head.stop()

    @ray.method(concurrency_group="control")
    def exit(self) -> None:
        """End this actor's process the clean way: on the way out Ray sends its last
        metrics (ray.kill may cut the process off first, losing the final counts)."""
        ray.actor.exit_actor()

    @ray.method(concurrency_group="control")
    def status(self, key: tuple[str, int] | None = None) -> dict:
        return self._task(key).status()

    @ray.method(concurrency_group="wait")
    def wait_done(self, timeout_s: float | None = None,
                  key: tuple[str, int] | None = None) -> bool | BaseException:
        return self._task(key).wait_done(timeout_s)

    @ray.method(concurrency_group="control")
    def final(self, key: tuple[str, int] | None = None) -> dict:
        return self._task(key).final()
