"""Kafka source and sink, with kafka-python (default) or confluent-kafka (the fast option).

Partitions are assigned explicitly (no consumer-group rebalancing): the partitions of all
the source's topics, in (topic, partition) order, are dealt round-robin over the instances,
so the assignment is deterministic and checkpointed offsets map back to the same instance.

    src = KafkaSource("words", bootstrap="127.0.0.1:9092", start="earliest", bounded=True)
    sink = KafkaSink("counts", bootstrap="127.0.0.1:9092")

Security settings (``security_protocol``, ``sasl_mechanism``, ``ssl_cafile``, ...) go in
``options`` and are passed to the client unchanged (kafka-python names; for confluent-kafka
use librdkafka names such as ``security.protocol``).
"""

from __future__ import annotations

import hashlib
import re
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
    """The bootstrap address from the job's configuration (``kafka.bootstrap``)."""
    from rayflow.config import current

    bootstrap = current().kafka.bootstrap
    if not bootstrap:
        raise ValueError(
            "no Kafka bootstrap address: pass bootstrap=..., set RAYFLOW_KAFKA__BOOTSTRAP, "
            "or start the embedded broker (`rayflow kafka up`)"
        )
    return bootstrap


def _client_options(client: str, options: dict) -> dict:
    """A connector's client options: the job's ``kafka.options`` (kafka-python) or
    ``kafka.confluent_options`` (confluent), under the connector's own."""
    from rayflow.config import current

    return current().kafka.client_options(client, options)


class KafkaMessage(NamedTuple):
    """A record with its position (``KafkaSource(with_metadata=True)``)."""

    partition: int
    offset: int
    value: Any
    topic: str = ""


@dataclass(frozen=True)
class KafkaSource(SourceSpec):
    """Read one topic, several topics, or every topic whose name matches a pattern.

    The partitions of all the topics, in (topic, partition) order, are dealt over the
    instances: instance ``i`` of ``n`` reads the ``j``-th partition when ``j % n == i``.

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
        with_metadata: records are :class:`KafkaMessage` (partition, offset, value, topic)
            instead of bare values, e.g. to name a bad record's position in a dead letter.
        topics: several topics to read, instead of ``topic``.
        pattern: a regular expression; every topic whose whole name matches it when the
            job starts is read (topics made later are not), instead of ``topic``.
    """

    topic: str | None = None
    bootstrap: str | None = None
    start: Start = "earliest"
    group_id: str | None = None
    bounded: bool = False
    deserializer: Callable[[bytes], Any] | None = None
    client: Client = "kafka-python"
    options: dict = field(default_factory=dict)
    commit_interval_s: float = 5.0
    with_metadata: bool = False
    topics: tuple[str, ...] | None = None
    pattern: str | None = None

    def __post_init__(self):
        given = [n for n in ("topic", "topics", "pattern") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"KafkaSource: give exactly one of topic=, topics= or pattern= "
                             f"(got {given or 'none'})")
        if self.topic is not None and not (isinstance(self.topic, str) and self.topic):
            raise ValueError(f"KafkaSource: topic must be a non-empty str, got {self.topic!r}")
        if self.topics is not None:
            if isinstance(self.topics, str) or not all(
                    isinstance(t, str) and t for t in self.topics) or not self.topics:
                raise ValueError(f"KafkaSource: topics must be a non-empty list of topic "
                                 f"names, got {self.topics!r}")
            if len(set(self.topics)) != len(self.topics):
                raise ValueError(f"KafkaSource: topics {list(self.topics)} name a topic twice")
            object.__setattr__(self, "topics", tuple(self.topics))
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"KafkaSource: pattern {self.pattern!r} is not a regular "
                                 f"expression: {exc}") from None

    @property
    def name(self) -> str:
        """What the source reads, for messages."""
        if self.topic is not None:
            return repr(self.topic)
        return repr(list(self.topics)) if self.topics else f"pattern {self.pattern!r}"

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        bootstrap = self.bootstrap or default_bootstrap()
        if self.start == "committed" and not self.group_id:
            raise ValueError(f"KafkaSource({self.name}): start='committed' needs a group_id")
        consumer = (_ConfluentConsumer if self.client == "confluent" else _KPConsumer)(
            bootstrap, self.group_id, _client_options(self.client, self.options)
        )
        return _KafkaReader(self, ctx, consumer, resume_state)


