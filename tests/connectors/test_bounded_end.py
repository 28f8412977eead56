"""A bounded Kafka source reads to the true end of each partition, also when the broker
reports a short end (Tansu, the embedded broker: the last record batch's base offset + 1)
and the fetch that finds the true end is slower than the polls that wait for it, as on a
loaded machine."""

import pytest

from rayflow.connectors.kafka import KafkaSource, clients, produce
from rayflow.core.operators import StepContext


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
        got = []
        for _ in range(50):
            batch = reader.poll(1000, 0.2)
            if batch is not None:
                got.extend(batch[0])
            if reader.exhausted:
                break
        assert sorted(got) == sorted(b"v%d" % i for i in range(30))
    finally:
        reader.close()
