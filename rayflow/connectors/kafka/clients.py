"""The client adapters: the only code that knows each Kafka client's API (confluent-kafka,
the default, and kafka-python), behind one consumer and one producer interface; and the
options every client of a step shares."""

from __future__ import annotations

import abc
import time
from collections.abc import Iterable
from typing import Any, Literal

Start = Literal["earliest", "latest", "committed"]
Client = Literal["confluent", "kafka-python"]


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


def resolve_client(client: str | None, where: str) -> Client:
    """``client``, or the job's ``kafka.client`` when None.

    Raises:
        ValueError: ``client`` is neither ``confluent`` nor ``kafka-python``.
    """
    if client is None:
        from rayflow.config import current

        return current().kafka.client
    if client not in ("confluent", "kafka-python"):
        raise ValueError(f"{where}: client={client!r}; use 'confluent' or 'kafka-python'")
    return client  # type: ignore[return-value]


def _client_options(client: str, options: dict) -> dict:
    """A connector's client options: the job's ``kafka.options`` under the connector's own,
    in ``client``'s names (either spelling is accepted; see
    :mod:`rayflow.connectors.kafka.options`)."""
    from rayflow.config import current

    return current().kafka.client_options(client, options)


# Client options about reaching the brokers (security, identity): every client rayflow
# builds for a step gets them, not only the step's main client. Both spellings: kafka-python
# (security_protocol) and librdkafka (security.protocol).
_CONNECTION_PREFIXES = ("security_", "sasl_", "ssl_", "client_id", "api_version",
                        "socket_", "broker_", "metadata_max_age", "connections_max_idle")


def connection_options(options: dict) -> dict:
    """The subset of a step's client ``options`` that every client of the step needs."""
    return {k: v for k, v in options.items()
            if k.replace(".", "_").startswith(_CONNECTION_PREFIXES)}


_READ_COMMITTED = {"kafka-python": {"isolation_level": "read_committed"},
                   "confluent": {"isolation.level": "read_committed"}}
_READ_UNCOMMITTED = {"kafka-python": {"isolation_level": "read_uncommitted"},
                     "confluent": {"isolation.level": "read_uncommitted"}}


