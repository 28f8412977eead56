"""Streams meet MPI stages: a stream step that runs a gang-scheduled stage per record.

The step keeps one gang for its lifetime (started in ``open``, released in ``close``), so
windows do not pay a placement group and rank start-up each; ``reuse_gang=False`` starts a
gang per record instead (for comparison). The stage runs inside the step's ``process``, so a
slow solve backpressures the source like any slow step, and a window's solve is a pure
function of its records, so replay after a failure reproduces it: the stream's delivery
guarantee covers the stage. A rank that dies is handled by the stage itself (re-run on a new
gang from its driver-owned inputs); a dying step is restored from the stream's checkpoint.

    solved = windows.apply("solve", GangStep(lambda rec, gang: solve(rec, gang), ranks=2))
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayflow.core.operators import (
    Logic,
    OperatorSpec,
    Output,
    StepContext,
    apply_each,
    describe_exception,
)


@dataclass(frozen=True)
class GangStep(OperatorSpec):
    """Run ``fn(record, gang)`` for each record, with a gang of ``ranks`` MPI ranks.

    Args:
        fn: builds and runs the stage for one record (e.g. ``cg_solve(..., gang=gang)``);
            returns the output record.
        ranks: ranks in the gang.
        reuse_gang: keep one gang for the step's lifetime (default) or start one per record.
        backend, strategy, rank_num_cpus: gang settings (defaults from ``config.hpc``).
    """

    fn: Callable[[Any, Any], Any]
    ranks: int = 2
    reuse_gang: bool = True
    backend: str | None = None
    strategy: str | None = None
    rank_num_cpus: float | None = None

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _GangLogic(self, ctx)


class _GangLogic(Logic):
    def __init__(self, spec: GangStep, ctx: StepContext):
        super().__init__(ctx)
        self.spec = spec
        self.gang = None
        self.stage_s = 0.0
        self.gang_starts = 0

    def _new_gang(self):
        from rayflow.hpc.gang import Gang

        gang = Gang(self.spec.ranks, backend=self.spec.backend, strategy=self.spec.strategy,
                    rank_num_cpus=self.spec.rank_num_cpus)
        gang.start()
        self.gang_starts += 1
        return gang

    def open(self) -> None:
        if self.spec.reuse_gang:
            self.gang = self._new_gang()

    def _run(self, record: Any) -> Any:
        t0 = time.perf_counter()
        gang = self.gang if self.spec.reuse_gang else self._new_gang()
        assert gang is not None, "open() starts the reused gang"
        try:
            return self.spec.fn(record, gang)
        finally:
            if not self.spec.reuse_gang:
                gang.shutdown()
            self.stage_s += time.perf_counter() - t0

    def process(self, items, event_times):
        dead = []
        out, failed = apply_each(
            self._run, list(items),
            lambda r, e: dead.append(self.dead(describe_exception(e), r)))
        return Output(out, None, dead)

    def close(self) -> None:
        if self.gang is not None:
            self.gang.shutdown()
            self.gang = None
