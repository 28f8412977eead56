"""Images through Kafka: an encoded image larger than a message is split into chunks that
share its key (and so a partition), and put back together by the source."""

from __future__ import annotations

import struct
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rayflow.connectors.images.codecs import BadInput, MiB, _EncodingWriter, check_image_ext
from rayflow.core.connectors import (
    SinkSpec,
    SinkWriter,
    SourceReader,
    SourceSpec,
)
from rayflow.core.operators import (
    Rescaled,
    StepContext,
)
from rayflow.errors import check_number

# -- Kafka: chunked images -------------------------------------------------------------------

# Chunk header: magic, image id, chunk index, chunk count, total bytes, key length; then key.
_MAGIC = b"RFI1"
_HEADER = struct.Struct(">4s16sIIQH")


_MAX_KEY_BYTES = 1024


def _key_bytes(key: str) -> bytes:
    kb = key.encode()
    if len(kb) > _MAX_KEY_BYTES:
        raise ValueError(f"image key of {len(kb)} bytes is longer than the {_MAX_KEY_BYTES} "
                         f"a chunk header holds: {key[:80]!r}...")
    return kb


def chunk_image(data: bytes, key: str, chunk_bytes: int) -> list[bytes]:
    """Split an encoded image into Kafka messages of at most ``chunk_bytes`` bytes each; each
    carries ``key`` (at most 1024 bytes), which :class:`KafkaImageSource` gives the image."""
    kb = _key_bytes(key)
    room = chunk_bytes - _HEADER.size - len(kb)
    if room <= 0:
        raise ValueError(f"chunk_bytes={chunk_bytes} leaves no room for data")
    count = max(1, -(-len(data) // room))
    image_id = uuid.uuid4().bytes
    return [_HEADER.pack(_MAGIC, image_id, i, count, len(data), len(kb)) + kb
            + data[i * room : (i + 1) * room] for i in range(count)]


def chunk_message_key(message: bytes) -> bytes:
    """Kafka key of a chunk: its image id, so every chunk of an image shares a partition."""
    return message[4:20] if message[:4] == _MAGIC else b""


@dataclass(frozen=True)
class KafkaImageSink(SinkSpec):
    """Encode each ``(key, image)`` and write it to a Kafka topic, chunked when large.

    Args:
        topic, bootstrap, client, options: as for :class:`rayflow.KafkaSink`.
        ext: encoding (``.png``).
        chunk_bytes: largest message written; keep it under the broker's
            ``message.max.bytes`` (1 MB by default).
        chunking: False writes each image as one message; an image over ``chunk_bytes``
            is then a dead letter naming the limit.
    """

    topic: str
    bootstrap: str | None = None
    ext: str = ".png"
    params: tuple = ()
    chunk_bytes: int = 900_000
    chunking: bool = True
    client: Literal["confluent", "kafka-python"] | None = None
    options: dict = field(default_factory=dict)
    threads: int | None = 1

    def __post_init__(self) -> None:
        from rayflow.connectors.kafka.clients import resolve_client

        resolve_client(self.client, "KafkaImageSink")  # a misspelt client fails here
        check_number("KafkaImageSink", "chunk_bytes", self.chunk_bytes)
        check_image_ext("KafkaImageSink", self.ext)

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        from rayflow.connectors.kafka import KafkaSink

        # the Kafka sink's own state (exactly-once: its pre-committed epochs) and the counts
        if isinstance(resume_state, Rescaled):
            inner_state: Any = Rescaled(tuple(_inner_state(h) for h in resume_state.handles),
                                        resume_state.old_parallelism)
            delivered = None  # (a new job: it counts afresh)
        else:
            inner_state = _inner_state(resume_state)
            delivered = resume_state.delivered if isinstance(resume_state, _ImageSinkState) \
                else None
        inner = KafkaSink(self.topic, bootstrap=self.bootstrap, key=chunk_message_key,
                          max_message_bytes=self.chunk_bytes, client=self.client,
                          options=self.options).build(ctx, inner_state)
        return _KafkaImageWriter(ctx, self, inner, delivered)


@dataclass(frozen=True)
class _ImageSinkState:
    """A :class:`KafkaImageSink` instance's snapshot: its Kafka sink's, and its counts."""

    inner: Any
    delivered: Any


def _inner_state(state: Any) -> Any:
    return state.inner if isinstance(state, _ImageSinkState) else None


class _KafkaImageWriter(_EncodingWriter):
    """Encodes and chunks each image, and hands the messages to a Kafka sink's writer, whose
    delivery protocol it follows: under exactly-once its epochs are pre-committed at the
    barriers and written in a transaction once the checkpoint completes."""

    def __init__(self, ctx, spec: KafkaImageSink, inner: SinkWriter, resume_state: Any = None):
        super().__init__(ctx, spec.ext, spec.params, spec.threads, resume_state)
        self.spec, self.inner = spec, inner
        self.pending: list[Any] = []
        self.commits_beside_writes = inner.commits_beside_writes

    def deliver(self, key, data):
        spec = self.spec
        if spec.chunking:
            self.pending.extend(chunk_image(data, str(key), spec.chunk_bytes))
            return
        kb = _key_bytes(str(key))
        msg = _HEADER.pack(_MAGIC, uuid.uuid4().bytes, 0, 1, len(data), len(kb)) + kb + data
        if len(msg) > spec.chunk_bytes:
            raise ValueError(f"encoded image of {len(msg)} bytes exceeds the Kafka message "
                             f"limit chunk_bytes={spec.chunk_bytes}; enable chunking")
        self.pending.append(msg)

    def write(self, items, event_times, in_time):
        dead = super().write(items, event_times, in_time)
        if self.pending:
            dead = dead + list(self.inner.write(self.pending, None, in_time) or ())
            self.pending = []
        return dead

    def flush(self):
        self.inner.flush()

    def snapshot(self, checkpoint_id):
        # (the Kafka writer's snapshot flushes, or pre-commits the epoch under exactly-once)
        return _ImageSinkState(self.inner.snapshot(checkpoint_id), self.delivered())

    def commit(self, checkpoint_id):
        self.inner.commit(checkpoint_id)

    def uncommitted(self):
        return self.inner.uncommitted()

    @property
    def waited_s(self) -> float:
        """Time writes waited for a commit (the exactly-once writer's backpressure)."""
        return getattr(self.inner, "waited_s", 0.0)

    def close(self):
        self.inner.close()


@dataclass(frozen=True)
class KafkaImageSource(SourceSpec):
    """Encoded images from a Kafka topic as ``(key, bytes)`` records.

    Messages written by :class:`KafkaImageSink` are reassembled from their chunks and keep
    the key they were written with (a file name, say); any other message is taken as one
    whole encoded image, keyed by its position ``topic/partition@offset``. An image whose
    chunks do not all arrive (the topic ends, or more than ``max_pending_bytes`` of partial
    images pile up) becomes a :class:`BadInput` record, so :class:`DecodeImage`
    dead-letters it; the reason names the offset of its first chunk.

    Checkpoints. A checkpoint taken while an image is partly read stores the offset of the
    image's first chunk, not the offset read up to, and the offsets after it that were
    already delivered (as ranges). A restored source reads from there again, rebuilds the
    partial image and skips what it had delivered: each image is emitted once, and the
    checkpoint stays a few numbers per partition instead of holding image bytes.

    Args:
        topic, bootstrap, start, bounded, client, options: as for :class:`rayflow.KafkaSource`.
        max_image_bytes: a chunked image announcing more bytes is rejected.
        max_pending_bytes: bytes of partial images held at most.
    """

    topic: str
    bootstrap: str | None = None
    start: Literal["earliest", "latest", "committed"] = "earliest"
    group_id: str | None = None
    bounded: bool = False
    client: Literal["confluent", "kafka-python"] | None = None
    options: dict = field(default_factory=dict)
    max_image_bytes: int = 256 * MiB
    max_pending_bytes: int = 512 * MiB

    def __post_init__(self) -> None:
        try:  # the options it reads Kafka with are checked as the Kafka source checks them
            self._kafka()
        except ValueError as exc:
            raise ValueError(str(exc).replace("KafkaSource", "KafkaImageSource", 1)) from None
        for name in ("max_image_bytes", "max_pending_bytes"):
            check_number("KafkaImageSource", name, getattr(self, name))

    def _kafka(self) -> Any:
        """The Kafka source it reads through."""
        from rayflow.connectors.kafka import KafkaSource

        return KafkaSource(self.topic, bootstrap=self.bootstrap, start=self.start,
                           group_id=self.group_id, bounded=self.bounded, client=self.client,
                           options=self.options, with_metadata=True)

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        offsets, skip = _split_resume_state(resume_state)
        return _KafkaImageReader(self, self._kafka().build(ctx, offsets), skip)


def _split_resume_state(state: Any) -> tuple[Any, dict[int, list[tuple[int, int]]]]:
    """The inner Kafka reader's offsets and the delivered ranges of a checkpoint of
    :class:`KafkaImageSource` (one instance's, or a :class:`Rescaled` of every old one's)."""
    def one(s: Any) -> tuple[Any, dict]:
        if isinstance(s, dict) and set(s) == {"offsets", "skip"}:
            return s["offsets"], {int(p): [tuple(r) for r in rs] for p, rs in s["skip"].items()}
        return s, {}  # bare offsets

    if isinstance(state, Rescaled):
        parts = [one(h) for h in state.handles]
        skip = {p: rs for _, s in parts for p, rs in s.items()}  # partitions are disjoint
        return Rescaled(tuple(o for o, _ in parts), state.old_parallelism), skip
    return one(state)


class _Partial:
    __slots__ = ("key", "where", "partition", "first", "count", "total", "parts", "offsets",
                 "size", "event_time")

    def __init__(self, key: str, where: str, partition: int, first: int, count: int,
                 total: int):
        self.key, self.where, self.count, self.total = key, where, count, total
        self.partition, self.first = partition, first
        self.parts: dict[int, bytes] = {}
        self.offsets: list[int] = []
        self.size = 0
        self.event_time = 0.0


def _ranges(offsets: Any, ranges: Any = ()) -> list[tuple[int, int]]:
    """Offsets and ``[start, end)`` ranges as sorted, merged ``[start, end)`` runs."""
    out: list[tuple[int, int]] = []
    for a, b in sorted([(o, o + 1) for o in set(offsets)] + [tuple(r) for r in ranges]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class _KafkaImageReader(SourceReader):
    def __init__(self, spec: KafkaImageSource, inner: Any,
                 skip: dict[int, list[tuple[int, int]]] | None = None):
        self.spec, self.inner = spec, inner
        self.partial: OrderedDict[bytes, _Partial] = OrderedDict()
        self.pending_bytes = 0
        self.flushed = False
        # partition -> offsets delivered since its oldest partial image's first chunk
        self.done: dict[int, list[int]] = {}
        # partition -> [start, end) offset ranges delivered before the restored checkpoint
        self.skip = {p: sorted(rs) for p, rs in (skip or {}).items() if rs}

    def _skipped(self, p: int, off: int) -> bool:
        ranges = self.skip.get(p)
        while ranges and ranges[0][1] <= off:
            ranges.pop(0)
        return ranges is not None and bool(ranges) and ranges[0][0] <= off

    def _delivered(self, p: int, offsets: list[int]) -> None:
        if any(part.partition == p for part in self.partial.values()):
            self.done.setdefault(p, []).extend(offsets)
        else:
            self.done.pop(p, None)  # nothing partial: the committed offset covers it all

    def poll(self, max_records, timeout_s):
        got = self.inner.poll(max_records, timeout_s)
        out, times = [], []
        if got is not None:
            messages, stamps = got
            stamps = np.zeros(len(messages)) if stamps is None else stamps
            for m, t in zip(messages, stamps):
                if self._skipped(m.partition, m.offset):
                    self._delivered(m.partition, [m.offset])
                    continue
                for rec in self._take(m.value, m.partition, m.offset, float(t)):
                    out.append(rec[:2])
                    times.append(rec[2])
        if self.inner.exhausted and not self.flushed:
            self.flushed = True  # the topic ended: what is still partial never completes
            parts = list(self.partial.values())
            self.partial.clear()
            self.pending_bytes = 0
            for part in parts:
                out.append((part.key or part.where, BadInput(
                    f"incomplete chunked image {part.key!r} (first chunk at {part.where}): "
                    f"{len(part.parts)} of {part.count} chunks at end of topic")))
                times.append(part.event_time)
                self._delivered(part.partition, part.offsets)
        return (out, np.asarray(times, dtype=np.float64)) if out else None

    def _take(self, v: bytes, p: int, off: int, t: float) -> list[tuple]:
        where = f"{self.spec.topic}/{p}@{off}"
        if v is None or len(v) < _HEADER.size or v[:4] != _MAGIC:
            self._delivered(p, [off])
            return [(where, v if v is not None else b"", t)]
        _, image_id, idx, count, total, klen = _HEADER.unpack_from(v)
        key = v[_HEADER.size : _HEADER.size + klen].decode(errors="replace")
        data = v[_HEADER.size + klen :]
        if total > self.spec.max_image_bytes:
            self._delivered(p, [off])
            return [(key or where, BadInput(
                f"oversize image {key!r} (at {where}): {total} bytes > "
                f"max_image_bytes={self.spec.max_image_bytes}"), t)] if idx == 0 else []
        if count == 1:
            self._delivered(p, [off])
            return [(key or where, data, t)]
        part = self.partial.get(image_id)
        if part is None:
            part = self.partial[image_id] = _Partial(key, where, p, off, count, total)
        if idx in part.parts or idx >= count:
            self._delivered(p, [off])  # a repeated or impossible chunk: nothing to rebuild
            return []
        part.parts[idx] = data
        part.offsets.append(off)
        part.size += len(data)
        part.event_time = max(part.event_time, t)
        self.pending_bytes += len(data)
        out: list[tuple] = []
        finished: list[_Partial] = []
        if len(part.parts) == count:
            del self.partial[image_id]
            self.pending_bytes -= part.size
            blob = b"".join(part.parts[i] for i in range(count))
            if len(blob) != total:
                out.append((key or part.where, BadInput(
                    f"chunked image {key!r} (first chunk at {part.where}): {len(blob)} "
                    f"bytes, header says {total}"), t))
            else:
                out.append((key or part.where, blob, t))
            finished.append(part)
        while self.pending_bytes > self.spec.max_pending_bytes and self.partial:
            _, old = self.partial.popitem(last=False)
            self.pending_bytes -= old.size
            out.append((old.key or old.where, BadInput(
                f"incomplete chunked image {old.key!r} (first chunk at {old.where}) "
                f"evicted: over max_pending_bytes"), t))
            finished.append(old)
        for f in finished:
            self._delivered(f.partition, f.offsets)
        return out

    @property
    def exhausted(self) -> bool:
        return self.inner.exhausted and self.flushed

    def snapshot(self) -> dict:
        """Offsets to read from (a partial image's first chunk, where one is partly read)
        and the ranges after them already delivered."""
        nxt = self.inner.snapshot()
        low: dict[int, int] = {}
        for part in self.partial.values():
            low[part.partition] = min(low.get(part.partition, part.first), part.first)
        offsets = {p: min(o, low.get(int(p), o)) for p, o in nxt.items()}
        skip: dict[int, list[tuple[int, int]]] = {}
        for p, start in offsets.items():
            p = int(p)
            runs = _ranges([o for o in self.done.get(p, ()) if o >= start],
                           [(max(a, start), b) for a, b in self.skip.get(p, ()) if b > start])
            if runs:
                skip[p] = runs
        for p in list(self.done):
            if p not in low:
                del self.done[p]
            else:
                self.done[p] = [o for o in self.done[p] if o >= low[p]]
        return {"offsets": offsets, "skip": skip}

    def close(self) -> None:
        self.inner.close()
