"""The source task: the poll loop, batching, watermarks per split, and the barriers it
injects."""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
import ray

from rayflow.core.connectors import SourceReader, SourceSpec
from rayflow.core.messages import Barrier, Tick, Watermark
from rayflow.core.records import Batch, concat, num_rows, rows
from rayflow.operators.watermarks import SourcePosition, SplitWatermarks, split_position
from rayflow.runtime.channel import Emitter
from rayflow.runtime.pace import BatchSizer
from rayflow.runtime.tasks.base import StepTask


class SourceTask(StepTask):
    """A source instance: it polls its reader and injects the barriers the coordinator asks
    for (:meth:`trigger_checkpoint`)."""

    def _build(self, resume_state: Any) -> None:
        self._trigger: Barrier | None = None  # the barrier to inject before the next batch
        self._strategy = getattr(self.step, "watermarks", None)  # EventTime or None
        self._wm_gen: SplitWatermarks | None = None
        position, wm_state = split_position(resume_state)
        self.reader: SourceReader = cast(SourceSpec, self.step.spec).build(self.ctx, position)
        if self._strategy is not None:
            self._wm_gen = SplitWatermarks(
                self._strategy.max_delay_s, self._strategy.idle_timeout_s,
                _splits(self.reader), wm_state, time.monotonic())

    def run(self) -> dict:
        """The source loop: poll, stamp inTime, push; then end-of-stream.

        Batching adapts to load, as Flink's buffer timeout does: a batch goes out when it is
        full, when ``linger_ms`` has passed since its first record, or at once when nothing
        is in flight downstream. Low rates get low latency; high rates get big batches.
        A batch also holds no more than a slow downstream step behind a rebalance takes in a
        few rounds of calls at its measured pace (``batch_target_s``): it gets small batches.
        """
        reader, emitter, c = self.reader, self.emitter, self.counters
        linger_s = self.opts.linger_ms / 1000.0
        sizer = BatchSizer(self.opts.batch_size, self.opts.channel_target_s or 0.0, time.monotonic())
        batch_size = _paced(sizer.limit, emitter)
        at_most_once = self.ctx.guarantee == "at_most_once" and self.coordinator is not None
        parts: list = []
        times: list = []
        pending = 0
        first = in_time = 0.0
        self._last_tick = time.monotonic()
        try:
            gen = self._wm_gen
            if gen is not None and gen.emitted > -np.inf:  # restored: say where we were
                emitter.emit_control(Watermark(gen.emitted))
            while not self._stop.is_set():
                t0 = time.perf_counter()
                ch0 = emitter.chained_s
                if self.unaligned:  # a barrier need not wait behind a batch held back
                    emitter.wait_for_room(
                        lambda: self._trigger is not None or self._stop.is_set())
                wait = linger_s if not pending else max(0.0, first + linger_s - time.perf_counter())
                got = reader.poll(batch_size - pending, wait)
                if got is not None:
                    items, ev = got
                    n = num_rows(items)
                    if n:
                        if gen is not None:
                            ev = self._stamp(items, ev)
                        if not pending:
                            first, in_time = time.perf_counter(), time.time()
                        parts.append(items)
                        times.append(ev)
                        pending += n
                        c.records_in += n
                        c.batches_in += 1
                barrier = self._trigger
                if pending and (barrier is not None or pending >= batch_size
                                or time.perf_counter() - first >= linger_s or emitter.idle()):
                    if at_most_once:
                        # at-most-once: the position is recorded before the records leave, so
                        # a restart never replays them
                        ray.get(self.coordinator.position.remote(self._key(), reader.snapshot(),
                                                                self.ctx.attempt_number))
                    self._emit_parts(parts, times, in_time)
                    batch_size = _paced(sizer.sent(pending, time.monotonic()), emitter)
                    parts, times, pending = [], [], 0
                    if gen is not None:
                        self._advance_watermark()
                if barrier is not None:
                    self._trigger = None
                    t1 = time.perf_counter()
                    pos = self._position()
                    self._checkpointed(barrier.checkpoint_id, pos, time.perf_counter() - t1)
                    held = emitter.emit_barrier(barrier)
                    self._ack(barrier.checkpoint_id, self._with_channels(
                        barrier, self._with_dead_letters(pos), held))
                    if barrier.stop_after:
                        self._drain = False
                        break
                elif got is None:
                    if reader.exhausted:
                        break
                    if gen is not None and not pending:
                        self._advance_watermark()  # splits may have gone idle
                    now = time.monotonic()
                    if now - self._last_tick >= self.tick_s:
                        self._last_tick = now
                        emitter.emit_control(Tick(time.time()))
                # own work only: time inside chained steps is theirs
                c.busy_s += time.perf_counter() - t0 - (emitter.chained_s - ch0)
            if pending:
                self._emit_parts(parts, times, in_time)
            emitter.emit_eos(self._drain)
            emitter.drain()
            if self.coordinator is not None:
                self._task_finished(self._position())
        except BaseException as exc:
            raise self._fail(exc) from None
        finally:
            self._sync_emitter()
            reader.close()
            self._export(final=True)
            self._done.set()
        return self.counters.as_dict()

    def _stamp(self, items: Any, ev: np.ndarray | None) -> np.ndarray:
        """Event times of a polled batch under the source's watermark strategy (its timestamp
        function, or the reader's times), recorded per split. Records that arrive while the
        instance is idle make it active again first."""
        assert self._strategy is not None  # (called only with a watermark strategy)
        ts = self._strategy.timestamp
        if ts is not None:
            ev = np.fromiter((ts(r) for r in rows(items)), dtype=np.float64,
                             count=num_rows(items))
        elif ev is None:
            raise ValueError(
                f"source {self.ctx.step_id!r}: watermarks=EventTime() needs event times, and "
                f"{type(self.step.spec).__name__} gives none: pass EventTime(timestamp=...)")
        gen, now = self._wm_gen, self._poll_clock()
        assert gen is not None  # (called only with a watermark strategy)
        gen.set_splits(_splits(self.reader), now)
        gen.observe(_record_splits(self.reader), ev, now)
        wake = gen.wake()
        if wake is not None:
            self.emitter.emit_control(wake)
        return ev

    def _poll_clock(self) -> float:
        """The source's clock for split idleness: wall time less the time it could not poll
        (blocked on a full channel, or inside its chained steps), so that a source held back
        by a slow job does not find its splits idle and make their records late."""
        em = self.emitter
        return time.monotonic() - (em.backpressure_s + em.chained_s if em is not None else 0.0)

    def _advance_watermark(self) -> None:
        now = self._poll_clock()
        gen = self._wm_gen
        assert gen is not None  # (called only with a watermark strategy)
        gen.set_splits(_splits(self.reader), now)
        msg = gen.advance(now)
        if msg is not None:
            self.emitter.emit_control(msg)

    def _position(self) -> Any:
        """What a source acknowledges at a barrier: the reader's position, with the split
        watermarks when it makes them."""
        pos = self.reader.snapshot()
        if self._wm_gen is None:
            return pos
        return SourcePosition(pos, self._wm_gen.snapshot())

    def _emit_parts(self, parts: list, times: list, in_time: float) -> None:
        items = parts[0] if len(parts) == 1 else concat(parts)
        if any(t is None for t in times):
            ev = None
        else:
            ev = times[0] if len(times) == 1 else np.concatenate(times)
        n = num_rows(items)
        self.counters.records_out += n
        self.emitter.emit(Batch(items, ev, in_time))
        self._export()

    def trigger_checkpoint(self, checkpoint_id: int, stop_after: bool = False) -> None:
        """Sources: inject barrier ``checkpoint_id`` before the next batch."""
        self._trigger = Barrier(checkpoint_id, stop_after)


def _paced(batch_size: int, emitter: Emitter | None) -> int:
    """A source's next batch: ``batch_size``, or less when the downstream is slow."""
    most = None if emitter is None else emitter.batch_rows()
    return batch_size if most is None else max(1, min(batch_size, most))


def _splits(reader: Any) -> list:
    """The splits a reader reads now (one split, 0, for readers that do not say)."""
    fn = getattr(reader, "splits", None)
    return list(fn()) if fn is not None else [0]


def _record_splits(reader: Any) -> Any:
    """The split of each record of the reader's last poll: an array, or one id for all."""
    fn = getattr(reader, "record_splits", None)
    return fn() if fn is not None else 0
