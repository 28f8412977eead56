"""The operator task: its logic handles batches, watermarks and ticks, and snapshots its
state at each barrier."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from rayflow.core.messages import Tick, Watermark
from rayflow.core.operators import DeadLetter, Logic, OperatorSpec, Output
from rayflow.core.records import Batch, num_rows
from rayflow.runtime.tasks.base import StepTask


class OperatorTask(StepTask):
    """An operator instance: its logic handles batches, watermarks and ticks, and snapshots
    its state at each barrier."""

    def _build(self, resume_state: Any) -> None:
        self._snapshots: list[tuple[int, Any]] = []  # this instance's, not yet subsumed
        self._discard_lock = threading.Lock()  # held while older snapshots are deleted
        self._released = False  # the job ended: a later snapshot is deleted at once
        self.logic: Logic = cast(OperatorSpec, self.step.spec).build(self.ctx, resume_state)
        self.logic.open()
        # each input's own watermark, for logic that acts on it (several inputs only)
        self._per_input = (len(set(self._input_index.values())) > 1 and type(
            self.logic).on_input_watermark is not Logic.on_input_watermark)
        self._input_wm: dict[int, float] = {}

    def _process(self, batch: Batch, sender: tuple[str, int]) -> None:
        self._emit_output(self.logic.process_input(self._input_index.get(sender[0], 0),
                                                   batch.items, batch.event_times),
                          batch.in_time)

    def _emit_output(self, out: Output | None, in_time: float) -> None:
        if out is None:
            return
        if out.dead:
            self._dead_letters(out.dead)
        self.counters.state_expired += out.expired
        m = num_rows(out.items)
        self.counters.records_out += m
        if m:
            self.emitter.emit(Batch(out.items, out.event_times, in_time))
        for port, (items, times) in out.side.items():
            k = num_rows(items)
            if not k:
                continue
            self.counters.side_records += k
            if port in self.emitter.ports():
                self.emitter.emit(Batch(items, times, in_time), port)
            else:  # nobody consumes this side output: dead letters, never a silent drop
                self._dead_letters([DeadLetter(self.ctx.step_id, self.ctx.instance,
                                               f"{port} record", r, f"side output {port!r}")
                                    for r in items], force=True)

    def _input_watermark(self, sender: tuple[str, int]) -> None:
        if not self._per_input:
            return
        index = self._input_index.get(sender[0], 0)
        wm = self._valve.of(s for s in self._inputs if self._input_index.get(s[0], 0) == index)
        if wm > self._input_wm.get(index, -math.inf):
            self._input_wm[index] = wm
            self._timed(lambda: self.logic.on_input_watermark(index, wm))

    def _forward_watermark(self, msg: Watermark | None) -> None:
        """Fire what the watermark closes, then pass it on, so that the output is never
        behind it."""
        if msg is None:
            return
        if not msg.idle:
            self._timed(lambda: self.logic.on_watermark(msg.time))
        self.emitter.emit_control(msg)

    def _timed(self, fire: Callable[[], Output | None]) -> None:
        """Emit what ``fire`` returns, its time counted as busy (less what chained steps
        downstream took)."""
        t0, ch0 = time.perf_counter(), self.emitter.chained_s
        self._emit_output(fire(), time.time())
        self.counters.busy_s += time.perf_counter() - t0 - (self.emitter.chained_s - ch0)

    def _on_tick(self, tick: Tick) -> None:
        self._emit_output(self.logic.on_tick(time.time()), time.time())
        super()._on_tick(tick)

    def _state(self, checkpoint_id: int) -> Any:
        handle = self.logic.snapshot()
        if handle is not None:
            with self._lock:
                late = self._released
                if not late:
                    self._snapshots.append((checkpoint_id, handle))
            if late:  # taken after the job ended (its actor exiting): nothing will need it
                self.logic.discard(handle)
        return handle

    def notify_complete(self, checkpoint_id: int, final: frozenset = frozenset()) -> None:
        """Delete the older snapshots, which the complete checkpoint subsumes (Flink keeps one
        completed checkpoint too). A snapshot this instance was restored from is not its own
        and stays, as with Flink's default no-claim restore."""
        with self._discard_lock:
            with self._lock:
                old = [h for c, h in self._snapshots if c < checkpoint_id]
                self._snapshots = [(c, h) for c, h in self._snapshots if c >= checkpoint_id]
            for handle in old:
                self.logic.discard(handle)

    def release_snapshots(self) -> None:
        """The job ran to its end: its final checkpoint subsumes every snapshot this
        instance still keeps, so delete them, once any deletion under way has finished (the
        notification of the final checkpoint may still be running on another thread when
        the job ends, and the actor is killed right after)."""
        with self._discard_lock:
            with self._lock:
                old, self._snapshots, self._released = self._snapshots, [], True
            for _, handle in old:
                self.logic.discard(handle)

    def _end_of_stream(self) -> tuple[Any, bool]:
        # a savepoint stop keeps open windows in the snapshot instead
        if self._drain and not self.restored_final:
            self._emit_output(self.logic.on_end(), time.time())
        # A drained instance has emitted all it will, and no input comes after its end: a
        # restore from a later checkpoint marks it finished, and nothing reads its state.
        # So its final state is none (Flink's finished operators hold none either), and the
        # end of a bounded job copies no state (a full pickle of a large dict, or a RocksDB
        # checkpoint). A savepoint stop keeps the state for the resume.
        drained = self._drain or self.restored_final
        handle = self.logic.snapshot() if self.coordinator is not None and not drained \
            else None
        self.logic.close()
        self.emitter.emit_eos(self._drain)
        self.emitter.drain()
        return handle, False
