"""Exceptions that name what failed and where."""

from __future__ import annotations


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
