"""``read_values`` reads every partition to its end, committed transactions only under
``read_committed``: an open transaction neither shows nor holds the read up. (Aborted ones
are not checked: Tansu, the embedded broker, shows them to ``read_committed`` too.)"""

import time
from collections import Counter

from confluent_kafka import Producer

from rayflow.connectors.kafka import produce, read_values


def _txn_producer(bootstrap, tid):
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    p.init_transactions(20)
    return p


def test_reads_every_partition_to_its_end_committed_only(kafka_broker, new_topic):
    bs = kafka_broker.bootstrap
    topic = new_topic(3)
    plain = [b"p%d" % i for i in range(30)]
    produce(bs, topic, plain)
    done = _txn_producer(bs, f"rv-done-{time.time_ns()}")
    done.begin_transaction()
    for i in range(60):
        done.produce(topic, b"c%d" % i, partition=i % 3)
    done.commit_transaction(20)
    still_open = _txn_producer(bs, f"rv-open-{time.time_ns()}")
    still_open.begin_transaction()
    for i in range(12):
        still_open.produce(topic, b"o%d" % i, partition=i % 3)
    still_open.flush(20)  # written, not committed
    committed = [b"c%d" % i for i in range(60)]
    t0 = time.monotonic()
    got = read_values(bs, topic, "read_committed", timeout_s=20)
    assert time.monotonic() - t0 < 10  # the open transaction did not hold the read up
    assert Counter(got) == Counter(plain + committed)
    uncommitted = read_values(bs, topic, "read_uncommitted", timeout_s=20)
    assert Counter(uncommitted) == Counter(
        plain + committed + [b"o%d" % i for i in range(12)])
    still_open.abort_transaction(20)


def test_an_empty_topic_reads_nothing_at_once(kafka_broker, new_topic):
    t0 = time.monotonic()
    assert read_values(kafka_broker.bootstrap, new_topic(2)) == []
    assert time.monotonic() - t0 < 5
