"""Kafka source and sink, with confluent-kafka (librdkafka, the default) or kafka-python.

Partitions are assigned explicitly (no consumer-group rebalancing): the partitions of all
the source's topics, in (topic, partition) order, are dealt round-robin over the instances,
so the assignment is deterministic and checkpointed offsets map back to the same instance.

    src = KafkaSource("words", bootstrap="127.0.0.1:9092", start="earliest", bounded=True)
    sink = KafkaSink("counts", bootstrap="127.0.0.1:9092")

Security settings (``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``, ...) go
in ``options`` (or the job's ``kafka.options``), in Kafka's dotted names or kafka-python's;
:mod:`~rayflow.connectors.kafka.options` translates them for the connector's client.

The package by concern: :mod:`~rayflow.connectors.kafka.clients` (the client adapters),
:mod:`~rayflow.connectors.kafka.source`, :mod:`~rayflow.connectors.kafka.sink` with its
:mod:`~rayflow.connectors.kafka.writer` and the exactly-once
:mod:`~rayflow.connectors.kafka.transactional` writer, and
:mod:`~rayflow.connectors.kafka.admin` (topics for jobs, tests and benchmarks). The embedded
broker is :mod:`rayflow.connectors.broker`.
"""

from rayflow.connectors.kafka.admin import count_records, create_topic, produce, read_values
from rayflow.connectors.kafka.clients import Client, Start, connection_options, default_bootstrap
from rayflow.connectors.kafka.sink import KafkaSink
from rayflow.connectors.kafka.source import KafkaMessage, KafkaSource
from rayflow.connectors.kafka.transactional import EPOCH_HEADER

__all__ = [
    "EPOCH_HEADER", "Client", "KafkaMessage", "KafkaSink", "KafkaSource", "Start",
    "connection_options", "count_records", "create_topic", "default_bootstrap", "produce",
    "read_values",
]
