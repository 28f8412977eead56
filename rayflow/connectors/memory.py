"""In-memory and generated sources, and the collecting and discarding sinks.

    >>> src = MemorySource([1, 2, 3])
    >>> sink = CollectSink()
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayflow.core.connectors import (
    RunState,
    SinkSpec,
    SinkWriter,
    SourceReader,
    SourceSpec,
    restored_by_run,
)
from rayflow.core.operators import Rescaled, StepContext
from rayflow.core.records import Items, concat, num_rows
from rayflow.errors import ConfigError, check_number


def _no_rescale(spec: SourceSpec, resume_state: Any) -> None:
    if isinstance(resume_state, Rescaled):
        raise ConfigError(
            f"{type(spec).__name__} cannot change parallelism from a checkpoint (its positions "
            f"are per instance); keep its parallelism, or use a partitioned source like Kafka"
        )


@dataclass(frozen=True)
class MemorySource(SourceSpec):
    """Records from a list (or numpy array / Arrow table), split evenly over the instances.

    Instance ``i`` of ``n`` reads the ``i``-th contiguous slice, so order within an instance
    is the input order. Event times are the time of reading.
    """

    records: Any

    def __post_init__(self):
        try:
            num_rows(self.records)
        except TypeError:
            raise ValueError(f"MemorySource: records must be a list, a numpy array or an "
                             f"Arrow table, got {type(self.records).__name__}") from None

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        _no_rescale(self, resume_state)
        n = num_rows(self.records)
        lo, hi = n * ctx.instance // ctx.parallelism, n * (ctx.instance + 1) // ctx.parallelism
        return _SliceReader(self.records[lo:hi], int(resume_state or 0))


class _SliceReader(SourceReader):
    def __init__(self, records: Items, pos: int):
        self.records, self.pos, self.n = records, pos, num_rows(records)

    def poll(self, max_records, timeout_s):
        if self.pos >= self.n:
            return None
        lo, self.pos = self.pos, min(self.n, self.pos + max_records)
        return self.records[lo : self.pos], None

    @property
    def exhausted(self) -> bool:
        return self.pos >= self.n

    def snapshot(self) -> int:
        return self.pos


@dataclass(frozen=True)
class GeneratorSource(SourceSpec):
    """Records made by ``make(i)`` for i = 0, 1, ... (per instance), optionally at a rate.

    Args:
        make: builds record ``i`` (a global sequence number: instance k of n makes
            k, k + n, k + 2n, ...). With ``columnar=True`` it gets an int64 array of
            sequence numbers and returns a whole batch (numpy/Arrow).
        count: total records over all instances; None means unbounded (runs until stopped).
        rate: target records/s over all instances; None means as fast as possible. Under a
            rate each record's event time is the moment it was due, so latency includes any
            time the pipeline held the source back.
        columnar: see ``make``.
        timestamps: sequence numbers (an int64 array) -> their records' event times in
            seconds (an array as long): one call per batch, so that ``EventTime()`` needs no
            per-record timestamp function. They take the place of a rate's due times.
    """

    make: Callable[[Any], Any]
    count: int | None = None
    rate: float | None = None
    columnar: bool = False
    timestamps: Callable[[np.ndarray], Any] | None = None

    def __post_init__(self):
        if self.count is not None and (isinstance(self.count, bool) or not isinstance(
                self.count, numbers.Integral) or self.count < 0):
            raise ValueError(f"GeneratorSource: count must be an int >= 0 or None, got "
                             f"{self.count!r}")
        check_number("GeneratorSource", "rate", self.rate, or_none=True)

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        _no_rescale(self, resume_state)
        return _GeneratorReader(self, ctx, int(resume_state or 0))


class _GeneratorReader(SourceReader):
    def __init__(self, spec: GeneratorSource, ctx: StepContext, done: int):
        self.spec, self.k, self.n = spec, ctx.instance, ctx.parallelism
        self.total = None
        if spec.count is not None:
            self.total = len(range(self.k, spec.count, self.n))
        self.done = done
        self.rate = spec.rate / self.n if spec.rate else None
        self.t0: float | None = None  # the schedule starts at the first poll, not at build

    def poll(self, max_records, timeout_s):
        if self.t0 is None:
            self.t0 = time.time() - (self.done / self.rate if self.rate else 0.0)
        want = max_records
        if self.total is not None:
            want = min(want, self.total - self.done)
        times = None
        if self.rate:
            now = time.time()
            due = int((now - self.t0) * self.rate) - self.done
            if due <= 0:
                # sleep until the next record is due, but never past the poll timeout
                time.sleep(min(timeout_s, (self.done + 1) / self.rate - (now - self.t0)))
                due = int((time.time() - self.t0) * self.rate) - self.done
                if due <= 0:
                    return None
            want = min(want, due)
            times = self.t0 + (np.arange(self.done, self.done + want) + 1) / self.rate
        if want <= 0:
            return None
        seq = self.k + self.n * np.arange(self.done, self.done + want, dtype=np.int64)
        if self.spec.timestamps is not None:
            times = np.asarray(self.spec.timestamps(seq), dtype=np.float64)
            if times.shape != seq.shape:
                raise ValueError(f"GeneratorSource: timestamps gave {times.shape} times for "
                                 f"{seq.size} records")
        self.done += want
        if self.spec.columnar:
            return self.spec.make(seq), times
        make = self.spec.make
        return [make(i) for i in seq.tolist()], times

    @property
    def exhausted(self) -> bool:
        return self.total is not None and self.done >= self.total

    def snapshot(self) -> int:
        return self.done


@dataclass(frozen=True)
class CollectSink(SinkSpec):
    """Keeps every record in the sink instance; ``job.collect(step_id)`` fetches them.

    The records are part of the sink's checkpointed state: a job that recovers from a
    failure (a killed actor) restores what each instance had collected at the checkpoint
    it restarts from, and the replay adds the rest, so the guarantee of the job holds for
    what ``collect`` returns (exactly-once: every record once). Each snapshot holds every
    record collected so far: this sink is for results that fit in memory (tests, examples,
    small jobs). A new job resumed from a savepoint (a rescale too) collects afresh: each
    job's ``collect`` returns what that job received."""

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        return _CollectWriter(ctx, resume_state)


class _CollectWriter(SinkWriter):
    def __init__(self, ctx: StepContext, resume_state: Any = None):
        self.run = ctx.run_id
        # a recovery of this run restores what was collected; another job's snapshot (a
        # resume from a savepoint) is that job's output, not this one's
        self.parts: list = [r for r in restored_by_run(resume_state, ctx) if num_rows(r)]

    def write(self, items, event_times, in_time):
        self.parts.append(items)

    def snapshot(self, checkpoint_id: int) -> RunState:
        if len(self.parts) > 1:
            self.parts = [concat(self.parts)]
        return RunState(self.run, self.parts[0] if self.parts else [])

    def result(self) -> Items:
        return concat(self.parts)


@dataclass(frozen=True)
class DiscardSink(SinkSpec):
    """Drops every record (counts and latency are still measured by the runtime)."""

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        return _DiscardWriter()


class _DiscardWriter(SinkWriter):
    def write(self, items, event_times, in_time):
        pass
