"""Exceptions that name what failed and where."""

from __future__ import annotations

import math
import numbers
from typing import Any


class RayflowError(Exception):
    """Base class of rayflow's errors."""


class ConfigError(RayflowError, ValueError):
    """A configuration, flow definition or cluster spec is invalid."""


# ``StepError.record`` of a step that failed before it saw any record: while being built
START_UP = "(start-up)"


class StepError(RayflowError):
    """A step failed: user code raised inside it, or it could not start.

    Attributes:
        step_id: the step whose logic raised.
        instance: the parallel instance index (0-based).
        record: a short repr of the offending record (or batch); :data:`START_UP` when the
            step failed while being built (no such topic, no broker, no directory).
        reason: the original exception, as ``Type: message``.
    """

    def __init__(self, step_id: str, instance: int, record: str, reason: str):
        self.step_id = step_id
        self.instance = instance
        self.record = record
        self.reason = reason
        what = "failed to start" if record == START_UP else f"failed on record {record}"
        super().__init__(f"step {step_id!r} instance {instance} {what}: {reason}")

    def __reduce__(self):
        return (StepError, (self.step_id, self.instance, self.record, self.reason))


class GangSchedulingError(RayflowError):
    """A gang (placement group) could not be placed within its timeout."""


def check_number(owner: str, name: str, value: Any, *, above: float | None = 0.0,
                 at_least: float | None = None, or_none: bool = False) -> None:
    """``value`` is a finite number (not a bool) above ``above``, or at least ``at_least``
    (with neither, any finite number), or None where ``or_none``: else a ValueError that
    names ``owner`` and its field ``name``."""
    if or_none and value is None:
        return
    number = (not isinstance(value, bool) and isinstance(value, numbers.Real)
              and math.isfinite(value))
    if not number or (above is not None and not float(value) > above) or (
            at_least is not None and not float(value) >= at_least):
        bound = (f" > {above:g}" if above is not None else
                 f" >= {at_least:g}" if at_least is not None else "")
        raise ValueError(f"{owner}: {name} must be a number{bound}"
                         f"{' or None' if or_none else ''} (finite), got {value!r}")


def check_callable(owner: str, name: str, value: Any, *, or_none: bool = True) -> None:
    """``value`` is callable (or None where ``or_none``): else a ValueError that names
    ``owner`` and its field ``name``."""
    if not (callable(value) or (or_none and value is None)):
        raise ValueError(f"{owner}: {name} must be a function{' or None' if or_none else ''}, "
                         f"got {value!r}")
