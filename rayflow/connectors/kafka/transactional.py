"""The exactly-once Kafka sink: records written in one transaction per completed
checkpoint, each named by a header, so that a restore writes only what is not on the topic.
The transactions run in a process of their own (:mod:`rayflow.connectors.kafka.committer`)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayflow.connectors.kafka.committer import (  # noqa: F401 - the sink's names, kept here
    EPOCH_HEADER,
    CommitProcessDied,
    _split,
    commit_lock,
)
from rayflow.connectors.kafka.writer import _KafkaWriter
from rayflow.core.operators import Rescaled

log = logging.getLogger(__name__)


def serializes_commits(cluster_id: str | None, setting: bool | None) -> bool:
    """Whether an exactly-once sink commits one transaction at a time: ``setting`` when
    given, else on a Tansu broker (the embedded default). Tansu 0.6's in-memory engine
    loses or hides committed records when transactions of several producers run at once
    (measured: 6 producers, 3 transactions each, into 2 shared partitions lost records
    in 4 rounds of 40; one at a time, none of 60); Apache Kafka does not."""
    if setting is not None:
        return setting
    return "tansu" in (cluster_id or "").lower()


def _join(items: list) -> tuple[np.ndarray, np.ndarray] | list:
    """A list of bytes as one numpy array of uint8 and their lengths (int64): an epoch of
    such arrays goes to the checkpoint coordinator out of band, in one copy, with no record
    pickled (a pickle of the epoch's blobs cost the sink's barrier 30-50 ms per 16 MB
    epoch under load on the 2-core VM); any other list (str values, None keys) as it is."""
    try:
        blob = b"".join(items)
    except TypeError:
        return items
    return (np.frombuffer(blob, dtype=np.uint8),
            np.fromiter(map(len, items), dtype=np.int64, count=len(items)))


def _batch_bytes(packed: tuple) -> int:
    """The bytes of one :func:`_pack_batch`-ed batch, values and keys."""
    return _packed_bytes(packed[0]) + _packed_bytes(packed[1])


def _pack_batch(values: list, keys: list | None) -> tuple:
    """One batch of an epoch as a checkpoint holds it: values and keys :func:`_join`-ed."""
    return _join(values), None if keys is None else _join(keys)


def _packed_bytes(packed: tuple | list | None) -> int:
    """The bytes of a :func:`_join`-ed list (of a list kept as it is: the lengths of its
    str and bytes items)."""
    if isinstance(packed, tuple):
        return int(sum(a.nbytes for a in packed))
    return sum(len(x) for x in packed if isinstance(x, (bytes, str))) if packed else 0


@dataclass(frozen=True)
class PackedEpoch:
    """An epoch's batches as a checkpoint holds them: ``[(values, keys)]``, each list
    :func:`_join`-ed into numpy arrays (or kept as a list when it is not all bytes), and
    their size in bytes."""

    batches: list
    nbytes: int

    @classmethod
    def of(cls, packed: list[tuple]) -> PackedEpoch:
        return cls(packed, sum(map(_batch_bytes, packed)))


def pack_epoch(parts: list[tuple[list, list | None]]) -> PackedEpoch:
    """An epoch's ``[(values, keys)]`` as a checkpoint holds it (the writer packs each batch
    as it comes)."""
    return PackedEpoch.of([_pack_batch(v, k) for v, k in parts])


def unpack_epoch(epoch: PackedEpoch | bytes | np.ndarray | list) -> list[tuple[list, list | None]]:
    """The ``[(values, keys)]`` of :func:`pack_epoch`; or of a checkpoint of an earlier
    version, which pickled its packed batches into bytes (or a numpy array of them), or
    the lists themselves (pickled, or as they are)."""
    if isinstance(epoch, list):  # the record lists themselves (the oldest format)
        return epoch
    if isinstance(epoch, PackedEpoch):
        batches = epoch.batches
    else:
        batches = pickle.loads(epoch if isinstance(epoch, bytes) else epoch.tobytes())
    return [(_split(v), None if k is None else _split(k)) for v, k in batches]


def _epoch_bytes(parts: Any) -> int:
    """The bytes a pending epoch holds (0 for the record lists of the oldest format)."""
    if isinstance(parts, PackedEpoch):
        return parts.nbytes
    return 0 if isinstance(parts, list) else len(parts)


@dataclass
class TransactionalState:
    """An exactly-once sink's checkpointed state: its run and the epochs it has not
    committed (``epoch -> {"parts": PackedEpoch, "low": offsets}``, see
    :func:`unpack_epoch`).

    Each epoch's records are packed once, batch by batch as they come: a later checkpoint
    that still holds the epoch (its commit is under way) carries the same arrays, so a
    backlog of epochs costs a copy, not a pickle per record per checkpoint. The instance
    that wrote them commits the records it still holds as written; only a restored one
    unpacks them.
    ``checkpoint_bytes`` is what this checkpoint added (the new epoch)."""

    run: str
    pending: dict[int, dict] = field(default_factory=dict)
    checkpoint_bytes: int = 0


class _TransactionalWriter(_KafkaWriter):
    """Exactly-once sink: two-phase commit tied to checkpoints, correct even on brokers
    whose ``read_committed`` shows aborted data (Tansu, the embedded default).

    - Records of each checkpoint epoch are held back; at the barrier (pre-commit) they
      become part of the checkpoint, with a lower bound of the topic's end offsets.
    - When the checkpoint completes (it is durable by then), they are written in one Kafka
      transaction, each with a header ``writer:epoch:seq``, by the instance's commit
      process (:mod:`rayflow.connectors.kafka.committer`), beside the operators.
    - A restored instance first fences its predecessor (its commit process calls
      ``init_transactions`` on the same transactional id), then reads the topic from those
      offsets with ``read_committed`` and writes again only the records of its restored
      epochs that are not there. On Apache Kafka an interrupted transaction is invisible,
      so all are written again; on a broker that shows the part that reached it, only the
      rest is. Either way each record is visible once. A commit process that dies is
      replaced the same way, and its commit goes on.

    No commits topic is needed (no topic-create rights, nothing to replicate).

    On a Tansu broker (or with ``serialize_commits=True``) the instances on one machine
    take turns: a file lock named after the bootstrap address holds each transaction,
    from its first record to its commit (see :func:`serializes_commits`). Its wait counts
    as the commit's time.

    A commit runs beside the writes and pre-commits of later epochs: an epoch leaves
    ``pending`` only once its transaction committed, so a checkpoint taken meanwhile still
    holds it, and a restore from there writes only what is not on the topic.
    """

    commits_beside_writes = True

    def __init__(self, spec, ctx, committer, scanner, resume_state: Any):
        """``committer(serial)`` starts a commit process (a
        :class:`~rayflow.connectors.kafka.committer.CommitProcess`) that takes the commit
        turn when ``serial``."""
        if isinstance(resume_state, Rescaled):
            # a rescale resumes from a savepoint: the old instances committed everything at
            # their end of stream, so there is nothing of theirs to commit
            resume_state = None
        if isinstance(resume_state, dict):  # a checkpoint of an earlier version
            resume_state = TransactionalState(resume_state["run"], resume_state["pending"])
        # The writer id names this sink instance *and the run*: a restored instance keeps the
        # run of its checkpoint (its epochs continue), a fresh job starts new ones.
        self.run = resume_state.run if resume_state else ctx.run_id
        ident = f"{ctx.job_name}/{self.run}/{ctx.step_id}/{ctx.instance}".encode()
        self.writer = hashlib.blake2b(ident, digest_size=8).hexdigest()
        self.scanner = scanner
        self.buffer: list[tuple[list, list | None]] = []
        self._packed: list = []  # the buffer's batches, as _pack_batch packs them
        self.pending: dict[int, dict] = {}  # epoch -> {"parts": PackedEpoch, "low": offsets}
        self._buffer_bytes = 0
        self._room = threading.Condition()  # a commit ended: writes may go on
        self._committing = False
        self.waited_s = 0.0  # time writes waited for a commit (backpressure)
        serial = serializes_commits(scanner.cluster_id(), spec.serialize_commits)
        self._new_committer = lambda: committer(serial)
        # it starts, and fences the predecessor, while the job starts: the first commit
        # (or the restore below) waits for that
        super().__init__(spec, ctx, self._new_committer())
        # our next records land at or after this (an end past open transactions: the end
        # a read_committed consumer sees stops before them, at 0 on Tansu)
        self.low = scanner.log_end_offsets(spec.topic)
        if resume_state and resume_state.pending:
            self.pending = dict(resume_state.pending)
            self._recommit()

    def write(self, items, event_times, in_time):
        values, keys, dead = self._encode(items, in_time)
        if values:
            self._wait_for_room()
            self.buffer.append((values, keys))
            # packed as they come: a barrier sends a few arrays, no record pickled
            packed = _pack_batch(values, keys)
            self._packed.append(packed)
            self._buffer_bytes += _batch_bytes(packed)
        return dead

    def uncommitted_bytes(self) -> int:
        """Bytes of records held for commits: pre-committed epochs and the open one."""
        return self._buffer_bytes + sum(_epoch_bytes(e["parts"])
                                        for e in self.pending.values())

    def _wait_for_room(self) -> None:
        """Backpressure: while a commit is under way and more than ``max_uncommitted_bytes``
        wait for it, wait (the commit runs on another thread). Waiting only on a running
        commit never deadlocks: an epoch whose checkpoint was aborted is committed with a
        later checkpoint, whose barrier this task must still reach."""
        limit = self.spec.max_uncommitted_bytes
        with self._room:
            while self._committing and self.uncommitted_bytes() > limit:
                t0 = time.perf_counter()
                self._room.wait(1.0)
                self.waited_s += time.perf_counter() - t0

    def snapshot(self, checkpoint_id):
        added = 0
        if self.buffer:
            epoch = PackedEpoch(self._packed, self._buffer_bytes)
            self.pending[checkpoint_id] = {"parts": epoch, "low": dict(self.low)}
            self.buffer, self._packed, self._buffer_bytes = [], [], 0
            added = epoch.nbytes
        return TransactionalState(self.run, dict(self.pending), added)

    def uncommitted(self) -> bool:
        return bool(self.pending or self.buffer)

    def commit(self, checkpoint_id):
        ready = sorted(cid for cid in list(self.pending) if cid <= checkpoint_id)
        if not ready:
            return
        with self._room:
            self._committing = True
        try:
            # later epochs land after what is on the topic now (a restore reads from there)
            self.low = self.scanner.log_end_offsets(self.spec.topic)
            try:
                self._send(ready, set())
            except CommitProcessDied as exc:
                # a new one fences what the dead one left open; what of it is visible stays
                log.warning("%s; starting another, which writes what is not on %s",
                            exc, self.spec.topic)
                with contextlib.suppress(Exception):
                    self.p.close()
                self.p = self._new_committer()
                self._recommit(ready)
        finally:
            with self._room:
                self._committing = False
                self._room.notify_all()

    def _send(self, ready: list[int], skip: set[bytes]) -> None:
        epochs = []
        for cid in ready:  # as the checkpoint holds them; an earlier version's, unpacked
            parts = self.pending[cid]["parts"]
            epochs.append((cid, parts.batches if isinstance(parts, PackedEpoch)
                           else unpack_epoch(parts)))
        self.p.transaction(self.spec.topic, self.writer, epochs, skip)
        with self._room:
            for cid in ready:
                del self.pending[cid]

    def _recommit(self, ready: list[int] | None = None) -> None:
        """Commit the restored epochs (or ``ready``), skipping records of theirs already
        visible."""
        self.p.ready()  # the predecessor is fenced: what it wrote is all there is
        ready = sorted(self.pending) if ready is None else ready
        low: dict[int, int] = {}
        for cid in ready:
            for p, off in self.pending[cid]["low"].items():
                low[int(p)] = min(low.get(int(p), off), off)
        prefix = f"{self.writer}:".encode()
        seen = {t for t in self.scanner.scan_headers(self.spec.topic, low, EPOCH_HEADER)
                if t.startswith(prefix)}
        self._send(ready, seen)

    def flush(self):
        pass  # nothing becomes visible outside a completed checkpoint

    def close(self):
        super().close()
        self.scanner.close()
