"""The contract between a step's logic and the runtime that hosts it.

A *spec* is a small picklable description of a step, made by the user API. The runtime ships
it to each parallel instance and calls ``spec.build(ctx)`` there to get the live *logic*. The
logic has one hot method over a batch. Nothing here imports Ray.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayflow.core.records import Items, brief


@dataclass(frozen=True)
class StepContext:
    """What an instance knows about itself (cf. Flink's RuntimeContext)."""

    step_id: str
    instance: int
    parallelism: int
    job_name: str = "rayflow"
    state_backend: Any = None  # a rayflow.state.StateBackend; memory when None
    guarantee: str = "at_least_once"  # the job's processing guarantee
    run_id: str = ""  # unique per job run (survives recovery): keys commit markers
    # a source's link to its step's SplitEnumerator: ``splits.request()`` returns a
    # concurrent.futures.Future of ``enumerator.assign(instance)``; None without one
    splits: Any = None
    # which start of the job built this instance: 0 the first, one more at each recovery
    # (Flink's attempt number)
    attempt_number: int = 0


@dataclass(frozen=True)
class DeadLetter:
    """A record a step could not process, with what went wrong and where."""

    step_id: str
    instance: int
    reason: str
    record: Any
    where: str = ""

    def describe(self) -> str:
        loc = f" at {self.where}" if self.where else ""
        return f"{self.step_id}[{self.instance}]{loc}: {self.reason}: {brief(self.record)}"


@dataclass
class Output:
    """What a logic returns for one input batch."""

    items: Items
    event_times: np.ndarray | None
    dead: list[DeadLetter] = field(default_factory=list)
    side: dict[str, tuple[Items, np.ndarray | None]] = field(default_factory=dict)
    """Records for named side outputs (e.g. ``late``), with their event times."""
    expired: int = 0
    """Keys whose state the step removed because their time to live ran out (``ttl_s``);
    the runtime adds them to the step's ``state_expired`` counter."""


class Logic:
    """Live logic of one operator instance.

    Subclasses implement :meth:`process`; the lifecycle follows PyFlink's ``open``/``close``.
    """

    def __init__(self, ctx: StepContext):
        self.ctx = ctx

    def open(self) -> None:
        """Called once in the instance before the first batch."""

    def process(self, items: Items, event_times: np.ndarray | None) -> Output:
        """Process one batch and return the output batch (possibly empty)."""
        raise NotImplementedError

    def process_input(self, index: int, items: Items,
                      event_times: np.ndarray | None) -> Output:
        """Process a batch from the step's input number ``index`` (a join: 0 is the left
        input, 1 the right); single-input logic needs only :meth:`process`."""
        return self.process(items, event_times)

    def on_watermark(self, watermark: float) -> Output | None:
        """Event time reached ``watermark`` (the minimum over the step's inputs): fire the
        event-time windows, joins and timers it closes. The runtime forwards the watermark
        downstream after this returns, so what it emits is never behind it."""
        return None

    def on_input_watermark(self, index: int, watermark: float) -> Output | None:
        """The watermark of the step's input number ``index`` alone (the minimum over that
        input's upstream instances) reached ``watermark``; called, before :meth:`on_watermark`,
        only on steps with several inputs whose logic overrides it. For logic that can act on
        one input's progress before the other's: an event-time lookup join emits a record as
        soon as its table's watermark has passed the record's time."""
        return None

    def on_tick(self, now: float) -> Output | None:
        """Called when time passes without data (timers: processing-time windows, idle
        watermarks)."""
        return None

    def on_end(self) -> Output | None:
        """Called at end of stream; may emit a final batch."""
        return None

    def snapshot(self) -> Any:
        """State to restore from (stateless logic returns None)."""
        return None

    def discard(self, handle: Any) -> None:
        """Delete what :meth:`snapshot` stored under ``handle`` (files, a RocksDB checkpoint):
        a later checkpoint has completed, so nothing will restore from it."""

    def close(self) -> None:
        """Release resources."""

    def dead(self, reason: str, record: Any, where: str = "") -> DeadLetter:
        return DeadLetter(self.ctx.step_id, self.ctx.instance, reason, record, where)


@dataclass(frozen=True)
class Rescaled:
    """Resume state of an instance whose step changed parallelism since the checkpoint: the
    snapshots of *every* old instance, from which the new instance takes what it owns."""

    handles: tuple[Any, ...]
    old_parallelism: int


def owns(key: Any, ctx: StepContext) -> bool:
    """Whether instance ``ctx.instance`` owns ``key`` under hash partitioning (the same rule
    the channels use, so restored state sits where its records arrive)."""
    from rayflow.core.records import stable_hash

    return stable_hash(key) % ctx.parallelism == ctx.instance


class OperatorSpec:
    """Picklable configuration of an operator; ``build`` turns it into live logic."""

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        raise NotImplementedError


def describe_exception(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def apply_each(
    fn: Callable[[Any], Any], items: list, on_fail: Callable[[Any, BaseException], None]
) -> tuple[list, list[int]]:
    """``[fn(x) for x in items]``, except that a record that raises goes to ``on_fail``.

    Returns the results of the records that succeeded and the positions of those that
    failed. The common path is one tight loop; after a failure the loop resumes *after* the
    bad record, so ``fn`` is never called twice on a record.
    """
    out: list = []
    failed: list[int] = []
    start, n = 0, len(items)
    while start < n:
        try:
            # a loop in C; list.extend keeps what the map gave before a record raised
            out.extend(map(fn, items if start == 0 else itertools.islice(items, start, None)))
            break
        except Exception as exc:  # noqa: BLE001 - user code
            bad = len(out) + len(failed)  # every earlier record is in out or failed
            on_fail(items[bad], exc)
            failed.append(bad)
            start = bad + 1
    return out, failed


def drop_positions(times: np.ndarray | None, failed: list[int]) -> np.ndarray | None:
    """``times`` without the entries at ``failed`` positions."""
    if times is None or not failed:
        return times
    return np.delete(times, failed)
