"""Reductions of MPI stages: the operator table every backend reads (:data:`REDUCE_OPS`),
and how contributions combine, in rank order, so that every rank gets bit-identical
results (:func:`reduce_values`; :class:`_Fold` for arrays all-reduced into a buffer).
Reductions follow mpi4py: numpy arrays and scalars combine with numpy's ufuncs, Python
objects with Python's operators (exact integers, Fractions, Decimals). Pure: no Ray.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np


def _py_min(x: Any, y: Any) -> Any:
    return y if y < x else x


def _py_max(x: Any, y: Any) -> Any:
    return y if y > x else x


class ReduceOp(NamedTuple):
    """A reduction operator: numpy's ufunc for arrays and numpy scalars, and the same
    operator for Python objects (ints, floats, Fractions, Decimals, ...) as mpi4py applies
    it, with ``+``, ``*`` and comparisons, so that integers stay exact at any size."""

    array: np.ufunc
    scalar: Callable[[Any, Any], Any]


#: The reduction operators of ``reduce``/``allreduce``/``reduce_scatter``, by name: the one
#: table every backend (Ray-native, gloo, the ``ray.util.collective`` group) reads.
REDUCE_OPS: dict[str, ReduceOp] = {
    "sum": ReduceOp(np.add, operator.add),
    "prod": ReduceOp(np.multiply, operator.mul),
    "min": ReduceOp(np.minimum, _py_min),
    "max": ReduceOp(np.maximum, _py_max),
}


def check_op(op: str) -> None:
    """Raise ``ValueError`` unless ``op`` names a reduction operator."""
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; use one of {sorted(REDUCE_OPS)}")


def _describe(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"an array of {v.dtype} {v.shape}"
    if isinstance(v, np.generic):
        return f"a numpy {v.dtype} scalar"
    return f"a Python {type(v).__name__}"


def reduce_values(values: Sequence[Any], op: str, what: str = "reduce") -> Any:
    """Combine one value per rank in rank order with ``op``, as every backend must.

    numpy arrays combine elementwise with the ufunc (:data:`REDUCE_OPS`) and must have the
    same shape and dtype on every rank (MPI's matching counts and types); numpy scalars
    combine with the ufunc as well. Anything else combines with Python's operators
    (:data:`REDUCE_OPS` too), so Python ints never overflow and Fractions stay exact.

    Raises:
        ValueError: arrays of different shapes or dtypes, or an array on some ranks only.
    """
    check_op(op)
    values = list(values)
    arrays = [isinstance(v, np.ndarray) for v in values]
    if any(arrays):
        first = values[arrays.index(True)]
        if not all(arrays) or any(v.shape != first.shape or v.dtype != first.dtype for v in values):
            parts = ", ".join(f"rank {r}: {_describe(v)}" for r, v in enumerate(values))
            raise ValueError(
                f"{what}: every rank must pass an array of the same shape and dtype; got {parts}"
            )
    fn: Callable[[Any, Any], Any]
    if any(arrays) or any(isinstance(v, np.generic) for v in values):
        fn = REDUCE_OPS[op].array
    else:
        fn = REDUCE_OPS[op].scalar
    acc = values[0]
    for v in values[1:]:
        acc = fn(acc, v)
    if any(arrays):
        acc = np.asarray(acc)  # a 0-d array stays an array (ufuncs return scalars for 0-d)
        if acc is values[0]:
            acc = acc.copy()  # never hand back the caller's (or a read-only) buffer
    return acc


def _fill(out: np.ndarray, got: Any, what: str = "allreduce") -> np.ndarray:
    """Copy a received array into ``out`` (same shape), or raise naming both."""
    if not isinstance(got, np.ndarray) or got.shape != out.shape:
        raise ValueError(f"{what}: expected {_describe(out)}, got {_describe(got)}")
    np.copyto(out, got)
    return out


class _Fold:
    """An elementwise reduction in rank order, written into one output array as the ranks'
    arrays come (they may be views of a channel's memory, read once and not kept).

    The result is bit for bit :func:`reduce_values` of the same arrays: ``((v0 op v1) op
    v2) ...``, each step a numpy ufunc; only where it is written differs.
    """

    def __init__(self, op: str, mine: np.ndarray, rank: int, out: np.ndarray | None,
                 what: str, size: int = 2):
        self._ufunc = REDUCE_OPS[op].array
        self._op, self._mine, self._rank, self._what, self._size = op, mine, rank, what, size
        self._out = out
        self._next = 0  # the next rank to fold in
        self._mine_in_out = out is not None and np.may_share_memory(out, mine)

    def _check(self, got: Any, rank: int) -> None:
        mine = self._mine
        if not isinstance(got, np.ndarray) or got.shape != mine.shape or got.dtype != mine.dtype:
            vals = [mine if r == self._rank else None for r in range(self._size)]
            vals[rank] = got
            parts = ", ".join(f"rank {r}: {_describe(v)}" for r, v in enumerate(vals)
                              if v is not None)
            raise ValueError(f"{self._what}: every rank must pass an array of the same shape "
                             f"and dtype; got {parts}")

    def add(self, got: np.ndarray, rank: int) -> None:
        """Fold in ``rank``'s array (ranks come in order)."""
        assert rank == self._next, (rank, self._next)
        self._check(got, rank)
        if self._out is None:
            self._out = np.empty_like(self._mine)
        if rank == 0:
            if not (self._mine_in_out and got is self._mine):
                np.copyto(self._out, got)
        else:
            self._ufunc(self._out, got, out=self._out)
        self._next += 1

    def with_peer(self, got: Any) -> np.ndarray:
        """Two ranks: this rank's array and the peer's, in rank order, into the output."""
        self._check(got, 1 - self._rank)
        v0, v1 = (self._mine, got) if self._rank == 0 else (got, self._mine)
        out = self._out if self._out is not None else np.empty_like(self._mine)
        self._ufunc(v0, v1, out=out)
        return out

    def result(self) -> np.ndarray:
        assert self._out is not None
        return self._out

