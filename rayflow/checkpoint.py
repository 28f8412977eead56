"""The checkpoint coordinator as a pure state machine: events in, actions out. No Ray.

Aligned-barrier checkpoints (Chandy-Lamport as in Flink's asynchronous barrier snapshots):
the coordinator asks every source to inject barrier ``n``; each task snapshots its state when
barrier ``n`` has arrived on all its inputs and acknowledges with a state handle; checkpoint
``n`` is complete when every task has acknowledged, and then sinks may commit (two-phase
commit). One checkpoint is in flight at a time.

    >>> c = Coordinator(tasks={("src", 0), ("sink", 0)}, interval_s=1.0)
    >>> c.tick(0.0)
    []
    >>> c.tick(1.0)
    [Trigger(checkpoint_id=1)]
    >>> c.ack(1, ("src", 0), {"offset": 5})
    []
    >>> c.ack(1, ("sink", 0), None)
    [Complete(checkpoint_id=1)]
    >>> c.latest.handles[("src", 0)]
    {'offset': 5}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Task = tuple[str, int]


@dataclass(frozen=True)
class Trigger:
    """Inject barrier ``checkpoint_id`` at every source that is still running
    (``stop_after``: a savepoint, after which the sources end their streams)."""

    checkpoint_id: int
    stop_after: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class Complete:
    """Checkpoint ``checkpoint_id`` is durable and complete: tell the tasks (sinks commit).
    ``final`` names the tasks whose part of it is their final state (they had finished), so
    their sinks commit everything they hold."""

    checkpoint_id: int
    final: frozenset = field(default=frozenset(), repr=False)


@dataclass(frozen=True)
class Abort:
    """Checkpoint ``checkpoint_id`` will not complete (timeout, failure)."""

    checkpoint_id: int
    reason: str


@dataclass
class CompletedCheckpoint:
    """What a restore needs: every task's state handle. ``finished`` are the tasks whose
    handle is their final state; ``path`` is where the checkpoint store keeps it (None
    until written)."""

    checkpoint_id: int
    handles: dict[Task, Any]
    started: float
    finished: float
    finished_tasks: frozenset = frozenset()
    savepoint: bool = False
    drained: frozenset = frozenset()  # finished tasks that flushed (not stopped at a savepoint)
    path: str | None = None
    meta: dict = field(default_factory=dict)  # job, plan, backend: see rayflow.checkpoint_store

    @property
    def duration_s(self) -> float:
        return self.finished - self.started

    @property
    def final(self) -> bool:
        """Every task had finished: resuming from it runs nothing more."""
        return bool(self.handles) and set(self.finished_tasks) == set(self.handles)


@dataclass
class _Pending:
    checkpoint_id: int
    started: float
    savepoint: bool = False
    acks: dict[Task, Any] = field(default_factory=dict)
    final: set = field(default_factory=set)  # the tasks whose ack is their final state
    acked_s: dict[Task, float] = field(default_factory=dict)  # seconds from start to each ack


class Coordinator:
    """Decides when checkpoints start, complete or abort.

    Finished tasks take part in every later checkpoint with their final state (as Flink's
    FLIP-147 does), so checkpoints and savepoints go on after a bounded source has ended,
    and once every task has finished a *final* checkpoint completes by itself: the sinks
    commit their last epoch only then, so a failure before it never leaves an epoch that a
    restore would commit again.

    Args:
        tasks: every (step_id, instance) that must acknowledge.
        interval_s: time from the start of one checkpoint to the start of the next, as
            Flink's checkpoint interval: a checkpoint that takes longer is followed by the
            next as soon as it ends, unless ``min_pause_s`` says otherwise (0 disables
            periodic checkpoints; savepoints and the final one still happen).
        timeout_s: a checkpoint not complete after this long is aborted.
        first_id: the id of the next checkpoint (continues after a restore).
        latest: the checkpoint restored from, if any.
        sources: the tasks that inject barriers (all ``tasks`` when None).
        min_pause_s: time from the end of one checkpoint (or an abort) to the start of
            the next, at least (Flink's ``min-pause``).
    """

    def __init__(self, tasks: set[Task], interval_s: float, timeout_s: float = 60.0,
                 first_id: int = 1, latest: CompletedCheckpoint | None = None,
                 sources: set[Task] | None = None, min_pause_s: float = 0.0):
        self.tasks = set(tasks)
        self.sources = set(tasks if sources is None else sources)
        self.interval_s, self.timeout_s, self.min_pause_s = interval_s, timeout_s, min_pause_s
        self.next_id = first_id
        self.pending: _Pending | None = None
        self.latest = latest
        self.finished: dict[Task, Any] = {}  # task -> its final state handle
        self.drained: set[Task] = set()  # finished tasks that flushed their open state
        self.last_start: float | None = None  # of the last checkpoint started (or aborted)
        self.last_end: float | None = None
        self.history: list[dict] = []

    @property
    def live_sources(self) -> set[Task]:
        return self.sources - set(self.finished)

    @property
    def done(self) -> bool:
        """Every task finished and the final checkpoint completed."""
        return self.latest is not None and self.latest.final and \
            set(self.finished) == self.tasks

    def tick(self, now: float) -> list:
        """Time passes: maybe trigger, maybe time out."""
        if self.last_start is None:
            self.last_start = now
        if self.last_end is None:
            self.last_end = now
        if self.pending is not None:
            if now - self.pending.started > self.timeout_s:
                return [self._abort(now, "timeout")]
            return []
        if self.interval_s <= 0 or not self.live_sources:
            return []  # no barrier can be injected once every source has finished
        if now - self.last_start >= self.interval_s and now - self.last_end >= self.min_pause_s:
            return self._start(now)
        return []

    def trigger(self, now: float, savepoint: bool = False) -> list:
        """Start a checkpoint now (a savepoint: the sources end after it), unless one is in
        flight; then the caller waits for that one and asks again."""
        if self.pending is not None or self.done:
            return []
        if not self.live_sources and set(self.finished) != self.tasks:
            return []  # sources done, the rest still finishing: the final checkpoint follows
        return self._start(now, savepoint)

    def _start(self, now: float, savepoint: bool = False) -> list:
        self.last_start = now
        self.pending = _Pending(self.next_id, now, savepoint, dict(self.finished),
                                set(self.finished))
        self.next_id += 1
        acts: list = []
        if self.live_sources:
            acts.append(Trigger(self.pending.checkpoint_id, savepoint))
        return acts + self._maybe_complete(now)

    def ack(self, checkpoint_id: int, task: Task, handle: Any, now: float | None = None) -> list:
        """``task`` snapshotted its state for ``checkpoint_id``."""
        p = self.pending
        if p is None or p.checkpoint_id != checkpoint_id or task not in self.tasks:
            return []  # late ack of an aborted checkpoint: ignore
        if task in self.finished:
            return []  # its final state stands in for it already
        p.acks[task] = handle
        now = p.started if now is None else now
        p.acked_s[task] = now - p.started
        return self._maybe_complete(now)

    def task_finished(self, task: Task, now: float, handle: Any = None,
                      drained: bool = True) -> list:
        """``task`` reached the end of its stream; ``handle`` is its final state. A checkpoint
        in flight that it had not acknowledged takes the final state: everything the task
        did lies before any barrier it could still have seen."""
        if task not in self.tasks:
            return []
        self.finished[task] = handle
        if drained:
            self.drained.add(task)
        p = self.pending
        if p is not None and task not in p.acks:
            p.acks[task] = handle
            p.final.add(task)
            return self._maybe_complete(now)
        if p is None and set(self.finished) == self.tasks and not (
                self.latest is not None and self.latest.final):
            return self._start(now)  # everything finished: the final checkpoint
        return []

    def failure(self, now: float) -> list:
        """A task failed: abort what is in flight; the caller restores ``latest``."""
        if self.pending is not None:
            return [self._abort(now, "failure")]
        return []

    def restart(self, tasks: set[Task], now: float) -> list:
        """``tasks`` (a failover region) restart from ``latest``; the other tasks go on.
        What is in flight aborts: it waits for acks the restarted tasks will not send. The
        restarted tasks count as running again until they report their end anew."""
        acts = self.failure(now)
        for task in tasks:
            self.finished.pop(task, None)
            self.drained.discard(task)
        return acts

    def _maybe_complete(self, now: float) -> list:
        p = self.pending
        if p is None or set(p.acks) != self.tasks:
            return []
        final = frozenset(p.final)
        self.latest = CompletedCheckpoint(p.checkpoint_id, dict(p.acks), p.started, now,
                                          final, p.savepoint,
                                          frozenset(final & self.drained))
        self.history.append({"id": p.checkpoint_id, "duration_s": now - p.started,
                             "status": "completed", "acked_s": _per_task(p.acked_s),
                             "inflight_batches": _inflight(p.acks)})
        self.pending = None
        self.last_end = now
        acts: list = [Complete(p.checkpoint_id, final)]
        if set(self.finished) == self.tasks and not self.latest.final:
            acts += self._start(now)  # the last tasks finished during it: the final one
        return acts

    def _abort(self, now: float, reason: str) -> Abort:
        p = self.pending
        assert p is not None
        self.history.append({"id": p.checkpoint_id, "duration_s": now - p.started,
                             "status": f"aborted: {reason}", "acked_s": _per_task(p.acked_s)})
        self.pending = None
        self.last_end = self.last_start = now  # a full interval before the next try
        return Abort(p.checkpoint_id, reason)


def _inflight(acks: dict[Task, Any]) -> int:
    """Batches an unaligned checkpoint holds in flight (its channel state; 0 when aligned)."""
    return sum(len(msgs) for h in acks.values()
               for msgs in (getattr(h, "inflight", None) or {}).values())


def _per_task(acked_s: dict[Task, float]) -> dict[str, float]:
    """When each task acknowledged, in seconds from the checkpoint's start, by
    ``"step[instance]"`` (as Flink's checkpoint statistics per subtask): where a slow
    checkpoint waited. Finished tasks, whose final state stands in for an ack, are absent."""
    return {f"{step}[{i}]": round(t, 4) for (step, i), t in sorted(acked_s.items())}
