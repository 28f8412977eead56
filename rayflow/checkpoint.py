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
    """Inject barrier ``checkpoint_id`` at every source."""

    checkpoint_id: int


@dataclass(frozen=True)
class Complete:
    """Checkpoint ``checkpoint_id`` is complete: tell the tasks (sinks commit)."""

    checkpoint_id: int


@dataclass(frozen=True)
class Abort:
    """Checkpoint ``checkpoint_id`` will not complete (timeout, failure, task finished)."""

    checkpoint_id: int
    reason: str


@dataclass
class CompletedCheckpoint:
    checkpoint_id: int
    handles: dict[Task, Any]
    started: float
    finished: float

    @property
    def duration_s(self) -> float:
        return self.finished - self.started


@dataclass
class _Pending:
    checkpoint_id: int
    started: float
    acks: dict[Task, Any] = field(default_factory=dict)


class Coordinator:
    """Decides when checkpoints start, complete or abort.

    Args:
        tasks: every (step_id, instance) that must acknowledge.
        interval_s: time between the end of one checkpoint and the start of the next
            (0 disables periodic checkpoints).
        timeout_s: a checkpoint not complete after this long is aborted.
        first_id: the id of the next checkpoint (continues after a restore).
    """

    def __init__(self, tasks: set[Task], interval_s: float, timeout_s: float = 60.0,
                 first_id: int = 1, latest: CompletedCheckpoint | None = None):
        self.tasks = set(tasks)
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.next_id = first_id
        self.pending: _Pending | None = None
        self.latest = latest
        self.finished: set[Task] = set()
        self.last_end: float | None = None
        self.history: list[dict] = []

    def tick(self, now: float) -> list:
        """Time passes: maybe trigger, maybe time out."""
        if self.last_end is None:
            self.last_end = now
        if self.pending is not None:
            if now - self.pending.started > self.timeout_s:
                return [self._abort(now, "timeout")]
            return []
        if self.interval_s <= 0 or self.finished:
            return []  # a finished source cannot inject barriers any more
        if now - self.last_end >= self.interval_s:
            self.pending = _Pending(self.next_id, now)
            self.next_id += 1
            return [Trigger(self.pending.checkpoint_id)]
        return []

    def ack(self, checkpoint_id: int, task: Task, handle: Any, now: float | None = None) -> list:
        """``task`` snapshotted its state for ``checkpoint_id``."""
        p = self.pending
        if p is None or p.checkpoint_id != checkpoint_id or task not in self.tasks:
            return []  # late ack of an aborted checkpoint: ignore
        p.acks[task] = handle
        if set(p.acks) == self.tasks:
            end = p.started if now is None else now
            self.latest = CompletedCheckpoint(checkpoint_id, dict(p.acks), p.started, end)
            self.history.append({"id": checkpoint_id, "duration_s": end - p.started,
                                 "status": "completed"})
            self.pending = None
            self.last_end = end
            return [Complete(checkpoint_id)]
        return []

    def task_finished(self, task: Task, now: float) -> list:
        """``task`` reached end of stream; a checkpoint still waiting for it cannot finish."""
        self.finished.add(task)
        if self.pending is not None and task not in self.pending.acks:
            return [self._abort(now, f"{task[0]}[{task[1]}] finished")]
        return []

    def failure(self, now: float) -> list:
        """A task failed: abort what is in flight; the caller restores ``latest``."""
        if self.pending is not None:
            return [self._abort(now, "failure")]
        return []

    def _abort(self, now: float, reason: str) -> Abort:
        p = self.pending
        assert p is not None
        self.history.append({"id": p.checkpoint_id, "duration_s": now - p.started,
                             "status": f"aborted: {reason}"})
        self.pending = None
        self.last_end = now
        return Abort(p.checkpoint_id, reason)
