"""Exceptions that name what failed and where."""

from __future__ import annotations


class RayflowError(Exception):
    """Base class of rayflow's errors."""


class ConfigError(RayflowError, ValueError):
    """A configuration, flow definition or cluster spec is invalid."""


class StepError(RayflowError):
    """User code raised inside a step.

    Attributes:
        step_id: the step whose logic raised.
        instance: the parallel instance index (0-based).
        record: a short repr of the offending record (or batch).
        reason: the original exception, as ``Type: message``.
    """

    def __init__(self, step_id: str, instance: int, record: str, reason: str):
        self.step_id = step_id
        self.instance = instance
        self.record = record
        self.reason = reason
        super().__init__(
            f"step {step_id!r} instance {instance} failed on record {record}: {reason}"
        )

    def __reduce__(self):
        return (StepError, (self.step_id, self.instance, self.record, self.reason))


class GangSchedulingError(RayflowError):
    """A gang (placement group) could not be placed within its timeout."""