def _topic_names(spec: KafkaSource, consumer) -> list[str]:
    if spec.topic is not None:
        return [spec.topic]
    if spec.topics is not None:
        return list(spec.topics)
    rx = re.compile(spec.pattern)
    names = sorted(t for t in consumer.topics() if rx.fullmatch(t) and not t.startswith("__"))
    if not names:
        raise ValueError(f"KafkaSource: no topic matches the pattern {spec.pattern!r}")
    return names


class _KafkaReader(SourceReader):
    """Reads its share of the partitions of every topic; positions are keyed by
    ``(topic, partition)`` (by partition alone for a single ``topic``, as before)."""

    def __init__(self, spec: KafkaSource, ctx: StepContext, consumer, resume_state):
        self.spec, self.c = spec, consumer
        self.topic_list = _topic_names(spec, consumer)
        every: list[tuple[str, int]] = []
        for t in self.topic_list:
            parts = consumer.partitions(t)
            if not parts:
                raise ValueError(f"Kafka topic {t!r} does not exist or has no partitions")
            every.extend((t, p) for p in sorted(parts))
        self.partitions = [tp for j, tp in enumerate(every)
                           if j % ctx.parallelism == ctx.instance]
        if isinstance(resume_state, Rescaled):  # offsets of every old instance: keep ours
            merged = {self._tp(k): o for h in resume_state.handles if h for k, o in h.items()}
            resume_state = {tp: o for tp, o in merged.items() if tp in self.partitions}
        self.next: dict[tuple[str, int], int] = {}
        self._keep: list[int] | None = None
        if self.partitions:
            begin, end = {}, {}
            for t in self.topic_list:
                mine = [p for tt, p in self.partitions if tt == t]
                if mine:
                    b, e = consumer.watermarks(t, mine)
                    begin.update({(t, p): o for p, o in b.items()})
                    end.update({(t, p): o for p, o in e.items()})
            if spec.bounded or spec.start == "latest":
                end = self._true_end(begin, end)
            if resume_state:
                start = {self._tp(k): int(o) for k, o in resume_state.items()}
            elif spec.start == "latest":
                start = end
            elif spec.start == "committed":
                start = {}
                for t in self.topic_list:
                    mine = [p for tt, p in self.partitions if tt == t]
                    if mine:
                        got = consumer.committed(t, mine)
                        start.update({(t, p): o for p, o in got.items() if o is not None})
            else:
                start = begin
            self.next = {tp: start.get(tp, begin[tp]) for tp in self.partitions}
            self.c.assign_tps(self.next)
            self.end = end if spec.bounded else None
        else:
            self.end = {}
        self.last_commit = time.monotonic()

    def _tp(self, key: Any) -> tuple[str, int]:
        """A position key as (topic, partition): checkpoints of a single-topic source key
        by partition alone."""
        if isinstance(key, tuple):
            return (str(key[0]), int(key[1]))
        if len(self.topic_list) != 1:
            raise ValueError(f"KafkaSource({self.spec.name}): the checkpoint keys offsets by "
                             f"partition only; it was taken from a single-topic source")
        return (self.topic_list[0], int(key))

    def _true_end(self, begin: dict, end: dict) -> dict:
        """End offsets, confirmed by reading the last record batch of each partition.

        Some brokers (Tansu 0.x, the embedded default) answer ListOffsets(latest) with the
        last *batch's* base offset + 1 instead of the last record's offset + 1. Reading from
        that offset returns the rest of the batch, whose last offset is the true end.
        """
        probe = {tp: end[tp] - 1 for tp in self.partitions if end[tp] > begin[tp]}
        if not probe:
            return end
        self.c.assign_tps(probe)
        true_end = dict(end)
        idle_polls, deadline = 0, time.monotonic() + 30
        while idle_polls < 2 and time.monotonic() < deadline:
            values, _, last = self.c.poll_tps(1_000_000, 0.2)
            for tp, off in last.items():
                true_end[tp] = max(true_end[tp], off + 1)
            seen_all = all(true_end[tp] > probe[tp] for tp in probe)
            idle_polls = idle_polls + 1 if (not values and seen_all) else 0
        return true_end

    def poll(self, max_records, timeout_s):
        if self.exhausted:
            return None
        if not self.partitions:
            time.sleep(timeout_s)
            return None
        values, stamps, last = self.c.poll_tps(max_records, timeout_s)
        for tp, off in last.items():
            self.next[tp] = off + 1
        if self.spec.group_id and time.monotonic() - self.last_commit > self.spec.commit_interval_s:
            self.commit()
        self._keep = None
        if not values:
            return None
        positions = self.c.positions_tps() if self.spec.with_metadata else None
        if self.end is not None and any(off >= self.end[tp] for tp, off in last.items()):
            # a bounded read stops at the end offsets seen at start-up: later records are not
            # ours
            positions = positions or self.c.positions_tps()
            keep = [i for i, (t, p, off) in enumerate(positions) if off < self.end[(t, p)]]
            values = [values[i] for i in keep]
            stamps = [stamps[i] for i in keep]
            positions = [positions[i] for i in keep]
            self._keep = keep
            for tp in last:
                self.next[tp] = min(self.next[tp], self.end[tp])
        des = self.spec.deserializer
        items = values if des is None else [des(v) for v in values]
        if self.spec.with_metadata:
            items = [KafkaMessage(p, o, v, t) for (t, p, o), v in zip(positions, items)]
        return items, np.asarray(stamps, dtype=np.float64) / 1000.0

    def splits(self) -> list[str]:
        """The partitions this reader still reads (a bounded one that reached its end is
        done), as ``"topic:partition"`` names: event time is tracked per partition."""
        return [f"{t}:{p}" for t, p in self.partitions
                if self.end is None or self.next[(t, p)] < self.end[(t, p)]]

    def record_splits(self) -> np.ndarray:
        """The ``"topic:partition"`` of each record of the last poll."""
        names, counts = [], []
        for (t, p), n in self.c.runs_tps():
            names.append(f"{t}:{p}")
            counts.append(n)
        out = np.repeat(np.array(names, dtype=object), counts)
        return out if self._keep is None else out[self._keep]

    @property
    def exhausted(self) -> bool:
        return self.end is not None and all(self.next[tp] >= self.end[tp]
                                            for tp in self.partitions)

    def snapshot(self) -> dict:
        if self.spec.topic is not None:
            return {p: o for (_, p), o in self.next.items()}
        return dict(self.next)

    def commit(self) -> None:
        if self.spec.group_id and self.partitions:
            for t in self.topic_list:
                offsets = {p: o for (tt, p), o in self.next.items() if tt == t}
                if offsets:
                    self.c.commit(t, offsets)
        self.last_commit = time.monotonic()

    def close(self) -> None:
        if self.spec.group_id:
            try:
                self.commit()
            except Exception:  # noqa: BLE001 - closing must not mask the job's outcome
                pass
        self.c.close()


