"""Interfaces of sources and sinks. Their live parts run inside the runtime's actors."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayflow.core.operators import DeadLetter, Rescaled, StepContext
from rayflow.core.records import Items


class SourceReader:
    """One parallel instance of a source."""

    def poll(self, max_records: int, timeout_s: float) -> tuple[Items, np.ndarray | None] | None:
        """Up to ``max_records`` records (and their event times), waiting at most
        ``timeout_s`` for the first; None when nothing arrived."""
        raise NotImplementedError

    @property
    def exhausted(self) -> bool:
        """True once a bounded source has delivered everything."""
        return False

    def snapshot(self) -> Any:
        """Position to resume from (e.g. Kafka offsets)."""
        return None

    def close(self) -> None:
        """Release clients and files."""


class SplitEnumerator:
    """Hands a source's splits (files, ...) to its readers on request: Flink's
    ``SplitEnumerator`` (FLIP-27). The runtime keeps one per source step beside the job's
    coordinator; a reader asks through ``ctx.splits`` whenever it runs low, so a faster
    reader takes more work and all readers finish together. Pure logic: no Ray.

    Its state is not checkpointed: :meth:`SourceSpec.enumerator` rebuilds it from the
    readers' snapshots (what they finished), so a split handed out but not finished before
    a failure is handed out again.
    """

    def assign(self, instance: int) -> list | None:
        """Splits for reader ``instance``: a list (empty when there are none just now, e.g.
        a watched directory), or None when there will never be more."""
        raise NotImplementedError


class LocalSplits:
    """``ctx.splits`` for readers that share an enumerator in one process (tests, tools):
    each request is answered at once."""

    def __init__(self, enumerator: SplitEnumerator, instance: int):
        self.enumerator, self.instance = enumerator, instance

    def request(self) -> Future:
        f: Future = Future()
        f.set_result(self.enumerator.assign(self.instance))
        return f


def guided_chunk(remaining: int, parallelism: int, cap: int = 1024) -> int:
    """How many of ``remaining`` splits one request takes: OpenMP's *guided* schedule,
    ``ceil(remaining / 2p)`` (at least 1, at most ``cap``). Large chunks early keep requests
    few (about ``2p·ln(n/2p)`` for ``n`` splits); small ones at the end let the readers
    finish within one split of each other."""
    return max(1, min(cap, -(-remaining // (2 * max(parallelism, 1)))))


class SourceSpec:
    """Picklable description of a source."""

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        raise NotImplementedError

    def enumerator(self, parallelism: int, restored: list[Any]) -> SplitEnumerator | None:
        """The step's :class:`SplitEnumerator`, or None (the default) when each reader finds
        its own share (Kafka partitions, a static split). ``restored`` holds the resume
        state of every instance of the checkpoint restored from (empty on a fresh start)."""
        return None


#: The epoch id of what a sink holds at its end of stream (after its last barrier): it is
#: committed with the first checkpoint that holds the sink's final state.
FINAL_EPOCH = 2**62


class SinkWriter:
    """One parallel instance of a sink."""

    #: ``commit`` may run on the control thread while ``write`` and ``snapshot`` go on (one
    #: commit at a time): a writer that sends a whole epoch at its commit sets it, so that the
    #: next epoch's records and barrier do not wait for that.
    commits_beside_writes: bool = False

    def write(self, items: Items, event_times: np.ndarray | None,
              in_time: float) -> list[DeadLetter] | None:
        """Write a batch; the records it could not write (too large, say), as dead letters
        the pipeline goes on without, or None."""
        raise NotImplementedError

    def flush(self) -> None:
        """Make everything written so far durable/visible."""

    def snapshot(self, checkpoint_id: int) -> Any:
        """Pre-commit at a checkpoint barrier; the return value is restored into ``build``.
        By default: flush, so that nothing before the barrier can be lost."""
        self.flush()
        return None

    def commit(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: make its output visible (two-phase
        commit). A no-op for sinks whose writes are visible at once."""

    def uncommitted(self) -> bool:
        """Whether it holds output that waits for a checkpoint to complete (two-phase
        commit sinks); the task stays alive until it is committed."""
        return False

    def result(self) -> Any:
        """What the driver may fetch after the run (the collecting sink's records)."""
        return None

    def close(self) -> None:
        """Release clients and files."""


@dataclass(frozen=True)
class RunState:
    """A sink's checkpointed state that only a recovery of the run that saved it restores:
    what that run delivered (a collecting sink's records, an image sink's counts). A new
    job resumed from the checkpoint (a savepoint, a rescale) starts afresh."""

    run: str
    value: Any


def restored_by_run(resume_state: Any, ctx: StepContext) -> list:
    """The values of :class:`RunState` snapshots that instance ``ctx`` restores: its own in a
    recovery of the run that saved it; across a change of parallelism, instance 0 takes
    every old instance's."""
    if isinstance(resume_state, Rescaled):
        handles = list(resume_state.handles) if ctx.instance == 0 else []
    else:
        handles = [resume_state]
    return [h.value for h in handles if isinstance(h, RunState) and h.run == ctx.run_id]


class SinkSpec:
    """Picklable description of a sink."""

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        raise NotImplementedError
