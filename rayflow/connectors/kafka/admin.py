"""Admin helpers for jobs, tests and benchmarks: create a topic, fill it, read it back."""

from __future__ import annotations

from rayflow.connectors.kafka.clients import Client, resolve_client
from rayflow.connectors.kafka.options import for_client


def create_topic(bootstrap: str, name: str, partitions: int = 1, exist_ok: bool = True,
                 options: dict | None = None) -> None:
    """Create ``name`` with ``partitions`` partitions (replication 1). ``options``: client
    options (security), in either spelling."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap,
                             **for_client("kafka-python", options or {}, "create_topic"))
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    except TopicAlreadyExistsError:
        if not exist_ok:
            raise
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, values, partitions: int = 1,
            client: Client | None = None, options: dict | None = None) -> int:
    """Write ``values`` (bytes) round-robin over ``partitions``; return how many.
    ``client``: default the job's ``kafka.client``; ``options`` in either spelling."""
    n = 0
    client = resolve_client(client, "produce")
    options = for_client(client, options or {}, "produce")
    if client == "confluent":
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **options})
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
                      **options)
    for v in values:
        p.send(topic, v, partition=n % partitions)
        n += 1
    p.flush()
    p.close()
    return n


def read_values(bootstrap: str, topic: str, isolation: str = "read_committed",
                timeout_s: float = 60.0) -> list[bytes]:
    """Every value in ``topic`` now, partition by partition (for checks and demos, not for
    big topics). ``read_committed`` sees only committed transactions.

    Each partition is read at least to the end offset the broker reports when the call
    starts, so a slow broker cannot end the read early, and then until a poll returns
    nothing: some brokers (Tansu 0.x, the embedded default) report the last record batch's
    base offset + 1 as the end, and the last stable offset as 0 while a transaction is open.
    Raises TimeoutError, naming the partitions that fell short, after ``timeout_s``."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      isolation_level=isolation, auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        c.assign(tps)
        ends = c.end_offsets(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        left = [tp for tp in tps if c.position(tp) < ends[tp]]
        idle = 0
        while left or idle < 2:
            if time.monotonic() > deadline:
                short = {tp.partition: (c.position(tp), ends[tp]) for tp in left}
                raise TimeoutError(f"read_values({topic!r}): after {timeout_s:.0f} s these "
                                   f"partitions are short of their end (at, end): {short}")
            got = c.poll(300)
            for recs in got.values():
                out.extend(r.value for r in recs)
            left = [tp for tp in left if c.position(tp) < ends[tp]]
            idle = 0 if got or left else idle + 1
        return out
    finally:
        c.close()


def count_records(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> int:
    """Records in ``topic`` now (read to the end; for checks, not for big topics)."""
    return len(read_values(bootstrap, topic, isolation))