# -- client adapters: the only code that knows each client's API -----------------------------

class _ReadBack:
    """Reading a topic back (an exactly-once sink's restore), over a consumer adapter's
    ``partitions``, ``watermarks``, ``assign_tps`` and its ``_headers``/``_position``."""

    def end_offsets(self, topic) -> dict[int, int]:
        parts = self.partitions(topic)
        if not parts:
            raise ValueError(f"Kafka topic {topic!r} does not exist or has no partitions")
        return self.watermarks(topic, sorted(parts))[1]

    def scan_headers(self, topic, start: dict[int, int], key: str,
                     timeout_s: float = 60.0) -> list[bytes]:
        """Values of header ``key`` of every record from ``start`` to the end (as this
        consumer's isolation level shows them)."""
        if not start:
            return []
        target = _high_watermarks(self, topic, start)
        self.assign_tps({(topic, p): off for p, off in start.items()})
        out: list[bytes] = []
        idle, deadline = 0, time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self._headers(key)
            idle = 0 if got is not None else idle + 1
            out.extend(got or ())
            at_end = all(o >= target[p] for p, o in self._position(topic, start).items())
            if idle >= 2 and (at_end or idle >= 20):
                return out
        raise TimeoutError(f"reading topic {topic!r} back took over {timeout_s:.0f} s")


