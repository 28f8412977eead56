"""The Kafka source: partitions of one or more topics dealt to the instances, offsets in
checkpoints."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, get_args

import numpy as np

from rayflow.connectors.kafka.clients import (
    Client,
    Start,
    _client_options,
    _ConfluentConsumer,
    _KPConsumer,
    default_bootstrap,
    resolve_client,
)
from rayflow.core.connectors import SourceReader, SourceSpec
from rayflow.core.operators import Rescaled, StepContext
from rayflow.errors import check_callable, check_number

log = logging.getLogger(__name__)


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
        client: ``confluent`` (confluent-kafka) or ``kafka-python``; default: the job's
            ``kafka.client`` (``confluent``).
        options: extra client options (security settings and tuning), in Kafka's dotted
            names or kafka-python's, translated for the client; on top of the job's
            ``kafka.options``.
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
    client: Client | None = None
    options: dict = field(default_factory=dict)
    commit_interval_s: float = 5.0
    with_metadata: bool = False
    topics: tuple[str, ...] | None = None
    pattern: str | None = None

    def __post_init__(self):
        resolve_client(self.client, "KafkaSource")  # a misspelt client fails here
        if self.start not in get_args(Start):
            from rayflow.config import did_you_mean

            starts = get_args(Start)
            raise ValueError(f"KafkaSource: start={self.start!r} is not one of "
                             f"{list(starts)}{did_you_mean(str(self.start), starts)}")
        check_number("KafkaSource", "commit_interval_s", self.commit_interval_s)
        check_callable("KafkaSource", "deserializer", self.deserializer)
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
        client = resolve_client(self.client, f"KafkaSource({self.name})")
        consumer = (_ConfluentConsumer if client == "confluent" else _KPConsumer)(
            bootstrap, self.group_id, _client_options(client, self.options)
        )
        return _KafkaReader(self, ctx, consumer, resume_state)


def _topic_names(spec: KafkaSource, consumer) -> list[str]:
    if spec.topic is not None:
        return [spec.topic]
    if spec.topics is not None:
        return list(spec.topics)
    assert spec.pattern is not None  # the spec holds exactly one of topic, topics, pattern
    rx = re.compile(spec.pattern)
    names = sorted(t for t in consumer.topics() if rx.fullmatch(t) and not t.startswith("__"))
    if not names:
        raise ValueError(f"KafkaSource: no topic matches the pattern {spec.pattern!r}")
    return names


class _KafkaReader(SourceReader):
    """Reads its share of the partitions of every topic; positions are keyed by
    ``(topic, partition)`` (by partition alone for a single ``topic``, as before)."""

    def __init__(self, spec: KafkaSource, ctx: StepContext, consumer, resume_state):
        self.spec, self.c, self.ctx = spec, consumer, ctx
        self.topic_list = _topic_names(spec, consumer)
        every: list[tuple[str, int]] = []
        for t in self.topic_list:
            parts = consumer.partitions(t)
            if not parts:
                raise ValueError(f"Kafka topic {t!r} does not exist or has no partitions")
            every.extend((t, p) for p in sorted(parts))
        self.partitions = [tp for j, tp in enumerate(every)
                           if j % ctx.parallelism == ctx.instance]
        # this instance's partitions of each topic that has any
        self._mine: dict[str, list[int]] = {}
        for t, p in self.partitions:
            self._mine.setdefault(t, []).append(p)
        if isinstance(resume_state, Rescaled):  # offsets of every old instance: keep ours
            merged = {self._tp(k): o for h in resume_state.handles if h for k, o in h.items()}
            resume_state = {tp: o for tp, o in merged.items() if tp in self.partitions}
        self.next: dict[tuple[str, int], int] = {}
        self._keep: list[int] | None = None
        if self.partitions:
            begin, end = {}, {}
            for t, mine in self._mine.items():
                b, e = consumer.watermarks(t, mine)
                begin.update({(t, p): o for p, o in b.items()})
                end.update({(t, p): o for p, o in e.items()})
            if spec.bounded and consumer.reads_committed():
                self._warn_of_open_transactions(end)
            if spec.bounded or spec.start == "latest":
                end = self._true_end(begin, end)
            if resume_state:
                start = {self._tp(k): int(o) for k, o in resume_state.items()}
            elif spec.start == "latest":
                start = end
            elif spec.start == "committed":
                start = {}
                for t, mine in self._mine.items():
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

    def _warn_of_open_transactions(self, end: dict) -> None:
        """Say where a bounded read stops short of a partition's end because a transaction
        is open there. Under ``read_committed`` (librdkafka's default) the end the broker
        gives is the last stable offset, before the first record of any transaction still
        open: the read stops there, as Kafka's semantics have it, and on Tansu, which gives
        0 while a transaction is open, it reads nothing of that partition."""
        short: dict[tuple[str, int], tuple[int, int]] = {}
        for t, mine in self._mine.items():
            for p, log_end in self.c.log_end_offsets(t, mine).items():
                if log_end > end[(t, p)]:
                    short[(t, p)] = (end[(t, p)], log_end)
        if short:
            where = ", ".join(f"{t}[{p}]: stops at {a}, the log ends at {b}"
                              for (t, p), (a, b) in sorted(short.items()))
            log.warning("KafkaSource(%s) %s/%s: a transaction is open where this bounded "
                        "read_committed read ends, so it reads no record at or after the "
                        "open transaction's first one (%s; Tansu gives 0 while one is "
                        "open). Read the topic once its writers' transactions ended, or "
                        "with isolation.level=read_uncommitted", self.spec.name,
                        self.ctx.step_id, self.ctx.instance, where)

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

        by_topic: dict[str, list[int]] = {}
        for t, p in probe:
            by_topic.setdefault(t, []).append(p)

        def reached() -> bool:  # every probed partition read past its reported end - 1
            return all(o >= end[(t, p)] for t, parts in by_topic.items()
                       for p, o in self.c.next_offsets(t, parts).items())

        # the probe's fetch must have come back before two empty polls end it: on a loaded
        # machine it can take longer than those (the reported end, short, then lost the tail
        # of a bounded read)
        idle_polls, done, deadline = 0, False, time.monotonic() + 30
        while idle_polls < 2 and time.monotonic() < deadline:
            values, _, last = self.c.poll_tps(1_000_000, 0.2)
            for tp, off in last.items():
                true_end[tp] = max(true_end[tp], off + 1)
            done = done or reached()
            idle_polls = idle_polls + 1 if (not values and done) else 0
        if not done:
            log.warning("KafkaSource(%s): the last record batch of %s did not arrive in 30 s; "
                        "a bounded read ends at the broker's reported end offsets %s",
                        self.spec.name, sorted(probe), {tp: end[tp] for tp in probe})
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
            if self.end is not None:
                self._past_markers(self.end)
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

    def _past_markers(self, end: dict[tuple[str, int], int]) -> None:
        """A bounded read whose poll came back empty: take the consumer's positions where
        they passed records it never returns, such as the commit marker that ends each
        transaction (a topic an exactly-once sink wrote ends with one), or an aborted
        transaction's records, so that the read ends at the end offsets; from the offset
        after the last record returned, it would wait for ever."""
        by_topic: dict[str, list[int]] = {}
        for t, p in self.partitions:
            if self.next[(t, p)] < end[(t, p)]:
                by_topic.setdefault(t, []).append(p)
        for t, parts in by_topic.items():
            for p, pos in self.c.next_offsets(t, parts).items():
                if pos is not None and pos > self.next[(t, p)]:
                    self.next[(t, p)] = min(pos, end[(t, p)])

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
