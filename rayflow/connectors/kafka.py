"""Kafka source and sink, with kafka-python (default) or confluent-kafka (the fast option).

Partitions are assigned explicitly (no consumer-group rebalancing): instance ``i`` of ``n``
reads partitions ``p`` with ``p % n == i``, as Flink does, so the assignment is
deterministic and checkpointed offsets map back to the same instance.

    src = KafkaSource("words", bootstrap="127.0.0.1:9092", start="earliest", bounded=True)
    sink = KafkaSink("counts", bootstrap="127.0.0.1:9092")

Security settings (``security_protocol``, ``sasl_mechanism``, ``ssl_cafile``, ...) go in
``options`` and are passed to the client unchanged (kafka-python names; for confluent-kafka
use librdkafka names such as ``security.protocol``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np

from rayflow.batches import brief
from rayflow.connectors.base import SinkSpec, SinkWriter, SourceReader, SourceSpec
from rayflow.operators.base import DeadLetter, Rescaled, StepContext

Start = Literal["earliest", "latest", "committed"]
Client = Literal["kafka-python", "confluent"]


def default_bootstrap() -> str:
    """The bootstrap address from the configuration (``RAYFLOW_KAFKA__BOOTSTRAP``)."""
    from rayflow.config import load_config

    bootstrap = load_config().kafka.bootstrap
    if not bootstrap:
        raise ValueError(
            "no Kafka bootstrap address: pass bootstrap=..., set RAYFLOW_KAFKA__BOOTSTRAP, "
            "or start the embedded broker (`rayflow kafka up`)"
        )
    return bootstrap


class KafkaMessage(NamedTuple):
    """A record with its position (``KafkaSource(with_metadata=True)``)."""

    partition: int
    offset: int
    value: Any


@dataclass(frozen=True)
class KafkaSource(SourceSpec):
    """Read a topic.

    Args:
        topic: the topic to read.
        bootstrap: ``host:port[,host:port]``; defaults to the configured one.
        start: ``earliest``, ``latest``, or ``committed`` (the group's committed offsets,
            falling back to earliest).
        group_id: consumer group for committed offsets; required for ``committed``.
        bounded: stop at the end offsets seen at start-up (read a pre-filled topic and end
            the job), instead of running until stopped.
        deserializer: bytes -> record; the raw ``bytes`` value when None.
        client: ``kafka-python`` or ``confluent``.
        options: extra client options (security settings and tuning), passed through.
        commit_interval_s: how often a group's offsets are committed.
        with_metadata: records are :class:`KafkaMessage` (partition, offset, value) instead
            of bare values, e.g. to name a bad record's position in a dead letter.
    """

    topic: str
    bootstrap: str | None = None
    start: Start = "earliest"
    group_id: str | None = None
    bounded: bool = False
    deserializer: Callable[[bytes], Any] | None = None
    client: Client = "kafka-python"
    options: dict = field(default_factory=dict)
    commit_interval_s: float = 5.0
    with_metadata: bool = False

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        bootstrap = self.bootstrap or default_bootstrap()
        if self.start == "committed" and not self.group_id:
            raise ValueError(f"KafkaSource({self.topic!r}): start='committed' needs a group_id")
        consumer = (_ConfluentConsumer if self.client == "confluent" else _KPConsumer)(
            bootstrap, self.group_id, self.options
        )
        return _KafkaReader(self, ctx, consumer, resume_state)


class _KafkaReader(SourceReader):
    def __init__(self, spec: KafkaSource, ctx: StepContext, consumer, resume_state):
        self.spec, self.c = spec, consumer
        parts = consumer.partitions(spec.topic)
        if not parts:
            raise ValueError(f"Kafka topic {spec.topic!r} does not exist or has no partitions")
        self.partitions = [p for p in sorted(parts) if p % ctx.parallelism == ctx.instance]
        if isinstance(resume_state, Rescaled):  # offsets of every old instance: keep ours
            merged = {int(p): o for h in resume_state.handles if h for p, o in h.items()}
            resume_state = {p: o for p, o in merged.items() if p in self.partitions}
        self.next: dict[int, int] = {}
        if self.partitions:
            begin, end = consumer.watermarks(spec.topic, self.partitions)
            if spec.bounded or spec.start == "latest":
                end = self._true_end(begin, end)
            if resume_state:
                start = {int(p): int(o) for p, o in resume_state.items()}
            elif spec.start == "latest":
                start = end
            elif spec.start == "committed":
                committed = consumer.committed(spec.topic, self.partitions)
                start = {p: committed.get(p) if committed.get(p) is not None else begin[p]
                         for p in self.partitions}
            else:
                start = begin
            self.next = {p: start.get(p, begin[p]) for p in self.partitions}
            self.c.assign(spec.topic, self.next)
            self.end = end if spec.bounded else None
        else:
            self.end = {}
        self.last_commit = time.monotonic()

    def _true_end(self, begin: dict[int, int], end: dict[int, int]) -> dict[int, int]:
        """End offsets, confirmed by reading the last record batch of each partition.

        Some brokers (Tansu 0.x, the embedded default) answer ListOffsets(latest) with the
        last *batch's* base offset + 1 instead of the last record's offset + 1. Reading from
        that offset returns the rest of the batch, whose last offset is the true end.
        """
        probe = {p: end[p] - 1 for p in self.partitions if end[p] > begin[p]}
        if not probe:
            return end
        self.c.assign(self.spec.topic, probe)
        true_end = dict(end)
        idle_polls, deadline = 0, time.monotonic() + 30
        while idle_polls < 2 and time.monotonic() < deadline:
            values, _, last = self.c.poll(1_000_000, 0.2)
            for p, off in last.items():
                true_end[p] = max(true_end[p], off + 1)
            seen_all = all(true_end[p] > probe[p] for p in probe)
            idle_polls = idle_polls + 1 if (not values and seen_all) else 0
        return true_end

    def poll(self, max_records, timeout_s):
        if self.exhausted:
            return None
        if not self.partitions:
            time.sleep(timeout_s)
            return None
        values, stamps, last = self.c.poll(max_records, timeout_s)
        for p, off in last.items():
            self.next[p] = off + 1
        if self.spec.group_id and time.monotonic() - self.last_commit > self.spec.commit_interval_s:
            self.commit()
        if not values:
            return None
        positions = self.c.positions() if self.spec.with_metadata else None
        if self.end is not None and any(off >= self.end[p] for p, off in last.items()):
            # a bounded read stops at the end offsets seen at start-up: later records are not
            # ours
            positions = positions or self.c.positions()
            keep = [i for i, (p, off) in enumerate(positions) if off < self.end[p]]
            values = [values[i] for i in keep]
            stamps = [stamps[i] for i in keep]
            positions = [positions[i] for i in keep]
            for p in last:
                self.next[p] = min(self.next[p], self.end[p])
        des = self.spec.deserializer
        items = values if des is None else [des(v) for v in values]
        if self.spec.with_metadata:
            items = [KafkaMessage(p, o, v) for (p, o), v in zip(positions, items)]
        return items, np.asarray(stamps, dtype=np.float64) / 1000.0

    @property
    def exhausted(self) -> bool:
        return self.end is not None and all(self.next[p] >= self.end[p] for p in self.partitions)

    def snapshot(self) -> dict[int, int]:
        return dict(self.next)

    def commit(self) -> None:
        if self.spec.group_id and self.partitions:
            self.c.commit(self.spec.topic, self.next)
        self.last_commit = time.monotonic()

    def close(self) -> None:
        if self.spec.group_id:
            try:
                self.commit()
            except Exception:  # noqa: BLE001 - closing must not mask the job's outcome
                pass
        self.c.close()


# -- client adapters: the only code that knows each client's API -----------------------------

class _KPConsumer:
    def __init__(self, bootstrap: str, group_id: str | None, options: dict):
        from kafka import KafkaConsumer

        opts = dict(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_bytes=64 * 2**20,
            max_partition_fetch_bytes=16 * 2**20,
            fetch_min_bytes=1,
            fetch_max_wait_ms=5,
            max_poll_records=100_000,
        )
        opts.update(options)
        self.consumer = KafkaConsumer(**opts)
        self._got: dict = {}

    def partitions(self, topic):
        return self.consumer.partitions_for_topic(topic) or set()

    def watermarks(self, topic, parts):
        from kafka import TopicPartition

        tps = [TopicPartition(topic, p) for p in parts]
        begin = self.consumer.beginning_offsets(tps)
        end = self.consumer.end_offsets(tps)
        return {tp.partition: o for tp, o in begin.items()}, {tp.partition: o for tp, o in end.items()}

    def committed(self, topic, parts):
        from kafka import TopicPartition

        return {p: self.consumer.committed(TopicPartition(topic, p)) for p in parts}

    def assign(self, topic, offsets):
        from kafka import TopicPartition

        tps = {p: TopicPartition(topic, p) for p in offsets}
        self.consumer.assign(list(tps.values()))
        for p, off in offsets.items():
            self.consumer.seek(tps[p], off)

    def poll(self, max_records, timeout_s):
        got = self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        values: list = []
        stamps: list = []
        last: dict[int, int] = {}
        for tp, recs in got.items():
            values.extend([r.value for r in recs])
            stamps.extend([r.timestamp for r in recs])
            last[tp.partition] = recs[-1].offset
        self._got = got
        return values, stamps, last

    def positions(self) -> list[tuple[int, int]]:
        """(partition, offset) of each record of the last poll, in order (built on demand:
        most polls never need them)."""
        return [(tp.partition, r.offset) for tp, recs in self._got.items() for r in recs]

    def commit(self, topic, offsets):
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        self.consumer.commit(
            {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        )

    def close(self):
        self.consumer.close()


class _ConfluentConsumer:
    def __init__(self, bootstrap: str, group_id: str | None, options: dict):
        from confluent_kafka import Consumer

        conf = {
            "bootstrap.servers": bootstrap,
            "group.id": group_id or "rayflow-unmanaged",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 5,
        }
        conf.update(options)
        self.consumer = Consumer(conf)
        self._msgs: list = []

    def partitions(self, topic):
        md = self.consumer.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        return set(t.partitions) if t is not None and t.error is None else set()

    def watermarks(self, topic, parts):
        from confluent_kafka import TopicPartition

        begin, end = {}, {}
        for p in parts:
            lo, hi = self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            begin[p], end[p] = lo, hi
        return begin, end

    def committed(self, topic, parts):
        from confluent_kafka import TopicPartition

        got = self.consumer.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in got}

    def assign(self, topic, offsets):
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])

    def poll(self, max_records, timeout_s):
        msgs = self.consumer.consume(num_messages=max_records, timeout=timeout_s)
        values, stamps, last = [], [], {}
        for m in msgs:
            if m.error():
                raise RuntimeError(f"Kafka consume error: {m.error()}")
            values.append(m.value())
            stamps.append(m.timestamp()[1])
            last[m.partition()] = m.offset()
        self._msgs = msgs
        return values, stamps, last

    def positions(self) -> list[tuple[int, int]]:
        return [(m.partition(), m.offset()) for m in self._msgs]

    def commit(self, topic, offsets):
        from confluent_kafka import TopicPartition

        self.consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )

    def close(self):
        self.consumer.close()


# -- sink ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KafkaSink(SinkSpec):
    """Write records to a topic.

    Args:
        topic: the topic to write.
        bootstrap: ``host:port[,host:port]``; defaults to the configured one.
        serializer: record -> bytes; records must already be bytes or str when None.
        key: record -> key bytes (None: no key, the client spreads records).
        stamp: ``fn(record, in_time, out_time) -> record``, applied just before writing; the
            study's jobs append inTime and outTime to each record this way.
        max_message_bytes: larger records go to the dead-letter output instead of failing
            the producer (Kafka's default limit is 1 MB).
        client: ``kafka-python`` or ``confluent``.
        options: extra producer options (security, linger, compression), passed through.
    """

    topic: str
    bootstrap: str | None = None
    serializer: Callable[[Any], bytes] | None = None
    key: Callable[[Any], bytes] | None = None
    stamp: Callable[[Any, float, float], Any] | None = None
    max_message_bytes: int = 1_000_000
    client: Client = "kafka-python"
    options: dict = field(default_factory=dict)

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        bootstrap = self.bootstrap or default_bootstrap()
        cls = _ConfluentProducer if self.client == "confluent" else _KPProducer
        if ctx.guarantee == "exactly_once":
            txn_id = f"rayflow-{ctx.job_name}-{ctx.step_id}-{ctx.instance}"
            return _TransactionalWriter(self, ctx, cls(bootstrap, self.options, txn_id),
                                        bootstrap, resume_state)
        return _KafkaWriter(self, ctx, cls(bootstrap, self.options))


def _to_bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    raise TypeError(f"KafkaSink needs bytes or str records (or a serializer), got {type(v).__name__}")


class _KafkaWriter(SinkWriter):
    def __init__(self, spec: KafkaSink, ctx: StepContext, producer):
        self.spec, self.ctx, self.p = spec, ctx, producer

    def write(self, items, event_times, in_time):
        values, keys, dead = self._encode(items, in_time)
        self.p.send_many(self.spec.topic, values, keys)
        return dead

    def _encode(self, items, in_time):
        spec = self.spec
        records = items if isinstance(items, list) else list(items)
        if spec.stamp is not None:
            out_time = time.time()
            records = [spec.stamp(r, in_time, out_time) for r in records]
        ser = spec.serializer or _to_bytes
        values = [ser(r) for r in records]
        keys = [spec.key(r) for r in records] if spec.key else None
        limit = spec.max_message_bytes
        dead = []
        if max(map(len, values), default=0) > limit:
            ok = [i for i, v in enumerate(values) if len(v) <= limit]
            dead = [
                DeadLetter(self.ctx.step_id, self.ctx.instance,
                           f"oversize record: {len(v)} bytes > max_message_bytes={limit}",
                           brief(records[i]), f"topic {spec.topic}")
                for i, v in enumerate(values) if len(v) > limit
            ]
            values = [values[i] for i in ok]
            keys = [keys[i] for i in ok] if keys else None
        return values, keys, dead

    def flush(self):
        self.p.flush()

    def close(self):
        self.p.close()


COMMITS_TOPIC = "__rayflow_commits"


class _TransactionalWriter(_KafkaWriter):
    """Exactly-once sink: two-phase commit tied to checkpoints.

    Records of each checkpoint epoch are held back; at the barrier (pre-commit) they become
    part of the checkpoint; when the checkpoint completes they are written in one Kafka
    transaction together with a marker ``(sink instance -> checkpoint id)`` in
    ``__rayflow_commits``. After a restore, epochs whose marker is committed are skipped and
    the others are committed then, so every epoch is committed exactly once. Holding records
    until commit (instead of writing into an open transaction and aborting on failure) keeps
    the guarantee on brokers whose ``read_committed`` does not hide aborted data (Tansu).
    """

    def __init__(self, spec, ctx, producer, bootstrap: str, resume_state: Any):
        super().__init__(spec, ctx, producer)
        if isinstance(resume_state, Rescaled):
            # a rescale resumes from a savepoint: the old instances committed everything at
            # their end of stream, so there is nothing of theirs to commit
            resume_state = None
        # The marker key names this sink instance *and the run*: a restored instance keeps the
        # run of its checkpoint (its epochs continue), a fresh job starts a new sequence, so
        # markers of an earlier job with the same name can never hide new epochs.
        self.run = resume_state["run"] if resume_state else ctx.run_id
        self.marker = f"{ctx.job_name}/{self.run}/{ctx.step_id}/{ctx.instance}".encode()
        self.buffer: list[tuple[list, list | None]] = []
        self.pending: dict[int, list] = {}
        self.last_id = 0  # newest epoch id: a final epoch at end of stream gets the next one
        create_topic(bootstrap, COMMITS_TOPIC, 1)
        self.p.init_transactions()
        if resume_state:
            done = _last_commit(bootstrap, self.marker)
            pending = resume_state["pending"]
            self.last_id = max([done, *pending])
            self.pending = {cid: parts for cid, parts in pending.items() if cid > done}
            if self.pending:  # epochs of the restored (completed) checkpoint not yet committed
                self.commit(max(self.pending))

    def write(self, items, event_times, in_time):
        values, keys, dead = self._encode(items, in_time)
        if values:
            self.buffer.append((values, keys))
        return dead

    def snapshot(self, checkpoint_id):
        self.last_id = max(self.last_id, checkpoint_id)
        self.pending[checkpoint_id] = self.buffer
        self.buffer = []
        return {"run": self.run, "pending": dict(self.pending)}

    def commit(self, checkpoint_id):
        ready = sorted(cid for cid in self.pending if cid <= checkpoint_id)
        if not ready:
            return
        self.p.begin()
        for cid in ready:
            for values, keys in self.pending[cid]:
                self.p.send_many(self.spec.topic, values, keys)
        # the data reach the broker before the marker does: if this process dies mid-commit
        # on a broker that shows aborted transactions (Tansu), a visible marker never stands
        # for data that were not written
        self.p.flush()
        self.p.send_many(COMMITS_TOPIC, [str(ready[-1]).encode()], [self.marker])
        self.p.commit()
        for cid in ready:
            del self.pending[cid]

    def flush(self):
        # end of stream: what came after the last checkpoint is committed as a final epoch
        if self.buffer:
            self.last_id += 1
            self.pending[self.last_id] = self.buffer
            self.buffer = []
        if self.pending:
            self.commit(max(self.pending))


def _last_commit(bootstrap: str, marker: bytes) -> int:
    """The last checkpoint id committed by the sink instance ``marker`` (0 if none)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      isolation_level="read_committed", auto_offset_reset="earliest")
    tp = TopicPartition(COMMITS_TOPIC, 0)
    c.assign([tp])
    # read at least up to the (reported) end before trusting an empty poll: the first polls
    # of a new consumer often return nothing while it fetches metadata
    end = c.end_offsets([tp])[tp]
    last, idle, deadline = 0, 0, time.monotonic() + 30
    while time.monotonic() < deadline and (c.position(tp) < end or idle < 2):
        got = c.poll(300)
        idle = 0 if got else idle + 1
        for recs in got.values():
            for r in recs:
                if r.key == marker:
                    last = max(last, int(r.value))
    c.close()
    return last