class _KPConsumer(_ReadBack):
    def __init__(self, bootstrap: str, group_id: str | None, options: dict):
        from kafka import KafkaConsumer

        self.bootstrap, self.options = bootstrap, dict(options)  # what it was built with
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

    def _headers(self, key: str) -> list[bytes] | None:
        """One poll: the values of header ``key`` (None when the poll returned nothing)."""
        got = self.consumer.poll(timeout_ms=300, max_records=100_000)
        if not got:
            return None
        return [v for recs in got.values() for r in recs for k, v in (r.headers or ()) if k == key]

    def _position(self, topic, parts) -> dict[int, int]:
        from kafka import TopicPartition

        return {p: self.consumer.position(TopicPartition(topic, p)) for p in parts}

    def commit(self, topic, offsets):
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        self.consumer.commit(
            {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        )

    # -- the source: partitions of several topics, as (topic, partition) pairs -----------
    def topics(self) -> set[str]:
        return set(self.consumer.topics())

    def assign_tps(self, offsets: dict) -> None:
        from kafka import TopicPartition

        tps = {tp: TopicPartition(*tp) for tp in offsets}
        self.consumer.assign(list(tps.values()))
        for tp, off in offsets.items():
            self.consumer.seek(tps[tp], off)

    def poll_tps(self, max_records, timeout_s):
        got = self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        values: list = []
        stamps: list = []
        last: dict[tuple[str, int], int] = {}
        for tp, recs in got.items():
            values.extend([r.value for r in recs])
            stamps.extend([r.timestamp for r in recs])
            last[(tp.topic, tp.partition)] = recs[-1].offset
        self._got = got
        return values, stamps, last

    def runs_tps(self) -> list[tuple[tuple[str, int], int]]:
        """((topic, partition), count) of the last poll's records, in order."""
        return [((tp.topic, tp.partition), len(recs)) for tp, recs in self._got.items()]

    def positions_tps(self) -> list[tuple[str, int, int]]:
        return [(tp.topic, tp.partition, r.offset) for tp, recs in self._got.items()
                for r in recs]

    def close(self):
        self.consumer.close()


class _ConfluentConsumer(_ReadBack):
    def __init__(self, bootstrap: str, group_id: str | None, options: dict):
        from confluent_kafka import Consumer

        self.bootstrap, self.options = bootstrap, dict(options)  # what it was built with
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

    def _headers(self, key: str) -> list[bytes] | None:
        msgs = self.consumer.consume(num_messages=100_000, timeout=0.3)
        if not msgs:
            return None
        for m in msgs:
            if m.error():
                raise RuntimeError(f"Kafka consume error: {m.error()}")
        return [v for m in msgs for k, v in (m.headers() or ()) if k == key]

    def _position(self, topic, parts) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        got = self.consumer.position([TopicPartition(topic, p) for p in parts])
        return {tp.partition: tp.offset for tp in got}

    def commit(self, topic, offsets):
        from confluent_kafka import TopicPartition

        self.consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )

    # -- the source: partitions of several topics, as (topic, partition) pairs -----------
    def topics(self) -> set[str]:
        return set(self.consumer.list_topics(timeout=10).topics)

    def assign_tps(self, offsets: dict) -> None:
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(t, p, o) for (t, p), o in offsets.items()])

    def poll_tps(self, max_records, timeout_s):
        msgs = self.consumer.consume(num_messages=max_records, timeout=timeout_s)
        values, stamps, last = [], [], {}
        for m in msgs:
            if m.error():
                raise RuntimeError(f"Kafka consume error: {m.error()}")
            values.append(m.value())
            stamps.append(m.timestamp()[1])
            last[(m.topic(), m.partition())] = m.offset()
        self._msgs = msgs
        return values, stamps, last

    def runs_tps(self) -> list[tuple[tuple[str, int], int]]:
        runs: list = []
        for m in self._msgs:
            tp = (m.topic(), m.partition())
            if runs and runs[-1][0] == tp:
                runs[-1][1] += 1
            else:
                runs.append([tp, 1])
        return [(tp, n) for tp, n in runs]

    def positions_tps(self) -> list[tuple[str, int, int]]:
        return [(m.topic(), m.partition(), m.offset()) for m in self._msgs]

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
        options: extra producer options (security, linger, compression), passed through;
            the connection and security ones (``security_*``, ``sasl_*``, ``ssl_*``...) also
            reach the consumer an exactly-once sink reads its topic back with.
        transactional_id_prefix: exactly-once: transactional ids are
            ``{prefix}-{step_id}-{instance}`` (default prefix ``rayflow-{job name}``). Give
            two deployments of the same flow different prefixes, or they fence each other.
    """

    topic: str
    bootstrap: str | None = None
    serializer: Callable[[Any], bytes] | None = None
    key: Callable[[Any], bytes] | None = None
    stamp: Callable[[Any, float, float], Any] | None = None
    max_message_bytes: int = 1_000_000
    client: Client = "kafka-python"
    options: dict = field(default_factory=dict)
    transactional_id_prefix: str | None = None

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        bootstrap = self.bootstrap or default_bootstrap()
        cls = _ConfluentProducer if self.client == "confluent" else _KPProducer
        options = _client_options(self.client, self.options)
        if ctx.guarantee == "exactly_once":
            prefix = self.transactional_id_prefix or f"rayflow-{ctx.job_name}"
            txn_id = f"{prefix}-{ctx.step_id}-{ctx.instance}"
            scan = (_ConfluentConsumer if self.client == "confluent" else _KPConsumer)(
                bootstrap, None, {**connection_options(options),
                                  **_READ_COMMITTED[self.client]})
            return _TransactionalWriter(self, ctx, cls(bootstrap, options, txn_id),
                                        scan, resume_state)
        return _KafkaWriter(self, ctx, cls(bootstrap, options))


_READ_COMMITTED = {"kafka-python": {"isolation_level": "read_committed"},
                   "confluent": {"isolation.level": "read_committed"}}


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


#: The header that names each record of an exactly-once sink: ``writer:epoch:seq``.
EPOCH_HEADER = "rayflow.epoch"

# Client options about reaching the brokers (security, identity): every client rayflow
# builds for a step gets them, not only the step's main client. Both spellings: kafka-python
# (security_protocol) and librdkafka (security.protocol).
_CONNECTION_PREFIXES = ("security_", "sasl_", "ssl_", "client_id", "api_version",
                        "socket_", "broker_", "metadata_max_age", "connections_max_idle")


def connection_options(options: dict) -> dict:
    """The subset of a step's client ``options`` that every client of the step needs."""
    return {k: v for k, v in options.items()
            if k.replace(".", "_").startswith(_CONNECTION_PREFIXES)}


