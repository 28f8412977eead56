"""Nexmark: the auction-site benchmark of streaming systems, on rayflow.

- :mod:`rayflow.nexmark.generator`: the event generator (people, auctions, bids), as Arrow
  batches or dicts, deterministic by seed.
- :mod:`rayflow.nexmark.queries`: the queries as flows, each with a plain-Python reference.
- :func:`nexmark_flow` wires a query behind a generator source; :func:`fill_kafka` writes
  the events to a Kafka topic, and :func:`decode` reads them back.

    >>> import rayflow as rf
    >>> flow = nexmark_flow("q1", NexmarkConfig(seed=3), count=1000, sink=rf.CollectSink())
    >>> [s.step_id for s in flow.steps]
    ['events', 'q1', 'out']
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayflow.nexmark.generator import NexmarkConfig, NexmarkGenerator, event_time_s
from rayflow.nexmark.queries import QUERIES, Query

__all__ = ["QUERIES", "NexmarkConfig", "NexmarkGenerator", "Query", "decode", "fill_kafka",
           "max_delay_s", "nexmark_flow", "nexmark_source"]


@dataclass(frozen=True)
class _Batch:
    """GeneratorSource ``make``: event numbers -> an Arrow batch."""

    generator: NexmarkGenerator

    def __call__(self, seq: np.ndarray):
        return self.generator.batch(seq)


@dataclass(frozen=True)
class _Rows:
    """GeneratorSource ``make``: event numbers -> a list of event dicts."""

    generator: NexmarkGenerator

    def __call__(self, seq: np.ndarray):
        return self.generator.rows(seq)


@dataclass(frozen=True)
class _Times:
    """GeneratorSource ``timestamps``: event numbers -> their event times (s)."""

    generator: NexmarkGenerator

    def __call__(self, seq: np.ndarray) -> np.ndarray:
        return self.generator.event_times_s(seq)


def max_delay_s(config: NexmarkConfig) -> float:
    """The event-time disorder of the generator's output: one out-of-order group's span, plus
    a millisecond for the rounding of event times to ms. A watermark that trails the largest
    event time by this much makes no event late."""
    return config.out_of_order_group_size * config.inter_event_delay_us / 1e6 + 0.001


def nexmark_source(config: NexmarkConfig, count: int | None, *, rate: float | None = None,
                   columnar: bool = True):
    """A :class:`~rayflow.GeneratorSource` of Nexmark events: Arrow batches (``columnar``)
    or lists of dicts. ``count`` events in all (None: unbounded), at ``rate`` events/s of
    wall clock (None: as fast as possible). It gives the events' event times (one numpy
    call per batch), so ``EventTime()`` needs no timestamp function behind it."""
    from rayflow.connectors.memory import GeneratorSource

    gen = NexmarkGenerator(config)
    return GeneratorSource(_Batch(gen) if columnar else _Rows(gen), count=count, rate=rate,
                           columnar=True, timestamps=_Times(gen))


def nexmark_flow(query: str | Query, config: NexmarkConfig | None = None,
                 count: int | None = 100_000, *, sink: Any, parallelism: int = 1,
                 rate: float | None = None, columnar: bool | None = None,
                 late_sink: Any = None, source: Any = None, name: str | None = None,
                 **source_options: Any):
    """A dataflow running ``query`` over generated events.

    Args:
        query: a name of :data:`QUERIES` or a :class:`Query`.
        config: the generator's configuration (defaults: the suite's).
        count, rate: see :func:`nexmark_source`.
        sink: where the query's output goes (``CollectSink()``, ``DiscardSink()``...).
        parallelism: instances of the source (each makes every n-th event) and the steps.
        columnar: Arrow batches for the queries that have an Arrow path (default), else dicts.
        late_sink: for event-time queries with a window or join, where the late events of
            the first of them go (by default they are dead letters; the source's watermarks
            trail by :func:`max_delay_s`, so the generator's events are never late).
        source: another source of event dicts instead of the generator (e.g. a KafkaSource
            with ``deserializer=decode``).
        name: the flow's name (default ``nexmark-<query>``).
        **source_options: step options of the source (``batch_size``...).
    """
    from rayflow.dataflow import Dataflow
    from rayflow.errors import ConfigError
    from rayflow.operators.windows import EventTime

    if isinstance(query, str):
        if query not in QUERIES:
            raise ConfigError(f"nexmark: unknown query {query!r}; the queries are "
                              f"{sorted(QUERIES)}")
        query = QUERIES[query]
    if not isinstance(query, Query):
        raise ConfigError(f"nexmark: query must be a name or a Query, got {query!r}")
    config = config or NexmarkConfig()
    if columnar is None:
        columnar = query.columnar and source is None
    if columnar and not query.columnar:
        raise ConfigError(f"nexmark: {query.name} has no Arrow path; use columnar=False")
    if columnar and source is not None:
        raise ConfigError("nexmark: a given source gives event dicts; use columnar=False")
    if late_sink is not None and not query.late:
        raise ConfigError(f"nexmark: {query.name} has no step that sends late events aside, "
                          f"so nothing for late_sink")
    # the generator gives its events' times; another source's events carry theirs
    timestamp = event_time_s if source is not None else None
    if source is None:
        source = nexmark_source(config, count, rate=rate, columnar=columnar)
    flow = Dataflow(name or f"nexmark-{query.name}")
    wm = EventTime(timestamp=timestamp, max_delay_s=max_delay_s(config)) \
        if query.event_time else None
    events = flow.source("events", source, parallelism, watermarks=wm, **source_options)
    out = query.build(events, columnar, config)
    out.sink("out", sink)
    if late_sink is not None:
        first = next(s.step_id for s in flow.steps if getattr(s.spec, "event_time", False))
        from rayflow.dataflow import Stream

        Stream(flow, first).side("late").sink("late", late_sink)
    return flow


def decode(value: bytes) -> dict[str, Any]:
    """A Kafka record value written by :func:`fill_kafka` -> the event dict."""
    return json.loads(value)


def fill_kafka(bootstrap: str, topic: str, config: NexmarkConfig, count: int, *,
               partitions: int = 1, chunk: int = 10_000) -> None:
    """Write events ``0 .. count - 1`` to ``topic`` as JSON, event ``n`` to partition
    ``n % partitions``, each with its event time as the record timestamp (so a KafkaSource
    gives event times without a timestamp function)."""
    from kafka import KafkaProducer

    if partitions < 1 or count < 0:
        raise ValueError(f"fill_kafka: partitions must be >= 1 and count >= 0, got "
                         f"{partitions} and {count}")
    gen = NexmarkGenerator(config)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                             batch_size=1 << 18, acks="all")
    try:
        for lo in range(0, count, chunk):
            numbers = np.arange(lo, min(count, lo + chunk), dtype=np.int64)
            for n, e in zip(numbers.tolist(), gen.rows(numbers)):
                producer.send(topic, json.dumps(e).encode(), partition=n % partitions,
                              timestamp_ms=e["date_time"])
        producer.flush()
    finally:
        producer.close()
