"""Stateless operators: map, flat_map, filter, map_batches, inspect.

Item operators are thin shims over one batch loop; ``map_batches`` hands the whole batch
(list, numpy array or Arrow table) to the user function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress
from operator import not_
from typing import Any

import numpy as np

from rayflow.core.operators import (
    Logic,
    OperatorSpec,
    Output,
    StepContext,
    apply_each,
    describe_exception,
    drop_positions,
)
from rayflow.core.records import Items, num_rows, rows


class _ItemLogic(Logic):
    def __init__(self, ctx: StepContext, fn: Callable[[Any], Any]):
        super().__init__(ctx)
        self.fn = fn
        self._dead: list = []

    def _fail(self, record: Any, exc: BaseException) -> None:
        self._dead.append(self.dead(describe_exception(exc), record))

    def _apply(self, items: Items) -> tuple[list, list[int], list]:
        self._dead = []
        out, failed = apply_each(self.fn, rows(items), self._fail)
        return out, failed, self._dead


class _MapLogic(_ItemLogic):
    def process(self, items, event_times):
        out, failed, dead = self._apply(items)
        return Output(out, drop_positions(event_times, failed), dead)


def _mask(keep: list) -> np.ndarray:
    """The predicate's answers as a bool array (each answer's truth value)."""
    return np.frombuffer(bytes(map(bool, keep)), dtype=bool)


class _FilterLogic(_ItemLogic):
    def _predicate(self, items, event_times):
        """The records that did not fail, their event times, the predicate's answer for each
        (as it returned them) and the dead letters of those that failed."""
        records = rows(items)
        keep, failed, dead = self._apply(records)
        if failed:
            bad = set(failed)
            records = [r for i, r in enumerate(records) if i not in bad]
            event_times = drop_positions(event_times, failed)
        return records, event_times, keep, dead

    def process(self, items, event_times):
        records, event_times, keep, dead = self._predicate(items, event_times)
        out = list(compress(records, keep))  # (a loop in C, on each answer's truth value)
        return Output(out, None if event_times is None else event_times[_mask(keep)], dead)


class _FlatMapLogic(_ItemLogic):
    def process(self, items, event_times):
        parts, failed, dead = self._apply(items)
        out: list = []
        counts = np.empty(len(parts), dtype=np.int64)
        for i, p in enumerate(parts):
            before = len(out)
            out.extend(p)
            counts[i] = len(out) - before
        times = drop_positions(event_times, failed)
        return Output(out, None if times is None else np.repeat(times, counts), dead)


class _InspectLogic(_ItemLogic):
    def process(self, items, event_times):
        _, _, dead = self._apply(items)
        return Output(items, event_times, dead)


class _MapBatchesLogic(Logic):
    def __init__(self, ctx: StepContext, fn: Callable[[Items], Items]):
        super().__init__(ctx)
        self.fn = fn

    def process(self, items, event_times):
        try:
            out = self.fn(items)
        except Exception as exc:  # noqa: BLE001 - user code
            # A batch function fails as a whole: the batch is the unit we can name.
            return Output([], None, [self.dead(describe_exception(exc), items, "batch")])
        if event_times is not None and num_rows(out) != len(event_times):
            # cardinality changed: keep the batch's earliest event time for every record
            event_times = np.full(num_rows(out), event_times.min() if len(event_times) else 0.0)
        return Output(out, event_times)


@dataclass(frozen=True)
class Map(OperatorSpec):
    """Apply ``fn`` to each record."""

    fn: Callable[[Any], Any]

    def build(self, ctx, resume_state=None):
        return _MapLogic(ctx, self.fn)


@dataclass(frozen=True)
class FlatMap(OperatorSpec):
    """Apply ``fn`` to each record and emit every element of the iterable it returns."""

    fn: Callable[[Any], Any]

    def build(self, ctx, resume_state=None):
        return _FlatMapLogic(ctx, self.fn)


@dataclass(frozen=True)
class Filter(OperatorSpec):
    """Keep the records for which ``fn`` is true."""

    fn: Callable[[Any], bool]

    def build(self, ctx, resume_state=None):
        return _FilterLogic(ctx, self.fn)


@dataclass(frozen=True)
class Inspect(OperatorSpec):
    """Call ``fn`` on each record for its side effect; records pass unchanged."""

    fn: Callable[[Any], Any]

    def build(self, ctx, resume_state=None):
        return _InspectLogic(ctx, self.fn)


@dataclass(frozen=True)
class MapBatches(OperatorSpec):
    """Apply ``fn`` to a whole batch (list, numpy array or Arrow table) at once."""

    fn: Callable[[Items], Items]

    def build(self, ctx, resume_state=None):
        return _MapBatchesLogic(ctx, self.fn)


class _UnionLogic(Logic):
    def process(self, items, event_times):
        return Output(items, event_times)


@dataclass(frozen=True)
class Union(OperatorSpec):
    """The records of every input, as they come (``stream.merge``)."""

    def build(self, ctx, resume_state=None):
        return _UnionLogic(ctx)


class _BranchLogic(_FilterLogic):
    def process(self, items, event_times):
        records, event_times, keep, dead = self._predicate(items, event_times)
        yes = list(compress(records, keep))
        no = list(compress(records, map(not_, keep)))
        if event_times is None:
            times = (None, None)
        else:
            mask = _mask(keep)
            times = (event_times[mask], event_times[~mask])
        side = {BRANCH_REST: (no, times[1])} if no else {}
        return Output(yes, times[0], dead, side)


BRANCH_REST = "rest"


@dataclass(frozen=True)
class Branch(OperatorSpec):
    """Records for which ``fn`` is true leave on the main output, the others on ``rest``
    (``stream.branch``)."""

    fn: Callable[[Any], bool]

    def build(self, ctx, resume_state=None):
        return _BranchLogic(ctx, self.fn)