class _TransactionalWriter(_KafkaWriter):
    """Exactly-once sink: two-phase commit tied to checkpoints, correct even on brokers
    whose ``read_committed`` shows aborted data (Tansu, the embedded default).

    - Records of each checkpoint epoch are held back; at the barrier (pre-commit) they
      become part of the checkpoint, with a lower bound of the topic's end offsets.
    - When the checkpoint completes (it is durable by then), they are written in one Kafka
      transaction, each with a header ``writer:epoch:seq``.
    - A restored instance first fences its predecessor (``init_transactions`` on the same
      transactional id), then reads the topic from those offsets with ``read_committed``
      and writes again only the records of its restored epochs that are not there. On
      Apache Kafka an interrupted transaction is invisible, so all are written again; on a
      broker that shows the part that reached it, only the rest is. Either way each record
      is visible once.

    No commits topic is needed (no topic-create rights, nothing to replicate).
    """

    def __init__(self, spec, ctx, producer, scanner, resume_state: Any):
        super().__init__(spec, ctx, producer)
        if isinstance(resume_state, Rescaled):
            # a rescale resumes from a savepoint: the old instances committed everything at
            # their end of stream, so there is nothing of theirs to commit
            resume_state = None
        # The writer id names this sink instance *and the run*: a restored instance keeps the
        # run of its checkpoint (its epochs continue), a fresh job starts new ones.
        self.run = resume_state["run"] if resume_state else ctx.run_id
        ident = f"{ctx.job_name}/{self.run}/{ctx.step_id}/{ctx.instance}".encode()
        self.writer = hashlib.blake2b(ident, digest_size=8).hexdigest()
        self.scanner = scanner
        self.buffer: list[tuple[list, list | None]] = []
        self.pending: dict[int, dict] = {}  # epoch -> {"parts": [(values, keys)], "low": ...}
        self.p.init_transactions()  # fences an older producer of this instance
        self.low = scanner.end_offsets(spec.topic)  # our next records land at or after this
        if resume_state and resume_state["pending"]:
            self.pending = dict(resume_state["pending"])
            self._recommit()

    def write(self, items, event_times, in_time):
        values, keys, dead = self._encode(items, in_time)
        if values:
            self.buffer.append((values, keys))
        return dead

    def snapshot(self, checkpoint_id):
        if self.buffer:
            self.pending[checkpoint_id] = {"parts": self.buffer, "low": dict(self.low)}
            self.buffer = []
        return {"run": self.run, "pending": dict(self.pending)}

    def uncommitted(self) -> bool:
        return bool(self.pending or self.buffer)

    def commit(self, checkpoint_id):
        ready = sorted(cid for cid in self.pending if cid <= checkpoint_id)
        if not ready:
            return
        # later epochs land after what is on the topic now (a restore reads from there)
        self.low = self.scanner.end_offsets(self.spec.topic)
        self._send(ready, set())

    def _send(self, ready: list[int], skip: set[bytes]) -> None:
        self.p.begin()
        topic, w = self.spec.topic, self.writer
        for cid in ready:
            seq = 0
            for values, keys in self.pending[cid]["parts"]:
                tags = [f"{w}:{cid}:{seq + i}".encode() for i in range(len(values))]
                seq += len(values)
                if skip:
                    keep = [i for i, t in enumerate(tags) if t not in skip]
                    values = [values[i] for i in keep]
                    keys = [keys[i] for i in keep] if keys else None
                    tags = [tags[i] for i in keep]
                if values:
                    self.p.send_many(topic, values, keys, [[(EPOCH_HEADER, t)] for t in tags])
        self.p.commit()  # flushes first
        for cid in ready:
            del self.pending[cid]

    def _recommit(self) -> None:
        """Commit the restored epochs, skipping records of theirs already visible."""
        ready = sorted(self.pending)
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


