"""The sink task: writes, and the commits of a two-phase-commit sink after each complete
checkpoint."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import ray

from rayflow.core.connectors import FINAL_EPOCH, SinkSpec, SinkWriter
from rayflow.core.messages import Barrier, Tick, Watermark
from rayflow.core.operators import describe_exception
from rayflow.core.records import Batch
from rayflow.errors import StepError
from rayflow.runtime.channel import unwrap
from rayflow.runtime.tasks.base import StepTask


class SinkTask(StepTask):
    """A sink instance: it writes batches, and with a coordinator commits what each complete
    checkpoint holds."""

    def _build(self, resume_state: Any) -> None:
        self._commit_lock = threading.Lock()  # one commit at a time
        self._completed = 0  # the newest checkpoint known complete
        self._completed_lock = threading.Lock()  # (notifications come on several threads)
        self.writer: SinkWriter = cast(SinkSpec, self.step.spec).build(self.ctx, resume_state)

    def _process(self, batch: Batch, sender: tuple[str, int]) -> None:
        c, n = self.counters, len(batch)
        with self._lock:
            dead = self.writer.write(batch.items, batch.event_times, batch.in_time)
        out_time = time.time()
        c.first_in_time = min(c.first_in_time, batch.in_time)
        c.last_out_time = out_time
        self.latency.record(batch.event_times, out_time, n, batch.in_time)
        if dead:
            self._dead_letters(dead)
        c.records_out += n - len(dead or ())

    def _forward_watermark(self, msg: Watermark | None) -> None:
        pass  # the end of the line

    def _on_tick(self, tick: Tick) -> None:
        pass

    def _state(self, checkpoint_id: int) -> Any:
        with self._lock:
            return self.writer.snapshot(checkpoint_id)

    def _pass_barrier(self, barrier: Barrier) -> dict:
        return {}

    def notify_complete(self, checkpoint_id: int, final: frozenset = frozenset()) -> None:
        """Commit the checkpoint's output (the second phase of two-phase commit). When the
        checkpoint holds this task's final state (``final``), commit everything it holds;
        then it is done."""
        if self._error is not None:
            return
        try:
            self._commit(checkpoint_id, final)
        except BaseException as exc:  # noqa: BLE001 - the job learns it from the status
            # (this call comes from the coordinator, which does not wait for it: raised
            # here, the error would only be logged, and the sink would wait for ever)
            exc = unwrap(exc)
            if not isinstance(exc, (StepError, ray.exceptions.RayError)):
                exc = StepError(self.ctx.step_id, self.ctx.instance, "-",
                                f"commit after checkpoint {checkpoint_id}: "
                                f"{describe_exception(exc)}")
            self._fail(exc)

    def _commit(self, checkpoint_id: int, final: frozenset) -> None:
        # notifications that queued behind a slow commit are folded into one transaction
        with self._completed_lock:
            self._completed = max(self._completed, checkpoint_id)
        with self._commit_lock:
            if self._key() not in final and self.writer.commits_beside_writes:
                # beside the writes: the next epoch's records and barrier go on
                self.writer.commit(self._completed)
                self.counters.delivered_time = time.time()
                return
            with self._lock:
                if self._key() in final:
                    self.writer.commit(FINAL_EPOCH)
                    self.counters.delivered_time = time.time()
                    if self._ended and not self._done.is_set():
                        self.writer.close()
                        self._done.set()
                else:
                    self.writer.commit(checkpoint_id)
                    self.counters.delivered_time = time.time()

    def _end_of_stream(self) -> tuple[Any, bool]:
        with self._lock:
            # what came after the last barrier is the sink's final epoch: a sink that
            # commits (exactly-once) holds it until a checkpoint with its final state
            # completes, so a failure before that never leaves it committed twice
            handle = self.writer.snapshot(FINAL_EPOCH)
            holds = self.coordinator is not None and self.writer.uncommitted()
            if not holds:
                self.writer.flush()
                self.writer.close()
                self.counters.delivered_time = time.time()
        return handle, holds

    def _sync_emitter(self) -> None:
        super()._sync_emitter()
        # a sink sends nothing on: its backpressure is the time its writes waited for
        # commits (exactly-once)
        self.counters.backpressure_s = getattr(self.writer, "waited_s", 0.0)

    def _result(self) -> Any:
        return self.writer.result()
