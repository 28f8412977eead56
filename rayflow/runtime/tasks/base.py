"""What every task shares: the input channels in order, barrier alignment, acknowledgements
to the coordinator, dead letters, metrics and the end of stream."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import deque
from typing import Any

import ray

from rayflow.config import StreamOptions
from rayflow.core.connectors import SinkSpec
from rayflow.core.messages import Barrier, EndOfStream, Tick, Watermark
from rayflow.core.operators import DeadLetter, StepContext, describe_exception
from rayflow.core.records import Batch, brief
from rayflow.dataflow import Step
from rayflow.errors import StepError
from rayflow.metrics import LatencyRecorder, StepCounters, StepExporter, handle_bytes
from rayflow.operators.watermarks import InputWatermarks
from rayflow.runtime.alignment import Aligned, BarrierAligner
from rayflow.runtime.channel import Emitter, unwrap
from rayflow.runtime.inflight import DeadLetterHandle, UnalignedHandle
from rayflow.runtime.plan import OutEdge

MAX_KEPT_DEAD_LETTERS = 10_000

log = logging.getLogger(__name__)


class StepTask:
    """One instance of one step, inside a :class:`~rayflow.runtime.host.StepHost` actor (with
    the instances chained to it): what sources, operators and sinks share. :func:`make_task`
    builds the one its step's kind needs."""

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
        # the dead-letter sink delivers at least once whatever the job's guarantee: it is
        # flushed at each checkpoint, never part of one (an exactly-once writer would hold
        # its records for commits that nothing makes)
        self._dead_writer = dead_letter_sink.build(dataclasses.replace(
            ctx, guarantee="at_least_once")) if dead_letter_sink else None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()  # sink writes (data) vs commits (control)
        self._error: BaseException | None = None
        self._inputs: list[tuple[str, int]] = []
        self._finished_inputs: set[tuple[str, int]] = set()
        self._align = BarrierAligner(())
        self._held: deque = deque()  # (msg, sender) of blocked inputs, in arrival order
        self._next_seq: dict[tuple[str, int], int] = {}  # per input channel
        self._early: dict[tuple[str, int], dict[int, Any]] = {}  # arrived before their turn
        self._drain = True  # end of stream flushes open windows, unless after a savepoint
        self._ended = False  # end of stream handled (a committing sink may still hold data)
        # restored from its final state: it drained before the failure, so its end of stream
        # must not flush (emit its open windows) a second time
        self.restored_final = False
        self._last_tick = 0.0
        self._acks: list = []  # acks sent to the coordinator and maybe not yet handled
        # set by connect(), which the host calls before any message or the source loop
        self.emitter: Emitter = None  # type: ignore[assignment]
        self._exporter = StepExporter(ctx.job_name, ctx.step_id, ctx.instance)
        self._valve: InputWatermarks = None  # type: ignore[assignment]  # (connect() sets it)
        self._input_index = {e.upstream: n for n, e in enumerate(step.inputs)}
        self._build(resume_state)

    def _build(self, resume_state: Any) -> None:
        """Build this kind's part of the step (reader, logic or writer) from its spec."""
        raise NotImplementedError

    # -- wiring --------------------------------------------------------------------------
    def connect(self, edges: list[OutEdge], handles: dict[str, list[Any]],
                inputs: list[tuple[str, int]], local: dict[tuple[str, int], StepTask]):
        self.emitter = Emitter((self.ctx.step_id, self.ctx.instance), edges, handles,
                               self.opts.channel_bytes, self.opts.channel_calls, local,
                               self.opts.channel_target_s or 0.0, self.opts.batch_target_s,
                               self.unaligned)
        self._inputs = list(inputs)
        self._align = BarrierAligner(self._inputs)
        self._valve = InputWatermarks(self._inputs)
        return True

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
            raise self._fail(exc) from None
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
            combined = self._valve.update(sender, msg)
            self._input_watermark(sender)
            self._forward_watermark(combined)
        elif isinstance(msg, Tick):
            self._on_tick(msg)
        elif isinstance(msg, EndOfStream):
            self._finished_inputs.add(sender)
            self._drain = self._drain and msg.drain
            if msg.drain and len(self._finished_inputs) < len(self._inputs):
                # a finished input no longer holds event time back (after a savepoint stop
                # nothing may fire: the open windows are in the savepoint)
                combined = self._valve.finish(sender)
                self._input_watermark(sender)
                self._forward_watermark(combined)
            self._aligned(self._align.on_end(sender))
            if len(self._finished_inputs) >= len(self._inputs):
                self._on_eos()

    def _on_batch(self, batch: Batch, sender: tuple[str, int]) -> None:
        c = self.counters
        t0 = time.perf_counter()
        ch0 = self.emitter.chained_s
        c.records_in += len(batch)
        c.batches_in += 1
        self._process(batch, sender)
        c.busy_s += time.perf_counter() - t0 - (self.emitter.chained_s - ch0)
        self._export()

    def _process(self, batch: Batch, sender: tuple[str, int]) -> None:
        """Handle one input batch (operators and sinks)."""
        raise NotImplementedError

    def _input_watermark(self, sender: tuple[str, int]) -> None:
        """The watermark of ``sender``'s input may have advanced (operators with several
        inputs act on it)."""

    def _forward_watermark(self, msg: Watermark | None) -> None:
        """The instance's watermark advanced (or it turned idle or active): pass it on."""
        if msg is not None:
            self.emitter.emit_control(msg)

    def _on_tick(self, tick: Tick) -> None:
        now = time.monotonic()
        if now - self._last_tick >= self.tick_s:
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
        handle = self._with_dead_letters(self._state(cid))
        took = time.perf_counter() - t0
        # passing the barrier on snapshots the steps chained after this one, in this call:
        # their time is theirs (as busy time leaves out chained work), not this step's
        held = self._pass_barrier(barrier)
        t1 = time.perf_counter()
        acked = self._with_channels(barrier, handle, held)
        self._checkpointed(cid, acked, took + time.perf_counter() - t1)
        self._ack(cid, acked)

    def _state(self, checkpoint_id: int) -> Any:
        """This task's state for checkpoint ``checkpoint_id``."""
        raise NotImplementedError

    def _pass_barrier(self, barrier: Barrier) -> dict:
        """Send the barrier on; what this task holds in flight (unaligned checkpoints)."""
        return self.emitter.emit_barrier(barrier)

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
            raise self._fail(exc) from None

    def replay(self) -> None:
        """Restored from an unaligned checkpoint: handle the batches it held in flight to
        this task first, before anything new arrives."""
        msgs, self._replay = self._replay, []
        try:
            for sender, batch in msgs:
                self._on_batch(batch, tuple(sender))
        except BaseException as exc:
            raise self._fail(exc) from None

    def _ack(self, checkpoint_id: int, handle: Any) -> None:
        if self.coordinator is not None:
            self._acks = [r for r in self._acks if not ray.wait([r], timeout=0)[0]]
            self._acks.append(self.coordinator.ack.remote(checkpoint_id, self._key(), handle,
                                                          self.ctx.attempt_number))

    def _with_dead_letters(self, handle: Any) -> Any:
        """What a checkpoint holds of this task: its state ``handle``, with the dead letters
        it has made if any (written out to the dead-letter sink first, so that a checkpoint
        never stands for dead letters a failure could still lose)."""
        if not self.counters.dead_letters:
            return handle
        if self._dead_writer is not None:
            self._dead_writer.flush()
        return DeadLetterHandle(handle, self.ctx.run_id, self.counters.dead_letters,
                                tuple(self.kept_dead))

    def restore_dead_letters(self, restored: DeadLetterHandle) -> None:
        """A recovery of this run: the dead letters made up to the checkpoint."""
        self.counters.dead_letters = restored.count
        self.kept_dead = list(restored.kept)

    def _task_finished(self, handle: Any) -> None:
        """Tell the coordinator this task ended, with its final state: the checkpoints that
        follow (and the final one) carry it in place of an ack."""
        handle = self._with_dead_letters(handle)
        # The coordinator runs calls on several threads, so an ack sent just before this
        # could be handled after it: the acks must have landed first.
        ray.get(self._acks)
        self._acks = []
        # drained: it flushed its open state (a savepoint stop keeps it for a resume)
        self.coordinator.task_finished.remote(self._key(), handle,
                                              self._drain or self.restored_final,
                                              self.ctx.attempt_number)

    def _key(self) -> tuple[str, int]:
        return (self.ctx.step_id, self.ctx.instance)

    def notify_complete(self, checkpoint_id: int, final: frozenset = frozenset()) -> None:
        """Checkpoint ``checkpoint_id`` is complete (``final``: the tasks whose final state
        it holds)."""

    def release_snapshots(self) -> None:
        """The job ran to its end: delete the snapshots this task still keeps."""

    # -- end of stream -------------------------------------------------------------------
    def _on_eos(self) -> None:
        handle, holds = self._end_of_stream()
        if self._dead_writer is not None:
            self._dead_writer.flush()
        self._export(final=True)
        self._ended = True
        if self.coordinator is not None:
            self._task_finished(handle)
        if not holds:
            self._done.set()

    def _end_of_stream(self) -> tuple[Any, bool]:
        """Every input ended: flush; this task's final state, and whether it still holds
        output that a checkpoint must commit before it is done."""
        raise NotImplementedError

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

    def _fail(self, exc: BaseException) -> BaseException:
        """Record the task's error (the root cause, as a StepError naming the step and
        instance, unless Ray's own) and end it; returns the error, for the caller to raise."""
        exc = unwrap(exc)
        if not isinstance(exc, (StepError, ray.exceptions.RayError)):
            exc = StepError(self.ctx.step_id, self.ctx.instance, "-", describe_exception(exc))
        self._error = exc
        self._done.set()
        return exc

    def _sync_emitter(self) -> None:
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
            "result": self._result(),
            "error": self._error,
        }

    def _result(self) -> Any:
        """What a sink returns to the driver (a collecting sink's records); None."""
        return None


def _dead_json(d: DeadLetter) -> bytes:
    return json.dumps({"step_id": d.step_id, "instance": d.instance, "reason": d.reason,
                       "where": d.where, "record": brief(d.record, 2000)}).encode()
