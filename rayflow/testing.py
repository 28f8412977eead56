"""Fault injection for recovery tests: wrappers that crash their actor once, at a chosen
point, the way a machine failure would (the process exits; nothing is cleaned up).

The "once" is a marker file, so the restarted instance runs normally.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayflow.core.connectors import SinkSpec, SinkWriter
from rayflow.core.operators import Logic, OperatorSpec


def _crash_once(marker: str) -> None:
    path = Path(marker)
    if path.exists():
        return
    path.write_text("crashed")
    os._exit(17)  # like a lost node: no exception, no cleanup


@dataclass(frozen=True)
class CrashDuringCheckpoint(OperatorSpec):
    """Runs ``inner``; its instance 0 dies while snapshotting checkpoint ``at_checkpoint``
    (after some tasks have acknowledged it, before this one does)."""

    inner: OperatorSpec
    at_checkpoint: int
    marker: str

    def build(self, ctx, resume_state=None):
        logic = self.inner.build(ctx, resume_state)
        spec = self
        seen = {"n": 0}

        class _Crashing(Logic):
            def __init__(self):
                super().__init__(ctx)

            def open(self):
                logic.open()

            def process(self, items, times):
                return logic.process(items, times)

            def process_input(self, index, items, times):
                return logic.process_input(index, items, times)

            def on_watermark(self, watermark):
                return logic.on_watermark(watermark)

            def on_input_watermark(self, index, watermark):
                return logic.on_input_watermark(index, watermark)

            def on_tick(self, now):
                return logic.on_tick(now)

            def on_end(self):
                return logic.on_end()

            def snapshot(self):
                seen["n"] += 1
                if ctx.instance == 0 and seen["n"] >= spec.at_checkpoint:
                    _crash_once(spec.marker)
                return logic.snapshot()

            def close(self):
                logic.close()

        return _Crashing()


@dataclass(frozen=True)
class CrashBeforeCommit(SinkSpec):
    """Runs sink ``inner``; it dies after pre-committing checkpoint ``at_checkpoint`` (the
    checkpoint is complete) and before committing it."""

    inner: SinkSpec
    at_checkpoint: int
    marker: str

    def build(self, ctx, resume_state=None):
        writer = self.inner.build(ctx, resume_state)
        spec = self

        class _Crashing(SinkWriter):
            def write(self, items, times, in_time):
                return writer.write(items, times, in_time)

            def flush(self):
                writer.flush()

            def snapshot(self, checkpoint_id):
                return writer.snapshot(checkpoint_id)

            def commit(self, checkpoint_id):
                if checkpoint_id >= spec.at_checkpoint:
                    _crash_once(spec.marker)
                writer.commit(checkpoint_id)

            def uncommitted(self):
                return writer.uncommitted()

            def result(self):
                return writer.result()

            def close(self):
                writer.close()

        return _Crashing()


def wait_for(predicate: Any, timeout_s: float = 30.0, every_s: float = 0.1) -> Any:
    """Poll ``predicate()`` until it is truthy; return its value or raise TimeoutError."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise TimeoutError(f"condition not met within {timeout_s}s")


@dataclass(frozen=True)
class CrashDuringCommit(SinkSpec):
    """Runs the exactly-once :class:`~rayflow.KafkaSink` ``inner``; its instance
    ``instance`` dies in the middle of committing its first epoch: every record of the
    transaction has reached the broker, the transaction is not committed. On a broker whose
    ``read_committed`` shows aborted data, those records are visible: the worst case for a
    restore."""

    inner: SinkSpec
    marker: str
    instance: int = 0

    def build(self, ctx, resume_state=None):
        writer = self.inner.build(ctx, resume_state)
        committer = getattr(writer, "p", None)  # the sink's commit process
        if ctx.instance == self.instance and committer is not None and \
                ctx.guarantee == "exactly_once":
            transaction, marker = committer.transaction, self.marker

            def die_before_commit(*args):
                if Path(marker).exists():
                    return transaction(*args)
                # the sink's process dies once the records are at the broker; its commit
                # process, which sees it go, ends too, without committing
                return transaction(*args, before_commit=lambda: _crash_once(marker))

            committer.transaction = die_before_commit
        return writer


_DIES_IN_A_TRANSACTION = r"""
import os, sys
from confluent_kafka import Producer
bootstrap, topic, txn, partition, n = sys.argv[1:]
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn})
p.init_transactions(30)
p.begin_transaction()
for i in range(int(n)):
    p.produce(topic, value=b"open-%d" % i, partition=int(partition))
p.flush(30)
os._exit(0)  # inside its transaction, as a machine failure would end it
"""


def leave_transaction_open(bootstrap: str, topic: str, transactional_id: str,
                           records: int = 5, partition: int = 0) -> None:
    """A producer that dies inside its transaction: ``records`` records (``b"open-<i>"``)
    reach ``partition`` of ``topic``, and the transaction stays open until a producer with
    ``transactional_id`` starts and fences it (what a sink that died mid-commit leaves
    behind). The producer runs, and dies, in a process of its own."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", _DIES_IN_A_TRANSACTION, bootstrap, topic,
                    transactional_id, str(partition), str(records)], check=True, timeout=60)
