"""The Kafka sink's spec: it builds the plain writer, or the exactly-once one
(:mod:`rayflow.connectors.kafka.transactional`) when the job asks for exactly-once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rayflow.connectors.kafka.clients import (
    _READ_COMMITTED,
    Client,
    _client_options,
    _ConfluentConsumer,
    _ConfluentProducer,
    _KPConsumer,
    _KPProducer,
    connection_options,
    default_bootstrap,
    resolve_client,
)
from rayflow.connectors.kafka.committer import CommitProcess
from rayflow.connectors.kafka.transactional import _TransactionalWriter
from rayflow.connectors.kafka.writer import _KafkaWriter
from rayflow.core.connectors import SinkSpec, SinkWriter
from rayflow.core.operators import StepContext
from rayflow.errors import check_callable, check_number


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
        client: ``confluent`` (confluent-kafka) or ``kafka-python``; default: the job's
            ``kafka.client`` (``confluent``).
        options: extra producer options (security, linger, compression), in Kafka's dotted
            names or kafka-python's, translated for the client, on top of the job's
            ``kafka.options``; the connection and security ones (``security.*``,
            ``sasl.*``, ``ssl.*``...) also
            reach the consumer an exactly-once sink reads its topic back with.
        max_uncommitted_bytes: exactly-once: the records an instance may hold for commits
            that are not done (the checkpoints' epochs wait for their checkpoint to complete,
            then for their transaction). Past it, writes wait while a commit runs, so a
            broker or client slower than the pipeline backpressures it instead of growing
            memory. Default 64 MiB. An instance holds a pre-committed epoch once, packed
            as its checkpoint holds it (the open epoch also as written, until its
            barrier); its commit process (a process of its own that runs the instance's
            transactions, beside the operators) holds a copy of those it is writing.
        transactional_id_prefix: exactly-once: transactional ids are
            ``{prefix}-{step_id}-{instance}`` (default prefix ``rayflow-{job name}``). Give
            two deployments of the same flow different prefixes, or they fence each other.
        serialize_commits: exactly-once: commit one transaction at a time among the sink
            instances on a machine that write to this broker (a file lock named after the
            bootstrap address). None (the default): on when the broker is Tansu (its
            cluster id says so), whose in-memory engine, the embedded default, loses or
            hides committed records when several producers' transactions run at once; off
            on Apache Kafka, which needs no such care.
    """

    topic: str
    bootstrap: str | None = None
    serializer: Callable[[Any], bytes] | None = None
    key: Callable[[Any], bytes] | None = None
    stamp: Callable[[Any, float, float], Any] | None = None
    max_message_bytes: int = 1_000_000
    client: Client | None = None
    options: dict = field(default_factory=dict)
    transactional_id_prefix: str | None = None
    max_uncommitted_bytes: int = 64 << 20
    serialize_commits: bool | None = None

    def __post_init__(self) -> None:
        resolve_client(self.client, f"KafkaSink({self.topic!r})")  # a misspelt client fails
        if self.serialize_commits is not None and not isinstance(self.serialize_commits, bool):
            raise ValueError(f"KafkaSink({self.topic!r}): serialize_commits must be None, True "
                             f"or False, got {self.serialize_commits!r}")
        if self.max_uncommitted_bytes <= 0:
            raise ValueError(f"KafkaSink({self.topic!r}): max_uncommitted_bytes must be > 0, "
                             f"got {self.max_uncommitted_bytes}")
        check_number(f"KafkaSink({self.topic!r})", "max_message_bytes", self.max_message_bytes)
        for name in ("serializer", "key", "stamp"):
            check_callable(f"KafkaSink({self.topic!r})", name, getattr(self, name))

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        bootstrap = self.bootstrap or default_bootstrap()
        client = resolve_client(self.client, f"KafkaSink({self.topic!r})")
        cls = _ConfluentProducer if client == "confluent" else _KPProducer
        options = _client_options(client, self.options)
        if ctx.guarantee == "exactly_once":
            prefix = self.transactional_id_prefix or f"rayflow-{ctx.job_name}"
            txn_id = f"{prefix}-{ctx.step_id}-{ctx.instance}"
            scan = (_ConfluentConsumer if client == "confluent" else _KPConsumer)(
                bootstrap, None, {**connection_options(options),
                                  **_READ_COMMITTED[client]})
            return _TransactionalWriter(
                self, ctx, functools.partial(CommitProcess, client, bootstrap, options, txn_id),
                scan, resume_state)
        return _KafkaWriter(self, ctx, cls(bootstrap, options))
