"""Unaligned checkpoints: the in-flight batches that become part of a checkpoint. Pure: no Ray.

With ``checkpoint.unaligned`` (Flink's unaligned checkpoints), a barrier overtakes the
batches queued in the channels instead of waiting behind them: a sender passes it to its
receivers out of band, on the actor's barrier thread, and records the batches it has sent
that the receiver may not have handled yet (the calls still in its window). A receiver
snapshots as soon as the barrier has arrived from every input that is still running,
between two messages, and records per input channel how many messages it had handled.
A checkpoint's handle of a task is then an :class:`UnalignedHandle`: its state, what it
had in flight per output channel, and what it had handled per input channel.

Why nothing is lost or counted twice. On the channel from S to R, let the barrier follow
message ``B - 1``. S retires a call only after R handled it, in order, so every message S
no longer holds was handled before S sent the barrier, hence before R's snapshot: the
messages R had not handled at its snapshot, ``P <= seq < B``, are all among those S held.
Restoring, R takes its state (everything before ``P``) and then handles S's recorded
messages from ``P`` on (:func:`replay`), before anything new; the messages from ``B`` on
are sent again by the restored S. A task that had finished (its final state stands in the
checkpoint) handled all its input: nothing is replayed into it.

Savepoints stay aligned, as in Flink: their barriers travel in the channels.

    >>> from rayflow.core.records import Batch
    >>> b = [Batch([i], None, 0.0) for i in range(3)]
    >>> handles = {("s", 0): UnalignedHandle(5, {("k", 0): ((7, b[0]), (8, b[1]), (9, b[2]))}),
    ...            ("k", 0): UnalignedHandle("state", {}, {("s", 0): 8})}
    >>> state_of(handles[("s", 0)]), state_of("raw")
    (5, 'raw')
    >>> got = replay(handles, frozenset(), {"k": 1}, {})
    >>> [(sender, m.items) for sender, m in got[("k", 0)]]
    [(('s', 0), [1]), (('s', 0), [2])]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rayflow.core.records import Batch, partition_indices, take

Task = tuple[str, int]


@dataclass(frozen=True)
class UnalignedHandle:
    """One task's part of an unaligned checkpoint.

    ``state``: what an aligned checkpoint would hold (the operator's snapshot, a source's
    position, a sink's pre-committed epoch). ``inflight``: per receiver, the ``(seq, batch)``
    this task had sent and not seen handled when it passed the barrier on. ``processed``: per
    sender, how many of its messages this task had handled when it snapshotted."""

    state: Any
    inflight: dict[Task, tuple[tuple[int, Batch], ...]] = field(default_factory=dict)
    processed: dict[Task, int] = field(default_factory=dict)

    @property
    def checkpoint_bytes(self) -> int:
        """Bytes of the state (as :func:`rayflow.metrics.handle_bytes` counts them) and of
        the batches in flight."""
        from rayflow.core.records import nbytes
        from rayflow.metrics import handle_bytes

        return handle_bytes(self.state) + sum(nbytes(b.items) for msgs in self.inflight.values()
                                              for _, b in msgs)


@dataclass(frozen=True)
class DeadLetterHandle:
    """A task's state in a checkpoint, with the dead letters the task had made by then
    (those after a failure came from a replay): ``count`` in all and the ``kept`` ones, of
    run ``run``. A recovery of that run restores them, so a job's dead letters and their
    count hold each once (under exactly-once) whatever failed; another job resumed from the
    checkpoint starts with none. Only a task with dead letters wraps its state so."""

    state: Any
    run: str
    count: int
    kept: tuple = ()

    @property
    def checkpoint_bytes(self) -> int:
        from rayflow.metrics import handle_bytes

        return handle_bytes(self.state)


def state_of(handle: Any) -> Any:
    """The state a task restores from, whatever kind of checkpoint holds it."""
    if isinstance(handle, UnalignedHandle):
        handle = handle.state
    return handle.state if isinstance(handle, DeadLetterHandle) else handle


def dead_letters_of(handle: Any) -> DeadLetterHandle | None:
    """The dead letters a task's checkpoint handle holds (None: it had made none)."""
    if isinstance(handle, UnalignedHandle):
        handle = handle.state
    return handle if isinstance(handle, DeadLetterHandle) else None


def replay(handles: dict[Task, Any], finished: frozenset,
           parallelism: dict[str, int],
           routes: dict[tuple[str, str], tuple[str, Callable[[Any], Any] | None]]
           ) -> dict[Task, list[tuple[Task, Batch]]]:
    """What each task of the restored job handles first: the batches its checkpoint holds in
    flight to it, ``(sender, batch)`` in the order they were sent on each channel.

    ``parallelism``: the restored job's, per step. Where a step's parallelism changed, its
    batches go where its input edge sends them now: ``routes[(upstream, step)]`` is
    ``(partitioning, key_fn)``; hash edges split each batch by key, the others deal whole
    batches round-robin (a broadcast edge's copies cannot be dealt again: an error).

        >>> h = {("s", 0): UnalignedHandle(0, {("k", 0): ((0, Batch([1, 2, 3, 4], None, 0.0)),),
        ...                                    ("k", 1): ((3, Batch([5], None, 0.0)),)}),
        ...      ("k", 0): UnalignedHandle(0, {}, {}), ("k", 1): UnalignedHandle(0, {}, {("s", 0): 3})}
        >>> got = replay(h, frozenset(), {"k": 3}, {("s", "k"): ("hash", lambda x: x % 3)})
        >>> {k: sorted(x for _, b in v for x in b.items) for k, v in sorted(got.items())}
        {('k', 0): [3], ('k', 1): [1, 4], ('k', 2): [2, 5]}
    """
    old_par: dict[str, int] = defaultdict(int)
    for step, i in handles:
        old_par[step] = max(old_par[step], i + 1)
    pending: dict[Task, list[tuple[Task, Batch]]] = defaultdict(list)
    for sender in sorted(handles):
        h = handles[sender]
        if not isinstance(h, UnalignedHandle):
            continue
        for target, msgs in sorted(h.inflight.items()):
            if target in finished:
                continue  # it handled all its input before its final state
            rh = handles.get(target)
            if not isinstance(rh, UnalignedHandle):
                raise ValueError(f"unaligned checkpoint: task {target} holds no channel "
                                 f"positions, but {sender} has batches in flight to it")
            done = rh.processed.get(sender, 0)
            for seq, batch in msgs:
                if seq >= done:
                    pending[target].append((sender, batch))
    out: dict[Task, list[tuple[Task, Batch]]] = defaultdict(list)
    turn: dict[tuple[str, str], int] = defaultdict(int)
    for (step, i), todo in sorted(pending.items()):
        n = parallelism.get(step, old_par[step])
        if n == old_par[step]:
            out[(step, i)].extend(todo)
            continue
        for sender, batch in todo:
            kind, key_fn = routes.get((sender[0], step), ("rebalance", None))
            if kind == "hash" and key_fn is not None:
                for j, idx in enumerate(partition_indices(batch.items, key_fn, n)):
                    if len(idx):
                        times = None if batch.event_times is None else batch.event_times[idx]
                        out[(step, j)].append((sender, Batch(take(batch.items, idx), times,
                                                             batch.in_time)))
            elif kind == "broadcast":
                raise ValueError(
                    f"step {step!r} changed parallelism ({old_par[step]} -> {n}) and its "
                    f"unaligned checkpoint holds broadcast batches in flight, which cannot be "
                    f"dealt to other instances: resume from a savepoint (aligned) to rescale")
            else:
                j = turn[(sender[0], step)] % n
                turn[(sender[0], step)] += 1
                out[(step, j)].append((sender, batch))
    return dict(out)
