"""Barrier alignment over a task's inputs: pure, events in, actions out (no Ray).

A task with several inputs snapshots checkpoint ``n`` once barrier ``n`` has arrived on every
input that has not ended. An input whose barrier came first is *blocked*: what it sends next
belongs after the checkpoint, so the task holds it until the others catch up (Flink's aligned
checkpoints).

Unaligned checkpoints use the same machine. A sender passes each barrier twice: out of band
(``block=False``: it overtakes the batches queued in front of the task, which the checkpoint
stores, see :mod:`rayflow.runtime.inflight`) and in its channel, in order. The first copy to
arrive counts; only an in-channel copy that arrives before the snapshot blocks its input,
which happens only when the out-of-band barrier of another input is late:

    >>> o = BarrierAligner([("up", 0), ("up", 1)])
    >>> o.on_barrier(Barrier(1), ("up", 0), block=False), o.is_blocked(("up", 0))
    ([], False)
    >>> o.on_barrier(Barrier(1), ("up", 1), block=False)
    [Aligned(barrier=Barrier(checkpoint_id=1, stop_after=False))]
    >>> o.on_barrier(Barrier(1), ("up", 0)), o.is_blocked(("up", 0))  # the late copy
    ([], False)

Barriers of one checkpoint need not all arrive. A checkpoint aborted while in flight (a
timeout, or a failover region restarting) may reach some sources and not others, and the
next one follows. As in Flink, a newer barrier abandons the alignment in progress, and an
older barrier than the newest seen is stale and ignored, so no snapshot ever mixes two cuts:

    >>> from rayflow.core.messages import Barrier
    >>> a = BarrierAligner([("up", 0), ("up", 1)])
    >>> a.on_barrier(Barrier(1), ("up", 0)), a.is_blocked(("up", 0))
    ([], True)
    >>> a.on_barrier(Barrier(2), ("up", 1))   # 1 was aborted: input 0 never sends it again
    [Abandoned(checkpoint_id=1)]
    >>> a.on_barrier(Barrier(2), ("up", 0))
    [Aligned(barrier=Barrier(checkpoint_id=2, stop_after=False))]
    >>> a.on_barrier(Barrier(1), ("up", 1))   # stale
    []
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rayflow.core.messages import Barrier

Sender = tuple[str, int]


@dataclass(frozen=True)
class Aligned:
    """Every live input delivered ``barrier``: snapshot, forward it, release the held inputs."""

    barrier: Barrier


@dataclass(frozen=True)
class Abandoned:
    """A newer barrier arrived before checkpoint ``checkpoint_id`` aligned: release the held
    inputs without a snapshot (the checkpoint was aborted upstream)."""

    checkpoint_id: int


class BarrierAligner:
    """The alignment state of one task.

    Args:
        inputs: the upstream instances that send to it.
    """

    def __init__(self, inputs: Iterable[Sender]):
        self.inputs = set(inputs)
        self.ended: set[Sender] = set()
        self.arrived: set[Sender] = set()  # barrier of the checkpoint aligning came from
        self.blocked: set[Sender] = set()  # ... and their later messages are held
        self.aligning: Barrier | None = None
        self.newest = 0  # the newest checkpoint id aligned or abandoned here

    def is_blocked(self, sender: Sender) -> bool:
        """Whether what ``sender`` sends now must be held until the alignment ends."""
        return sender in self.blocked

    def on_barrier(self, barrier: Barrier, sender: Sender, block: bool = True) -> list:
        """``barrier`` came from ``sender``: in its channel, after everything it sent before
        it (``block``: hold what follows until the snapshot), or out of band."""
        cid = barrier.checkpoint_id
        current = self.aligning.checkpoint_id if self.aligning is not None else None
        if cid <= self.newest or (current is not None and cid < current):
            return []  # stale: its checkpoint was aborted, a newer one is on its way
        acts: list = []
        if current is not None and cid > current:
            acts.append(Abandoned(current))
            self.newest = current
            self.arrived.clear()
            self.blocked.clear()
            self.aligning = None
        if self.aligning is None:
            self.aligning = barrier
        self.arrived.add(sender)
        if block:
            self.blocked.add(sender)
        return acts + self._check()

    def on_end(self, sender: Sender) -> list:
        """``sender`` ended its stream: the alignment no longer waits for it."""
        self.ended.add(sender)
        self.blocked.discard(sender)
        return self._check()

    def _check(self) -> list:
        if self.aligning is None or not (self.inputs - self.ended) <= self.arrived:
            return []
        barrier, self.aligning = self.aligning, None
        self.newest = barrier.checkpoint_id
        self.arrived.clear()
        self.blocked.clear()
        return [Aligned(barrier)]


