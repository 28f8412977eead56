"""Aggregators: how a window's records become its value (Flink's accumulator quartet:
create, add, merge, result). Pure: no Ray."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from rayflow.core.records import Field

A = TypeVar("A")


class Aggregator(Generic[A]):
    """How a window's records become one value: create, add, merge, result.

    ``add`` and ``merge`` may change their first accumulator in place and return it (as
    Flink's ``AggregateFunction.merge`` may reuse an argument): a step keeps only what they
    return, and never merges into an accumulator that another window still holds."""

    def create(self) -> A:
        raise NotImplementedError

    def add(self, acc: A, record: Any) -> A:
        raise NotImplementedError

    def merge(self, a: A, b: A) -> A:
        raise NotImplementedError

    def result(self, acc: A) -> Any:
        return acc

    def reduce_segments(self, items: Any, starts: np.ndarray) -> list[A] | None:
        """Optional vectorized path: the accumulators of the contiguous row segments of the
        Arrow batch ``items`` that begin at ``starts`` (the last one ends with the batch),
        each equal to folding :meth:`add` over its rows from :meth:`create`. None (the
        default) means "not supported": records are then added one by one."""
        return None

    def arrow_partials(self) -> list[tuple[str | None, str]] | None:
        """Optional columnar form, for tumbling windows over Arrow batches: the columns of a
        partial accumulator, each ``(field, how)`` where ``how`` is ``"count"`` (of rows;
        field None), ``"sum"``, ``"min"`` or ``"max"`` of a numeric field. Partials merge
        column by column (counts and sums add, minima and maxima take theirs). None (the
        default): no such form."""
        return None

    def from_arrow_partials(self, columns: list[list]) -> list[A]:
        """The accumulators of the rows of :meth:`arrow_partials`'s columns (as lists):
        each equal to folding :meth:`add` over the records it stands for."""
        raise NotImplementedError


@dataclass(frozen=True)
class Count(Aggregator[int]):
    """Number of records."""

    def create(self):
        return 0

    def add(self, acc, record):
        return acc + 1

    def merge(self, a, b):
        return a + b

    def reduce_segments(self, items, starts):
        return np.diff(np.append(starts, len(items))).tolist()

    def arrow_partials(self):
        return [(None, "count")]

    def from_arrow_partials(self, columns):
        return columns[0]


@dataclass(frozen=True)
class Sum(Aggregator[float]):
    """Sum of ``value(record)`` (the record itself by default)."""

    value: Callable[[Any], float] | None = None

    def create(self):
        return 0

    def add(self, acc, record):
        return acc + (self.value(record) if self.value else record)

    def merge(self, a, b):
        return a + b

    def reduce_segments(self, items, starts):
        if not isinstance(self.value, Field):
            return None
        return np.add.reduceat(column(items, self.value.name), starts).tolist()

    def arrow_partials(self):
        return [(self.value.name, "sum")] if isinstance(self.value, Field) else None

    def from_arrow_partials(self, columns):
        return columns[0]


@dataclass(frozen=True)
class MinMax(Aggregator[tuple]):
    """Count plus min and max of each named field, e.g. the study's eventTime and inTime:
    ``MinMax({"eventTime": lambda r: r["eventTime"], "inTime": lambda r: r["inTime"]})``.
    The result is ``{"count": n, "min_<field>": ..., "max_<field>": ...}``."""

    fields: dict[str, Callable[[Any], float]]

    def create(self):
        return (0, {f: (math.inf, -math.inf) for f in self.fields})

    def add(self, acc, record):
        n, mm = acc
        out = {}
        for f, get in self.fields.items():
            v = get(record)
            lo, hi = mm[f]
            out[f] = (v if v < lo else lo, v if v > hi else hi)
        return (n + 1, out)

    def merge(self, a, b):
        return (a[0] + b[0], {f: (min(a[1][f][0], b[1][f][0]), max(a[1][f][1], b[1][f][1]))
                              for f in self.fields})

    def reduce_segments(self, items, starts):
        if not all(isinstance(g, Field) for g in self.fields.values()):
            return None
        counts = np.diff(np.append(starts, len(items))).tolist()
        lows, highs = {}, {}
        for f, get in self.fields.items():
            col = column(items, get.name)
            lows[f] = np.minimum.reduceat(col, starts).tolist()
            highs[f] = np.maximum.reduceat(col, starts).tolist()
        return [(n, {f: (lows[f][i], highs[f][i]) for f in self.fields})
                for i, n in enumerate(counts)]

    def arrow_partials(self):
        if not all(isinstance(g, Field) for g in self.fields.values()):
            return None
        return [(None, "count")] + [(g.name, how) for g in self.fields.values()
                                    for how in ("min", "max")]

    def from_arrow_partials(self, columns):
        names = list(self.fields)
        return [(n, {f: (columns[1 + 2 * i][j], columns[2 + 2 * i][j])
                     for i, f in enumerate(names)}) for j, n in enumerate(columns[0])]

    def result(self, acc):
        n, mm = acc
        out: dict[str, Any] = {"count": n}
        for f, (lo, hi) in mm.items():
            out[f"min_{f}"], out[f"max_{f}"] = lo, hi
        return out


@dataclass(frozen=True)
class Reduce(Aggregator[Any]):
    """Fold records with ``fn(acc, record)`` from ``initial``; ``merge_fn`` merges two accs."""

    fn: Callable[[Any, Any], Any]
    initial: Any = None
    merge_fn: Callable[[Any, Any], Any] | None = None

    def create(self):
        return self.initial

    def add(self, acc, record):
        return self.fn(acc, record)

    def merge(self, a, b):
        if self.merge_fn is None:
            raise NotImplementedError("Reduce needs merge_fn to merge accumulators")
        return self.merge_fn(a, b)


def column(items: Any, name: str) -> np.ndarray:
    """One column of an Arrow batch as a numpy array (nulls are an error, not NaN)."""
    col = items.column(name)
    if col.null_count:
        raise ValueError(f"column {name!r} has {col.null_count} nulls")
    return col.to_numpy()
