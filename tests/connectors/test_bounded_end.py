"""A bounded Kafka source reads to the true end of each partition, also when the broker
reports a short end (Tansu, the embedded broker: the last record batch's base offset + 1)
and the fetch that finds the true end is slower than the polls that wait for it, as on a
loaded machine."""

import pytest

from rayflow.connectors.kafka import KafkaSource, clients, produce
from rayflow.core.operators import StepContext


def _read_to_the_end(reader, polls: int) -> list:
    """What a bounded reader gives until it is exhausted (at most ``polls`` polls)."""
    got = []
    for _ in range(polls):
        batch = reader.poll(1000, 0.2)
        if batch is not None:
            got.extend(batch[0])
        if reader.exhausted:
            break
    return got


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_a_slow_fetch_does_not_cut_the_end_short(kafka_broker, new_topic, monkeypatch, client):
    bs = kafka_broker.bootstrap
    topic = new_topic(1)
    produce(bs, topic, [b"v%d" % i for i in range(30)])  # one record batch
    cls = clients._ConfluentConsumer if client == "confluent" else clients._KPConsumer
    real, slow = cls.poll_tps, {"left": 4}

    def poll_tps(self, max_records, timeout_s):  # the first polls come back empty
        if slow["left"]:
            slow["left"] -= 1
            return [], [], {}
        return real(self, max_records, timeout_s)

    monkeypatch.setattr(cls, "poll_tps", poll_tps)
    reader = KafkaSource(topic, bootstrap=bs, bounded=True, client=client).build(
        StepContext("src", 0, 1))
    try:
        assert slow["left"] == 0
        assert reader.end == {(topic, 0): 30}
        got = _read_to_the_end(reader, polls=50)
        assert sorted(got) == sorted(b"v%d" % i for i in range(30))
    finally:
        reader.close()


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_a_bounded_read_says_where_an_open_transaction_stops_it(kafka_broker, new_topic,
                                                                caplog, isolation):
    """A bounded read under read_committed ends where the broker says the committed
    records end: before a transaction still open (Tansu says 0, so none of partition 0's
    committed records are read). It says so, naming the partition; under
    read_uncommitted it reads everything and says nothing."""
    import logging
    import uuid

    from rayflow.testing import leave_transaction_open

    bs, topic = kafka_broker.bootstrap, new_topic(2)
    produce(bs, topic, [b"c%d" % i for i in range(40)], partitions=2)
    leave_transaction_open(bs, topic, f"dead-{uuid.uuid4().hex[:8]}")
    caplog.set_level(logging.WARNING, logger="rayflow.connectors.kafka.source")
    reader = KafkaSource(topic, bootstrap=bs, bounded=True, client="confluent",
                         options={"isolation.level": isolation}).build(StepContext("src", 0, 1))
    try:
        got = _read_to_the_end(reader, polls=100)
    finally:
        reader.close()
    warned = [r.getMessage() for r in caplog.records if "transaction is open" in r.getMessage()]
    if isolation == "read_uncommitted":
        assert warned == []
        assert sorted(got) == sorted([b"c%d" % i for i in range(40)]
                                     + [b"open-%d" % i for i in range(5)])
    else:
        assert sorted(got) == sorted(b"c%d" % i for i in range(1, 40, 2))  # partition 1's
        assert len(warned) == 1 and f"{topic}[0]: stops at 0" in warned[0], warned
        assert f"{topic}[1]" not in warned[0]