class _KPProducer:
    def __init__(self, bootstrap: str, options: dict, transactional_id: str | None = None):
        from kafka import KafkaProducer

        opts = dict(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 20,
                    max_request_size=8 << 20, acks=1)
        if transactional_id:
            opts.update(transactional_id=transactional_id, acks="all")
        opts.update(options)
        self.config = opts  # what it was built with
        self.producer = KafkaProducer(**opts)

    def init_transactions(self):
        self.producer.init_transactions()

    def begin(self):
        self.producer.begin_transaction()

    def commit(self):
        self.producer.commit_transaction()

    def send_many(self, topic, values, keys, headers=None):
        send = self.producer.send
        if headers is not None:
            for i, v in enumerate(values):
                send(topic, v, key=keys[i] if keys else None, headers=headers[i])
        elif keys is None:
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
        self.config = conf  # what it was built with
        self.producer = Producer(conf)

    def init_transactions(self):
        self.producer.init_transactions(30)

    def begin(self):
        self.producer.begin_transaction()

    def commit(self):
        self.producer.commit_transaction(30)

    def send_many(self, topic, values, keys, headers=None):
        produce, poll = self.producer.produce, self.producer.poll
        for i, v in enumerate(values):
            while True:
                try:
                    if headers is None:
                        produce(topic, v, keys[i] if keys else None)
                    else:
                        produce(topic, v, keys[i] if keys else None, headers=headers[i])
                    break
                except BufferError:  # local queue full: let delivery reports drain
                    poll(0.05)
        poll(0)

    def flush(self):
        self.producer.flush()

    def close(self):
        self.producer.flush()


def _high_watermarks(consumer, topic: str, parts) -> dict[int, int]:
    """The partitions' high watermarks, also past open transactions (read_uncommitted)."""
    opts = {k: v for k, v in consumer.options.items() if "isolation" not in k}
    probe = type(consumer)(consumer.bootstrap, None, opts)
    try:
        return probe.watermarks(topic, sorted(parts))[1]
    finally:
        probe.close()


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
