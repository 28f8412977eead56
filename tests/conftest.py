"""Shared fixtures: one local Ray instance per test session, and the embedded Kafka broker."""

from __future__ import annotations

import pytest

from rayflow._raycontext import ensure_ray

# Logical CPUs for the test Ray instance. The machine has 2 cores; MPI-stage gangs ask for
# 1 CPU per rank and streaming actors for 0, so 8 logical CPUs let a 4-rank gang and a
# second (recovery) gang coexist without oversubscribing real work in the tests.
TEST_NUM_CPUS = 8


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray (``address="local"``), shut down at the end of the session."""
    ray = ensure_ray(None, num_cpus=TEST_NUM_CPUS, include_dashboard=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def kafka_broker():
    """The embedded Tansu broker on a free loopback port, for the whole session."""
    from rayflow.connectors.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture
def new_topic(kafka_broker):
    """Factory: ``new_topic(partitions=1) -> name`` creates a uniquely named topic."""
    import uuid

    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin.create_topics([NewTopic(name, partitions, 1)])
        return name

    yield make
    admin.close()
