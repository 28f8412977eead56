"""The tasks of a stream: one instance of one step each, run by a
:class:`~rayflow.runtime.host.StepHost` actor. :class:`StepTask` holds what they share (the
input channels in order, barrier alignment, acknowledgements, dead letters, metrics), and
:class:`SourceTask`, :class:`OperatorTask` and :class:`SinkTask` what each kind adds.

Checkpoints: a source injects ``Barrier(n)`` between batches when the coordinator asks; an
instance with several inputs *aligns*: after barrier n arrived on one input, that input's
messages wait in a buffer until barrier n has arrived on all inputs; then the instance
snapshots its state, acknowledges to the coordinator and forwards the barrier. With
``checkpoint.unaligned`` the barrier also goes out of band (``StepHost.barrier``),
overtaking the queued batches, and the instance snapshots between two messages under the
host's data lock (see :mod:`rayflow.runtime.inflight`).
"""

from __future__ import annotations

from typing import Any

from rayflow.config import StreamOptions
from rayflow.core.connectors import SinkSpec
from rayflow.core.operators import StepContext
from rayflow.dataflow import Step
from rayflow.runtime.inflight import DeadLetterHandle
from rayflow.runtime.tasks.base import StepTask
from rayflow.runtime.tasks.operator import OperatorTask
from rayflow.runtime.tasks.sink import SinkTask
from rayflow.runtime.tasks.source import SourceTask

__all__ = ["OperatorTask", "SinkTask", "SourceTask", "StepTask", "make_task"]


def make_task(step: Step, ctx: StepContext, options: StreamOptions,
              dead_letter_sink: SinkSpec | None = None, resume_state: Any = None,
              coordinator: Any = None, tick_s: float = 0.2, unaligned: bool = False,
              replay: list | None = None) -> StepTask:
    """The task of one instance of ``step``: a source, an operator or a sink.
    ``resume_state`` may carry the dead letters of the checkpoint (a
    :class:`~rayflow.runtime.inflight.DeadLetterHandle`), restored in a recovery of the same
    run."""
    cls = {"source": SourceTask, "sink": SinkTask}.get(step.kind, OperatorTask)
    dead = resume_state if isinstance(resume_state, DeadLetterHandle) else None
    if dead is not None:
        resume_state = dead.state
    task = cls(step, ctx, options, dead_letter_sink, resume_state, coordinator, tick_s,
               unaligned, replay)
    if dead is not None and dead.run == ctx.run_id:
        task.restore_dead_letters(dead)
    return task
