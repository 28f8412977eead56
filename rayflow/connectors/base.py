"""Interfaces of sources and sinks. Their live parts run inside the runtime's actors."""

from __future__ import annotations

from typing import Any

import numpy as np

from rayflow.batches import Items
from rayflow.operators.base import StepContext


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


class SourceSpec:
    """Picklable description of a source."""

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        raise NotImplementedError


class SinkWriter:
    """One parallel instance of a sink."""

    def write(self, items: Items, event_times: np.ndarray | None, in_time: float) -> None:
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

    def result(self) -> Any:
        """What the driver may fetch after the run (the collecting sink's records)."""
        return None

    def close(self) -> None:
        """Release clients and files."""


class SinkSpec:
    """Picklable description of a sink."""

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        raise NotImplementedError
