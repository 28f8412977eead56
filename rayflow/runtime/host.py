"""The operator-host actor: one per chain of step instances (see :mod:`rayflow.runtime.plan`
for what chains), each instance running a source, an operator or a sink.

Methods run in concurrency groups of their own (listed at :class:`StepHost`), so a host
that is blocked by backpressure still answers the job, and a barrier never queues behind a
commit for a thread. Actors reserve ``stream.actor_num_cpus`` CPUs (default 0): a stream's
steps mostly wait on each other and on I/O, and with 1 CPU each a graph larger than the core count would never
be scheduled.

Checkpoints: a source injects ``Barrier(n)`` between batches when the coordinator asks; an
instance with several inputs *aligns*: after barrier n arrived on one input, that input's
messages wait in a buffer until barrier n has arrived on all inputs; then the instance
snapshots its state, acknowledges to the coordinator and forwards the barrier. With
``checkpoint.unaligned`` the barrier also goes out of band (``barrier``, a control method),
overtaking the queued batches, and the instance snapshots between two messages under the
host's data lock (see :mod:`rayflow.runtime.inflight`).
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import ray

from rayflow._log import worker_logging
from rayflow.batches import (
    Barrier,
    Batch,
    EndOfStream,
    Tick,
    Watermark,
    brief,
    concat,
    num_rows,
    rows,
)
from rayflow.config import RayflowConfig, StreamOptions, set_current
from rayflow.connectors.base import FINAL_EPOCH, SinkSpec
from rayflow.dataflow import Step
from rayflow.errors import START_UP, StepError
from rayflow.metrics import LatencyRecorder, StepCounters, StepExporter, handle_bytes
from rayflow.operators.base import DeadLetter, Output, StepContext, describe_exception
from rayflow.operators.watermarks import (
    InputWatermarks,
    SourcePosition,
    SplitWatermarks,
    split_position,
)
from rayflow.runtime.alignment import Aligned, BarrierAligner
from rayflow.runtime.channel import BatchSizer, Emitter, unwrap
from rayflow.runtime.inflight import UnalignedHandle
from rayflow.runtime.plan import OutEdge

MAX_KEPT_DEAD_LETTERS = 10_000

log = logging.getLogger(__name__)


class StepTask:
    """One instance of one step, inside a :class:`StepHost` actor (with the instances chained
    to it)."""

    def __init__(self, step: Step, ctx: StepContext, options: StreamOptions,
                 dead_letter_sink: SinkSpec | None = None, resume_state: Any = None,
                 coordinator: Any = None, tick_s: float = 0.2, unaligned: bool = False,
                 replay: list | None = None):
        self.step, self.ctx = step, ctx
        # unaligned checkpoints: barriers overtake the queued batches (rayflow.runtime.inflight)
        self.unaligned = unaligned
        self._replay = list(replay or ())  # (sender, batch) in flight at the restored checkpoint
        self.opts = options.model_copy(update={
            k: v for k, v in step.options.items() if k in StreamOptions.model_fields
        })
        self.on_error = step.on_error or self.opts.on_error
        self.coordinator = coordinator
        self.tick_s = tick_s
        self.counters = StepCounters()
        self.latency = LatencyRecorder(self.opts.latency_sample_every)
        self.kept_dead: list[DeadLetter] = []
        self._dead_writer = dead_letter_sink.build(ctx) if dead_letter_sink else None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()  # sink writes (data) vs commits (control)
        self._commit_lock = threading.Lock()  # one sink commit at a time
        self._completed = 0  # the newest checkpoint known complete (sinks)
        self._completed_lock = threading.Lock()  # (notifications come on several threads)
        self._error: BaseException | None = None
        self._inputs: list[tuple[str, int]] = []
        self._finished_inputs: set[tuple[str, int]] = set()
        self._align = BarrierAligner(())
        self._held: deque = deque()  # (msg, sender) of blocked inputs, in arrival order
        self._next_seq: dict[tuple[str, int], int] = {}  # per input channel
        self._early: dict[tuple[str, int], dict[int, Any]] = {}  # arrived before their turn
        self._trigger: Barrier | None = None
        self._drain = True  # end of stream flushes open windows, unless after a savepoint
        self._ended = False  # end of stream handled (a committing sink may still hold data)
        # restored from its final state: it drained before the failure, so its end of stream
        # must not flush (emit its open windows) a second time
        self.restored_final = False
        self._last_tick = 0.0
        self._snapshots: list[tuple[int, Any]] = []  # this instance's, not yet subsumed
        self._discard_lock = threading.Lock()  # held while older snapshots are deleted
        self._acks: list = []  # acks sent to the coordinator and maybe not yet handled
        self.emitter: Emitter | None = None
        self._exporter = StepExporter(ctx.job_name, ctx.step_id, ctx.instance)
        self._strategy = getattr(step, "watermarks", None)  # sources: EventTime or None
        self._wm_gen: SplitWatermarks | None = None
        self._valve: InputWatermarks | None = None
        self._input_index = {e.upstream: n for n, e in enumerate(step.inputs)}
        if step.kind == "source":
            resume_state, wm_state = split_position(resume_state)
            self.reader = step.spec.build(ctx, resume_state)
            if self._strategy is not None:
                self._wm_gen = SplitWatermarks(
                    self._strategy.max_delay_s, self._strategy.idle_timeout_s,
                    _splits(self.reader), wm_state, time.monotonic())
        elif step.kind == "sink":
            self.writer = step.spec.build(ctx, resume_state)
        else:
            self.logic = step.spec.build(ctx, resume_state)
            self.logic.open()

    # -- wiring --------------------------------------------------------------------------
    def connect(self, edges: list[OutEdge], handles: dict[str, list[Any]],
                inputs: list[tuple[str, int]], local: dict[tuple[str, int], StepTask]):
        self.emitter = Emitter((self.ctx.step_id, self.ctx.instance), edges, handles,
                               self.opts.channel_bytes, self.opts.channel_calls, local,
                               self.opts.channel_target_s, self.opts.batch_target_s,
                               self.unaligned)
        self._inputs = list(inputs)
        self._align = BarrierAligner(self._inputs)
        self._valve = InputWatermarks(self._inputs)
        return True

    # -- source loop ---------------------------------------------------------------------
    def run(self) -> dict:
        """The source loop: poll, stamp inTime, push; then end-of-stream. Sources only.

        Batching adapts to load, as Flink's buffer timeout does: a batch goes out when it is
        full, when ``linger_ms`` has passed since its first record, or at once when nothing
        is in flight downstream. Low rates get low latency; high rates get big batches.
        A batch also holds no more than a slow downstream step behind a rebalance takes in a
        few rounds of calls at its measured pace (``batch_target_s``): it gets small batches.
        """
        reader, emitter, c = self.reader, self.emitter, self.counters
        linger_s = self.opts.linger_ms / 1000.0
        sizer = BatchSizer(self.opts.batch_size, self.opts.channel_target_s, time.monotonic())
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
                        ray.get(self.coordinator.position.remote(self._key(), reader.snapshot()))
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
                    self._ack(barrier.checkpoint_id, self._with_channels(barrier, pos, held))
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
            self._fail(exc)
            raise self._error from None
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
        ts = self._strategy.timestamp
        if ts is not None:
            ev = np.fromiter((ts(r) for r in rows(items)), dtype=np.float64,
                             count=num_rows(items))
        elif ev is None:
            raise ValueError(
                f"source {self.ctx.step_id!r}: watermarks=EventTime() needs event times, and "
                f"{type(self.step.spec).__name__} gives none: pass EventTime(timestamp=...)")
        gen, now = self._wm_gen, self._poll_clock()
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
        self._wm_gen.set_splits(_splits(self.reader), now)
        msg = self._wm_gen.advance(now)
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

    # -- data path -----------------------------------------------------------------------
    def push(self, msg: Any, sender: tuple[str, int], seq: int) -> float | None:
        """Receive message ``seq`` of the channel from ``sender``; return the seconds it took
        when it handled just this message (the sender paces its batches by them), else None.

        Ray runs the calls of a threaded actor in the order they *arrive*, which across nodes
        need not be the order they were sent; a batch overtaking a barrier would break the
        checkpoint's consistency. Messages are therefore numbered per channel, and one that
        arrives early waits here until its predecessors have been handled.
        """
        if self._error is not None:
            raise self._error
        t0 = time.perf_counter()
        waited0 = self.emitter.waited_s() if self.emitter is not None else 0.0
        handled = 0
        try:
            expected = self._next_seq.get(sender, 0)
            if seq != expected:
                self._early.setdefault(sender, {})[seq] = msg
                return None
            while True:
                self._next_seq[sender] = seq + 1
                if self._align.is_blocked(sender):
                    self._held.append((msg, sender))
                else:
                    self._handle(msg, sender)
                    handled += 1
                early = self._early.get(sender)
                if not early or seq + 1 not in early:
                    break
                seq += 1
                handled += 1  # (a message that waited: this call's time is not its own)
                msg = early.pop(seq)
        except BaseException as exc:
            self._fail(exc)
            raise self._error from None
        if handled != 1:
            return None
        # its own work: not the time it waited for credit downstream (a slow step further on
        # must not make this one look slow: its sender would cut its batches for nothing)
        waited = (self.emitter.waited_s() - waited0) if self.emitter is not None else 0.0
        return max(0.0, time.perf_counter() - t0 - waited)

    def _handle(self, msg: Any, sender: tuple[str, int]) -> None:
        if isinstance(msg, Batch):
            self._on_batch(msg, sender)
        elif isinstance(msg, Barrier):
            self._aligned(self._align.on_barrier(msg, sender))
        elif isinstance(msg, Watermark):
            self._forward_watermark(self._valve.update(sender, msg))
        elif isinstance(msg, Tick):
            self._on_tick(msg)
        elif isinstance(msg, EndOfStream):
            self._finished_inputs.add(sender)
            self._drain = self._drain and msg.drain
            if msg.drain and len(self._finished_inputs) < len(self._inputs):
                # a finished input no longer holds event time back (after a savepoint stop
                # nothing may fire: the open windows are in the savepoint)
                self._forward_watermark(self._valve.finish(sender))
            self._aligned(self._align.on_end(sender))
            if len(self._finished_inputs) >= len(self._inputs):
                self._on_eos()

    def _on_batch(self, batch: Batch, sender: tuple[str, int]) -> None:
        c = self.counters
        t0 = time.perf_counter()
        ch0 = self.emitter.chained_s
        n = len(batch)
        c.records_in += n
        c.batches_in += 1
        if self.step.kind == "sink":
            with self._lock:
                dead = self.writer.write(batch.items, batch.event_times, batch.in_time)
            out_time = time.time()
            c.first_in_time = min(c.first_in_time, batch.in_time)
            c.last_out_time = out_time
            self.latency.record(batch.event_times, out_time, n, batch.in_time)
            if dead:
                self._dead_letters(dead)
            c.records_out += n - len(dead or ())
        else:
            self._emit_output(self.logic.process_input(self._input_index.get(sender[0], 0),
                                                       batch.items, batch.event_times),
                              batch.in_time)
        c.busy_s += time.perf_counter() - t0 - (self.emitter.chained_s - ch0)
        self._export()

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

    def _forward_watermark(self, msg: Watermark | None) -> None:
        """The instance's watermark advanced (or it turned idle or active): operators fire
        what it closes, then pass it on, so their output is never behind it."""
        if msg is None or self.step.kind == "sink":
            return
        if not msg.idle:
            t0, ch0 = time.perf_counter(), self.emitter.chained_s
            self._emit_output(self.logic.on_watermark(msg.time), time.time())
            self.counters.busy_s += time.perf_counter() - t0 - (self.emitter.chained_s - ch0)
        self.emitter.emit_control(msg)

    def _on_tick(self, tick: Tick) -> None:
        if self.step.kind == "operator":
            self._emit_output(self.logic.on_tick(time.time()), time.time())
        now = time.monotonic()
        if self.step.kind != "sink" and now - self._last_tick >= self.tick_s:
            self._last_tick = now  # forward at most one tick per interval, whatever the fan-in
            self.emitter.emit_control(tick)

    # -- checkpoints ---------------------------------------------------------------------
    def _aligned(self, actions: list) -> None:
        """Carry out the aligner's decisions: snapshot an aligned checkpoint, and release
        the inputs it held, replaying what they sent meanwhile, in order."""
        for act in actions:
            if isinstance(act, Aligned):
                self._snapshot(act.barrier)
            held, self._held = self._held, deque()
            for msg, sender in held:
                if self._align.is_blocked(sender):  # blocked again by a newer barrier
                    self._held.append((msg, sender))
                else:
                    self._handle(msg, sender)

    def _snapshot(self, barrier: Barrier) -> None:
        cid = barrier.checkpoint_id
        t0 = time.perf_counter()
        if self.step.kind == "sink":
            with self._lock:
                handle = self.writer.snapshot(cid)
        else:
            handle = self.logic.snapshot()
            if handle is not None:
                with self._lock:
                    self._snapshots.append((cid, handle))
        held = self.emitter.emit_barrier(barrier) if self.step.kind != "sink" else {}
        acked = self._with_channels(barrier, handle, held)
        self._checkpointed(cid, acked, time.perf_counter() - t0)
        self._ack(cid, acked)

    def _with_channels(self, barrier: Barrier, state: Any, held: dict) -> Any:
        """What this task acknowledges: its state, and in an unaligned checkpoint the
        batches it holds in flight and how far it had handled each input."""
        if not self.unaligned or barrier.stop_after:
            return state
        return UnalignedHandle(state, held, dict(self._next_seq))

    def on_overtaking_barrier(self, checkpoint_id: int, sender: tuple[str, int]) -> None:
        """Unaligned checkpoints: barrier ``checkpoint_id`` arrived from ``sender`` out of
        band (the host holds its data lock: no message is being handled). Snapshot once it
        came from every input still running."""
        if self._error is not None or self._ended:
            return
        try:
            self._aligned(self._align.on_barrier(Barrier(checkpoint_id), sender, block=False))
        except BaseException as exc:
            self._fail(exc)
            raise self._error from None

    def replay(self) -> None:
        """Restored from an unaligned checkpoint: handle the batches it held in flight to
        this task first, before anything new arrives."""
        msgs, self._replay = self._replay, []
        try:
            for sender, batch in msgs:
                self._on_batch(batch, tuple(sender))
        except BaseException as exc:
            self._fail(exc)
            raise self._error from None

    def _ack(self, checkpoint_id: int, handle: Any) -> None:
        if self.coordinator is not None:
            self._acks = [r for r in self._acks if not ray.wait([r], timeout=0)[0]]
            self._acks.append(self.coordinator.ack.remote(checkpoint_id, self._key(), handle))

    def _task_finished(self, handle: Any) -> None:
        """Tell the coordinator this task ended, with its final state: the checkpoints that
        follow (and the final one) carry it in place of an ack."""
        # The coordinator runs calls on several threads, so an ack sent just before this
        # could be handled after it: the acks must have landed first.
        ray.get(self._acks)
        self._acks = []
        # drained: it flushed its open state (a savepoint stop keeps it for a resume)
        self.coordinator.task_finished.remote(self._key(), handle,
                                              self._drain or self.restored_final)

    def _key(self) -> tuple[str, int]:
        return (self.ctx.step_id, self.ctx.instance)

    def trigger_checkpoint(self, checkpoint_id: int, stop_after: bool = False) -> None:
        """Sources: inject barrier ``checkpoint_id`` before the next batch."""
        self._trigger = Barrier(checkpoint_id, stop_after)

    def notify_complete(self, checkpoint_id: int, final: frozenset = frozenset()) -> None:
        """Checkpoint complete: sinks commit its output (second phase of two-phase commit);
        operators delete their older snapshots, which it subsumes (Flink keeps one completed
        checkpoint too). A snapshot this instance was restored from is not its own and stays,
        as with Flink's default no-claim restore. When the checkpoint holds this task's final
        state (``final``), a sink commits everything it holds, and then it is done."""
        if self.step.kind == "sink":
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
        elif self.step.kind == "operator":
            with self._discard_lock:
                with self._lock:
                    old = [h for c, h in self._snapshots if c < checkpoint_id]
                    self._snapshots = [(c, h) for c, h in self._snapshots if c >= checkpoint_id]
                for handle in old:
                    self.logic.discard(handle)

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

    def release_snapshots(self) -> None:
        """The job ran to its end: its final checkpoint subsumes every snapshot this
        instance still keeps, so delete them, once any deletion under way has finished (the
        notification of the final checkpoint may still be running on another thread when
        the job ends, and the actor is killed right after)."""
        if self.step.kind != "operator":
            return
        with self._discard_lock:
            with self._lock:
                old, self._snapshots = self._snapshots, []
            for _, handle in old:
                self.logic.discard(handle)

    # -- end of stream -------------------------------------------------------------------
    def _on_eos(self) -> None:
        handle, holds = None, False
        if self.step.kind == "sink":
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
        else:
            # a savepoint stop keeps open windows in the snapshot instead
            if self._drain and not self.restored_final:
                self._emit_output(self.logic.on_end(), time.time())
            handle = self.logic.snapshot() if self.coordinator is not None else None
            self.logic.close()
            self.emitter.emit_eos(self._drain)
            self.emitter.drain()
        if self._dead_writer is not None:
            self._dead_writer.flush()
        self._export(final=True)
        self._ended = True
        if self.coordinator is not None:
            self._task_finished(handle)
        if self.step.kind != "sink" or not holds:
            self._done.set()

    def _dead_letters(self, dead: list[DeadLetter], force: bool = False) -> None:
        if self.on_error == "raise" and not force:
            d = dead[0]
            raise StepError(d.step_id, d.instance, brief(d.record), d.reason)
        self.counters.dead_letters += len(dead)
        log.info("step %r instance %d: %d dead letter%s (first: %s)", self.ctx.step_id,
                 self.ctx.instance, len(dead), "" if len(dead) == 1 else "s", dead[0].reason)
        room = MAX_KEPT_DEAD_LETTERS - len(self.kept_dead)
        if room > 0:
            self.kept_dead.extend(dead[:room])
        if self._dead_writer is not None:
            self._dead_writer.write([_dead_json(d) for d in dead], None, time.time())

    def _fail(self, exc: BaseException) -> None:
        exc = unwrap(exc)
        if not isinstance(exc, (StepError, ray.exceptions.RayError)):
            exc = StepError(self.ctx.step_id, self.ctx.instance, "-", describe_exception(exc))
        self._error = exc
        self._done.set()

    def _sync_emitter(self) -> None:
        if self.step.kind == "sink":  # a sink waits for its commits instead (exactly-once)
            self.counters.backpressure_s = getattr(self.writer, "waited_s", 0.0)
        if self.emitter is not None:
            self.counters.backpressure_s = self.emitter.backpressure_s
            self.counters.batches_out = self.emitter.batches_out
            self.counters.bytes_out = self.emitter.bytes_out

    def _checkpointed(self, checkpoint_id: int, handle: Any, duration_s: float) -> None:
        size = handle_bytes(handle)
        c = self.counters
        c.checkpoints += 1
        c.checkpoint_s += duration_s
        c.checkpoint_bytes += size
        self._exporter.checkpoint(duration_s, size)
        log.debug("step %r instance %d: snapshot for checkpoint %d, %d bytes in %.3f s",
                  self.ctx.step_id, self.ctx.instance, checkpoint_id, size, duration_s)

    def _export(self, final: bool = False) -> None:
        """Counters to Ray's metrics: at most once per export interval, and at the end."""
        if final or self._exporter.due():
            self._sync_emitter()
            self._exporter.export(self.counters, self.latency)

    # -- control -------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask a source to end its stream (the graph then drains and finishes)."""
        self._stop.set()

    def status(self) -> dict:
        self._sync_emitter()
        return {
            "step_id": self.ctx.step_id,
            "instance": self.ctx.instance,
            "done": self._done.is_set(),
            "error": self._error,
            "counters": self.counters.as_dict(),
            "inflight_bytes": self.emitter.inflight_bytes() if self.emitter else 0,
        }

    def wait_done(self, timeout_s: float | None = None) -> bool | BaseException:
        """True once the task finished, False if it still runs after ``timeout_s``; a
        task that ended with an error returns it (it has ended, but must never pass for
        finished). Returned, not raised: the job may drop a wait it no longer needs, and a
        raised error nobody fetched would be logged as unhandled."""
        done = self._done.wait(timeout_s)
        if done and self._error is not None:
            return self._error
        return done

    def final(self) -> dict:
        """Everything the driver keeps after the run."""
        self._sync_emitter()
        self._export(final=True)
        return {
            "counters": self.counters.as_dict(),
            "latency": self.latency.samples(),
            "dead_letters": list(self.kept_dead),
            "result": self.writer.result() if self.step.kind == "sink" else None,
            "error": self._error,
        }


