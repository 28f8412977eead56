"""Shared fixtures: one local Ray instance per test session, and the embedded Kafka broker."""

from __future__ import annotations

import os

import pytest

from rayflow._raycontext import ensure_ray

# The Ray instances the tests start (this session's, and those of the programs they run:
# the docs' examples, submitted jobs) run their workers at the tests' own priority. At Ray's
# default (nice 15) a test's actors got about 3% of a core beside the other test process's
# work: a chaos test that takes 10 s alone took up to 165 s in the suite.
os.environ.setdefault("RAY_worker_niceness", "0")

# Logical CPUs for the test Ray instance. The machine has 2 cores; MPI-stage gangs ask for
# 1 CPU per rank and streaming actors for 0, so 8 logical CPUs let a 4-rank gang and a
# second (recovery) gang coexist without oversubscribing real work in the tests.
TEST_NUM_CPUS = 8


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    """``@pytest.mark.slow_with(gang="gloo")``: the variants with those parameters are slow
    (their siblings stay in the quick suite)."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for mark in item.iter_markers("slow_with"):
            if all(params.get(k, object()) == v for k, v in mark.kwargs.items()):
                item.add_marker(pytest.mark.slow)


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
