"""The embedded Tansu broker: lifecycle, and the Kafka features rayflow relies on."""

import time

import psutil
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from rayflow._procs import alive
from rayflow.connectors import broker as broker_mod
from rayflow.connectors.broker import BrokerError, EmbeddedBroker


def test_context_manager_starts_answers_and_stops_by_pid():
    with EmbeddedBroker() as b:
        pid = b.pid
        assert psutil.pid_exists(pid)
        broker_mod.wait_until_ready(b.bootstrap, 5)
    assert not alive(pid)


def test_start_fails_clearly_when_port_is_taken(kafka_broker):
    with pytest.raises(BrokerError, match=str(kafka_broker.port)):
        EmbeddedBroker(port=kafka_broker.port, timeout_s=3).start()


def _consume(bootstrap, topic, partitions=1, isolation="read_uncommitted", wait_s=2.0):
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      isolation_level=isolation, auto_offset_reset="earliest")
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
    out, deadline = [], time.time() + wait_s
    while time.time() < deadline:
        for _, recs in c.poll(200).items():
            out.extend(r.value for r in recs)
    c.close()
    return out


def test_idempotent_producer_and_committed_offsets(kafka_broker, new_topic):
    topic = new_topic(2)
    p = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, enable_idempotence=True, acks="all")
    for i in range(100):
        p.send(topic, str(i).encode(), partition=i % 2)
    p.flush()
    assert sorted(int(v) for v in _consume(kafka_broker.bootstrap, topic, 2)) == list(range(100))
    c = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id="g-offsets",
                      enable_auto_commit=False)
    tp = TopicPartition(topic, 1)
    c.commit({tp: OffsetAndMetadata(17, "", -1)})
    assert c.committed(tp) == 17
    c.close()


def test_transactions_hide_open_transactions_from_read_committed(kafka_broker, new_topic):
    topic = new_topic(1)
    p = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, transactional_id=f"tx-{topic}")
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, b"committed")
    p.commit_transaction()
    p.begin_transaction()
    p.send(topic, b"open")
    p.flush()
    assert _consume(kafka_broker.bootstrap, topic, isolation="read_committed") == [b"committed"]
    assert b"open" in _consume(kafka_broker.bootstrap, topic)
    p.commit_transaction()
    assert _consume(kafka_broker.bootstrap, topic, isolation="read_committed") == [
        b"committed", b"open"]


def test_detached_broker_up_status_down(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_mod, "STATE_DIR", tmp_path)
    monkeypatch.setattr(broker_mod, "STATE_FILE", tmp_path / "broker.json")
    st = broker_mod.up()
    try:
        assert st["running"] and broker_mod.status()["bootstrap"] == st["bootstrap"]
        assert broker_mod.up()["pid"] == st["pid"]  # idempotent
    finally:
        broker_mod.down()
    assert broker_mod.status() == {"running": False}
    assert not alive(st["pid"])