class _KPProducer:
    def __init__(self, bootstrap: str, options: dict, transactional_id: str | None = None):
        from kafka import KafkaProducer

        opts = dict(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 20,
                    max_request_size=8 << 20, acks=1)
        if transactional_id:
            opts.update(transactional_id=transactional_id, acks="all")
        opts.update(options)
        self.producer = KafkaProducer(**opts)

    def init_transactions(self):
        self.producer.init_transactions()

    def begin(self):
        self.producer.begin_transaction()

    def commit(self):
        self.producer.commit_transaction()

    def send_many(self, topic, values, keys):
        send = self.producer.send
        if keys is None:
            for v in values:
                send(topic, v)
        else:
            for v, k in zip(values, keys):
                send(topic, v, key=k)

    def flush(self):
        self.producer.flush()

    def close(self):
        self.producer.close()


class _ConfluentProducer:
    def __init__(self, bootstrap: str, options: dict, transactional_id: str | None = None):
        from confluent_kafka import Producer

        conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1}
        if transactional_id:
            conf.update({"transactional.id": transactional_id, "acks": "all"})
        conf.update(options)
        self.producer = Producer(conf)

    def init_transactions(self):
        self.producer.init_transactions(30)

    def begin(self):
        self.producer.begin_transaction()

    def commit(self):
        self.producer.commit_transaction(30)

    def send_many(self, topic, values, keys):
        produce, poll = self.producer.produce, self.producer.poll
        for i, v in enumerate(values):
            while True:
                try:
                    produce(topic, v, keys[i] if keys else None)
                    break
                except BufferError:  # local queue full: let delivery reports drain
                    poll(0.05)
        poll(0)

    def flush(self):
        self.producer.flush()

    def close(self):
        self.producer.flush()