class _ReadBack(abc.ABC):
    """Reading a topic back (an exactly-once sink's restore), over a consumer adapter's
    ``partitions``, ``watermarks``, ``assign_tps`` and its ``_headers``/``next_offsets``."""

    client: Client
    bootstrap: str
    options: dict
    consumer: Any
    _log_ends: _ReadBack | None = None  # a read_uncommitted twin, for log_end_offsets

    @abc.abstractmethod
    def partitions(self, topic: str) -> set[int]:
        """The topic's partitions (empty if it does not exist)."""

    @abc.abstractmethod
    def watermarks(self, topic: str, parts: Iterable[int]
                   ) -> tuple[dict[int, int], dict[int, int]]:
        """(low, high) offset of each partition."""

    @abc.abstractmethod
    def assign_tps(self, offsets: dict) -> None:
        """Read these (topic, partition) pairs from these offsets."""

    @abc.abstractmethod
    def _headers(self, key: str) -> list[bytes] | None:
        """One poll: the values of header ``key`` (None when the poll returned nothing)."""

    @abc.abstractmethod
    def next_offsets(self, topic: str, parts: Iterable[int]) -> dict[int, int]:
        """The next offset to read of each partition."""

    @abc.abstractmethod
    def cluster_id(self) -> str | None:
        """The cluster id the broker reports in its metadata."""

    def log_end_offsets(self, topic: str, parts: Iterable[int] | None = None
                        ) -> dict[int, int]:
        """Each partition's end past open transactions: where the next record written
        lands, at the earliest. It is the high watermark under ``read_uncommitted``,
        whatever this consumer's isolation level; under ``read_committed`` a broker answers
        the last stable offset, which stops before the first record of any transaction
        still open (Tansu 0.x answers 0 while one is open). librdkafka's default level is
        ``read_committed``: a consumer that reads so asks a twin that says
        ``read_uncommitted`` in so many words."""
        if parts is None:
            parts = self.partitions(topic)
            if not parts:
                raise ValueError(f"Kafka topic {topic!r} does not exist or has no partitions")
        if not self.reads_committed():
            return self.watermarks(topic, sorted(parts))[1]
        if self._log_ends is None:
            options = {k: v for k, v in self.options.items() if "isolation" not in k}
            self._log_ends = type(self)(self.bootstrap, None,  # type: ignore[call-arg]
                                        {**options, **_READ_UNCOMMITTED[self.client]})
        return self._log_ends.watermarks(topic, sorted(parts))[1]

    def reads_committed(self) -> bool:
        """Whether this consumer reads under ``read_committed``: librdkafka's default, not
        kafka-python's."""
        name = "isolation.level" if self.client == "confluent" else "isolation_level"
        default = "read_committed" if self.client == "confluent" else "read_uncommitted"
        return self.options.get(name, default) == "read_committed"

    def close(self) -> None:
        if self._log_ends is not None:
            self._log_ends.close()
        self.consumer.close()

    def scan_headers(self, topic, start: dict[int, int], key: str,
                     timeout_s: float = 60.0) -> list[bytes]:
        """Values of header ``key`` of every record from ``start`` to the end (as this
        consumer's isolation level shows them), the end being each partition's
        :meth:`log_end_offsets` when the scan starts. A partition with nothing past its
        start is not read. The scan ends at the end, never before: an exactly-once sink's
        restore writes again what it does not find, so a scan cut short would duplicate
        records. Under ``read_committed`` a transaction another producer holds open keeps
        the end out of reach until it ends (a sink instance that died inside one: until its
        successor fences it); past ``timeout_s`` the scan raises ``TimeoutError``."""
        target = self.log_end_offsets(topic, start) if start else {}
        todo = {p: off for p, off in start.items() if target.get(p, 0) > off}
        if not todo:
            return []
        self.assign_tps({(topic, p): off for p, off in todo.items()})
        out: list[bytes] = []
        idle, deadline = 0, time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self._headers(key)
            idle = 0 if got is not None else idle + 1
            out.extend(got or ())
            at_end = all(o >= target[p] for p, o in self.next_offsets(topic, todo).items())
            if idle >= 2 and at_end:
                return out
        raise TimeoutError(f"reading topic {topic!r} back took over {timeout_s:.0f} s "
                           f"(at {self.next_offsets(topic, todo)} of {target})")


class _KPConsumer(_ReadBack):
    client = "kafka-python"

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

    def cluster_id(self):
        self.consumer.topics()  # a metadata request: it carries the cluster id
        # (kafka-python has no public getter)
        return getattr(self.consumer._client.cluster, "cluster_id", None)

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

    def next_offsets(self, topic, parts) -> dict[int, int]:
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


class _ConfluentConsumer(_ReadBack):
    client = "confluent"

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

    def cluster_id(self):
        return self.consumer.list_topics(timeout=10).cluster_id

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
        out: list[bytes] = []
        for m in msgs:
            for header in m.headers() or ():
                if header[0] == key and isinstance(header[1], bytes):
                    out.append(header[1])
        return out

    def next_offsets(self, topic, parts) -> dict[int, int]:
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

    def send_many(self, topic, values, keys, header=None):
        """Send ``values`` (with ``keys``, or none), each with one header when ``header`` is
        ``(name, tags)``: record i carries ``name: tags[i]``."""
        send = self.producer.send
        if header is not None:
            name, tags = header
            for i, v in enumerate(values):
                send(topic, v, key=keys[i] if keys else None, headers=[(name, tags[i])])
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

    def send_many(self, topic, values, keys, header=None):
        """As the kafka-python producer's. A header goes as a dict made in the loop: half
        the cost of a list of pairs made beforehand (on the 2-core VM, 1.6 against 2.5-3.1
        microseconds a record; 0.5 without a header)."""
        produce, poll = self.producer.produce, self.producer.poll
        n, start = len(values), 0
        keys = keys or [None] * n
        i = 0
        while start < n:
            try:  # one tight loop per kind; a full queue resumes it at the record it refused
                if header is None:
                    for i in range(start, n):
                        produce(topic, values[i], keys[i])
                else:
                    name, tags = header
                    for i in range(start, n):
                        produce(topic, values[i], keys[i], headers={name: tags[i]})
                start = n
            except BufferError:  # local queue full: let delivery reports drain
                start = i
                poll(0.05)
        poll(0)

    def flush(self):
        self.producer.flush()

    def close(self):
        self.producer.flush()