def tune_gc(options: StreamOptions) -> None:
    """The garbage collector of a step actor's process, as ``stream.gc_threshold`` and
    ``stream.gc_freeze`` say (the steps are built: what is alive now stays alive)."""
    if options.gc_threshold is not None:
        gc.set_threshold(*options.gc_threshold)
    if options.gc_freeze:
        gc.freeze()


# (Ray's overloads of remote() omit concurrency_groups)
@ray.remote(concurrency_groups={"data": 1, "barrier": 1, "commit": 2, "wait": 4,  # type: ignore[call-overload]
                                "control": 3})
class StepHost:
    """The actor of one chain of step instances: its head (a source, or an instance fed by
    other actors) and the instances chained to it, which take their input from the previous
    member by a plain call, as Flink's operator chaining does: no serialization, no Ray call,
    no channel between them. Methods address a member by its key; the head by default.

    Methods run in concurrency groups, each with threads of its own, so that nothing slow
    holds up a barrier: ``data`` (one thread: the source loop, or ``push`` calls in arrival
    order), ``barrier`` (an unaligned checkpoint's barrier, out of band), ``commit``
    (checkpoint notifications: a sink's commit, which may take long; a second thread folds
    the notifications that arrive meanwhile into the next one), ``wait`` (the job's waits
    for its sinks to finish, which block until then) and ``control`` (status, stop,
    triggers, results).
    """

    def __init__(self, members: list[tuple[Step, StepContext, Any]], options: StreamOptions,
                 dead_letter_sink: SinkSpec | None = None, coordinator: Any = None,
                 tick_s: float = 0.2, config: RayflowConfig | None = None,
                 replay: dict | None = None):
        set_current(config)  # what code inside the steps reads: the job's, not this node's
        worker_logging()
        self.tasks: dict[tuple[str, int], StepTask] = {}
        # A step that fails to build (no such topic, no broker, no directory) must not kill
        # the actor: Ray would report a dead actor with the cause deep in its tracebacks.
        # connect() raises the one StepError instead.
        self.start_error: StepError | None = None
        # one message at a time: a push, or an overtaking barrier's snapshot
        self._data = threading.Lock()
        chk = config.checkpoint if config is not None else None
        unaligned = bool(chk is not None and chk.unaligned and coordinator is not None)
        replay = replay or {}
        for step, ctx, resume in members:
            key = (ctx.step_id, ctx.instance)
            try:
                self.tasks[key] = StepTask(step, ctx, options, dead_letter_sink, resume,
                                           coordinator, tick_s, unaligned, replay.get(key))
            except Exception as exc:  # noqa: BLE001 - any build error, reported once
                self.start_error = StepError(ctx.step_id, ctx.instance, START_UP,
                                             describe_exception(exc))
                break
        self.head = next(iter(self.tasks.values()), None)
        tune_gc(options)

    def _task(self, key: tuple[str, int] | None) -> StepTask:
        # (a key comes back from Ray as a list; a built actor has a head)
        return self.head if key is None else self.tasks[tuple(key)]  # type: ignore[return-value,index]

    def connect(self, outputs: dict, handles: dict[str, list[Any]], inputs: dict) -> bool:
        if self.start_error is not None:
            raise self.start_error
        for key, task in self.tasks.items():
            task.connect(outputs[key], handles, inputs[key], self.tasks)
        return True

    def mark_restored_final(self, keys: list) -> bool:
        """These members were restored from their final state (they had finished)."""
        for key in keys:
            self.tasks[tuple(key)].restored_final = True
        return True

    @ray.method(concurrency_group="data")
    def run(self) -> dict:
        return self.head.run()

    @ray.method(concurrency_group="data")
    def push(self, msg: Any, sender: tuple[str, int], seq: int,
             target: tuple[str, int] | None = None) -> float | None:
        task = self._task(target)
        if task.unaligned and task.emitter is not None and isinstance(msg, Batch):
            # held back by a slow receiver: wait here, outside the lock, where an overtaking
            # barrier may snapshot
            task.emitter.wait_for_room()
        with self._data:
            return task.push(msg, sender, seq)

    @ray.method(concurrency_group="barrier")
    def barrier(self, checkpoint_id: int, sender: tuple[str, int], seq: int,
                target: tuple[str, int] | None = None) -> None:
        """An unaligned checkpoint's barrier, out of band: it follows message ``seq - 1``
        of the channel from ``sender``, which may still be queued here."""
        with self._data:
            self._task(target).on_overtaking_barrier(checkpoint_id, (sender[0], sender[1]))

    @ray.method(concurrency_group="data")
    def replay(self) -> bool:
        """Handle what the restored checkpoint held in flight to these tasks."""
        with self._data:
            for task in self.tasks.values():
                task.replay()
        return True

    @ray.method(concurrency_group="control")
    def trigger_checkpoint(self, checkpoint_id: int, stop_after: bool = False) -> None:
        if self.head is not None:  # None: its step failed to build, the job is failing
            self.head.trigger_checkpoint(checkpoint_id, stop_after)

    @ray.method(concurrency_group="commit")
    def notify_complete(self, checkpoint_id: int, final: frozenset = frozenset()) -> None:
        for task in self.tasks.values():
            task.notify_complete(checkpoint_id, final)

    @ray.method(concurrency_group="control")
    def release_snapshots(self) -> None:
        for task in self.tasks.values():
            task.release_snapshots()

    @ray.method(concurrency_group="control")
    def stop(self) -> None:
        if self.head is not None:
            self.head.stop()

    @ray.method(concurrency_group="control")
    def status(self, key: tuple[str, int] | None = None) -> dict:
        return self._task(key).status()

    @ray.method(concurrency_group="wait")
    def wait_done(self, timeout_s: float | None = None,
                  key: tuple[str, int] | None = None) -> bool | BaseException:
        return self._task(key).wait_done(timeout_s)

    @ray.method(concurrency_group="control")
    def final(self, key: tuple[str, int] | None = None) -> dict:
        return self._task(key).final()

    @ray.method(concurrency_group="control")
    def memory(self) -> dict:
        import psutil

        mem = psutil.Process().memory_full_info()
        return {"rss": mem.rss, "uss": mem.uss}


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


def _dead_json(d: DeadLetter) -> bytes:
    return json.dumps({"step_id": d.step_id, "instance": d.instance, "reason": d.reason,
                       "where": d.where, "record": brief(d.record, 2000)}).encode()