# -- admin helpers for jobs, tests and benchmarks --------------------------------------------

def create_topic(bootstrap: str, name: str, partitions: int = 1, exist_ok: bool = True,
                 options: dict | None = None) -> None:
    """Create ``name`` with ``partitions`` partitions (replication 1)."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **(options or {}))
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    except TopicAlreadyExistsError:
        if not exist_ok:
            raise
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, values, partitions: int = 1,
            client: Client = "kafka-python", options: dict | None = None) -> int:
    """Write ``values`` (bytes) round-robin over ``partitions``; return how many."""
    n = 0
    if client == "confluent":
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **(options or {})})
        for v in values:
            while True:
                try:
                    p.produce(topic, v, partition=n % partitions)
                    break
                except BufferError:
                    p.poll(0.05)
            n += 1
        p.flush()
        return n
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20,
                      **(options or {}))
    for v in values:
        p.send(topic, v, partition=n % partitions)
        n += 1
    p.flush()
    p.close()
    return n


def read_values(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    """Every value in ``topic`` now, partition by partition (for checks and demos, not for
    big topics). ``read_committed`` sees only committed transactions."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      isolation_level=isolation, auto_offset_reset="earliest")
    parts = sorted(c.partitions_for_topic(topic) or ())
    c.assign([TopicPartition(topic, p) for p in parts])
    out: list[bytes] = []
    idle = 0
    while idle < 3:
        got = c.poll(300)
        idle = 0 if got else idle + 1
        for recs in got.values():
            out.extend(r.value for r in recs)
    c.close()
    return out


def count_records(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> int:
    """Records in ``topic`` now (read to the end; for checks, not for big topics)."""
    return len(read_values(bootstrap, topic, isolation))
