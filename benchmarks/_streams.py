"""One measurement for every system in the Kafka stream benchmarks (W2 identity, W4 word count).

Every system (rayflow, a plain loop with the same client, the optional peers) reads the same
pre-filled input topic and writes records that carry their own stamps: inTime taken when the
record (or its batch) was consumed, outTime taken just before it was handed to the producer.
The figures are computed the same way for all of them, from the output topic read back:

- ``rec_s``: input records / (last outTime - first inTime), from the stamps;
- ``delivered_rec_s``: input records / (the time the system's final flush or commit
  returned - first inTime): the records are in Kafka, visible to a ``read_committed``
  consumer;
- ``startup_s``: first inTime - the time the system was launched (reported apart).

The plain loops run in a fresh process of their own (:func:`run_plain`), as rayflow's step
actors and the peers do: in the benchmark's driver, whose heap holds the input data and
every round's read-back records, the W4 loop slowed round after round (29.2k -> 23.8k ->
22.7k sentences/s in three rounds).

Systems run in interleaved rounds (A B C A B C ...), each round on fresh output topics, and
each figure is reported as the median with the min-max over the rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

# the clients' settings, as rayflow's Kafka connectors set them
# (rayflow/connectors/kafka/clients.py): the plain loops use the peers' copy, which
# tests/test_peers_stream.py checks against rayflow's
from peers_stream import CONSUMER_CONF as CONFLUENT_CONSUMER
from peers_stream import POLL_RECORDS as BATCH
from peers_stream import PRODUCER_CONF as CONFLUENT_PRODUCER

KP_CONSUMER = dict(enable_auto_commit=False, auto_offset_reset="earliest",
                   fetch_max_bytes=64 * 2**20, max_partition_fetch_bytes=16 * 2**20,
                   fetch_min_bytes=1, fetch_max_wait_ms=5, max_poll_records=100_000)
KP_PRODUCER = dict(linger_ms=5, batch_size=1 << 20, max_request_size=8 << 20, acks=1)


def new_topic(bs: str, prefix: str, partitions: int = 1) -> str:
    """A fresh topic ``prefix-<ns>`` (every round writes its own)."""
    from rayflow.connectors.kafka import create_topic

    t = f"{prefix}-{time.time_ns()}"
    create_topic(bs, t, partitions)
    return t


def installed_peers() -> list[str]:
    """The stream peers (Bytewax, Pathway) importable here."""
    from peers_stream import AVAILABLE

    return [p for p, ok in AVAILABLE.items() if ok]


def read_back(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed record of ``topic`` (all partitions), read with confluent-kafka
    (``read_committed``) until nothing more comes for a second (the embedded broker's end
    offsets can stop short of a topic's last record batch, so they are not trusted)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"readback-{time.time_ns()}",
                  "isolation.level": "read_committed", **CONFLUENT_CONSUMER})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[bytes] = []
        idle, deadline = 0, time.monotonic() + 300
        while idle < 3 and time.monotonic() < deadline:
            got = [m.value() for m in c.consume(50_000, 0.35) if not m.error()]
            idle = 0 if got else idle + 1
            out.extend(got)
        return out
    finally:
        c.close()


def identity_stamps(records: list[bytes]) -> tuple[float, float]:
    """(first inTime, last outTime) in seconds, from ``msgId,eventTime,inTime,outTime`` (ms)."""
    first, last = float("inf"), float("-inf")
    for r in records:
        _, _, t_in, t_out = r.split(b",")
        first = min(first, int(t_in))
        last = max(last, int(t_out))
    return first / 1000.0, last / 1000.0


def wordcount_stamps(records: list[bytes]) -> tuple[float, float]:
    """(first inTime, last outTime) in seconds, from the word-count windows' JSON."""
    first, last = float("inf"), float("-inf")
    for r in records:
        w = json.loads(r)
        first = min(first, w["minInTime"])
        last = max(last, w["outTime"])
    return first, last


def figures(n: int, records: list[bytes], stamps: Callable[[list[bytes]], tuple[float, float]],
            t_launch: float, t_done: float) -> dict[str, Any]:
    """The same figures for any system, from its output read back and two wall times."""
    if not records:
        return {"rec_s": None, "delivered_rec_s": None, "startup_s": None, "out_records": 0}
    first_in, last_out = stamps(records)
    return {"rec_s": round(n / (last_out - first_in)) if last_out > first_in else None,
            "delivered_rec_s": round(n / (t_done - first_in)) if t_done > first_in else None,
            "startup_s": round(first_in - t_launch, 3), "out_records": len(records),
            "span_s": round(last_out - first_in, 3), "delivered_s": round(t_done - first_in, 3)}


def summary(values: list[float | None]) -> dict[str, Any]:
    """Median and min-max of a figure over the rounds (rounds without a figure left out)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "rounds": 0}
    return {"median": round(statistics.median(vals), 3), "min": round(min(vals), 3),
            "max": round(max(vals), 3), "rounds": len(vals)}


def interleaved(systems: dict[str, Callable[[int], dict[str, Any]]], rounds: int,
                log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Run every system once per round, in the same order each round (A B C A B C ...).
    Each callable gets the round number and returns its figures; the result holds, per
    system, every round's figures and the median/min-max of each numeric one."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for k in range(rounds):
        for name, fn in systems.items():
            fig = fn(k)
            runs[name].append(fig)
            log(f"  round {k + 1}/{rounds} {name}: " + ", ".join(
                f"{key}={fig.get(key)}" for key in ("rec_s", "delivered_rec_s", "startup_s")))
    out: dict[str, dict[str, Any]] = {}
    for name, figs in runs.items():
        keys = [k for k in figs[0] if isinstance(figs[0][k], (int, float))
                and not isinstance(figs[0][k], bool)]
        out[name] = {"rounds": figs, **{k: summary([f.get(k) for f in figs]) for k in keys}}
    return out


def median_ratio(a: dict[str, Any], b: dict[str, Any], key: str = "rec_s") -> float | None:
    """median(a) / median(b) of one figure (rayflow over a baseline: higher is better)."""
    x, y = a.get(key, {}).get("median"), b.get(key, {}).get("median")
    return round(x / y, 3) if x and y else None


# -- the plain loops: one process, the same client and settings as rayflow's connectors ------

def _consumer(client: str, bootstrap: str, topic: str):
    if client == "confluent":
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"plain-{time.time_ns()}",
                      **CONFLUENT_CONSUMER})
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])

        def poll() -> list[bytes]:
            return [m.value() for m in c.consume(BATCH, 0.1) if not m.error()]
        return poll, c.close
    from kafka import KafkaConsumer, TopicPartition

    kc = KafkaConsumer(bootstrap_servers=bootstrap, **KP_CONSUMER)
    kc.assign([TopicPartition(topic, p) for p in kc.partitions_for_topic(topic)])
    kc.seek_to_beginning()

    def kpoll() -> list[bytes]:
        return [r.value for recs in kc.poll(100, max_records=BATCH).values() for r in recs]
    return kpoll, kc.close


def _producer(client: str, bootstrap: str, topic: str):
    if client == "confluent":
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": bootstrap, **CONFLUENT_PRODUCER})
        produce, poll = p.produce, p.poll

        def send_many(values: list[bytes]) -> None:
            for v in values:
                while True:
                    try:
                        produce(topic, v)
                        break
                    except BufferError:
                        poll(0.05)
            poll(0)
        return send_many, p.flush
    from kafka import KafkaProducer

    kp = KafkaProducer(bootstrap_servers=bootstrap, **KP_PRODUCER)

    def kp_send_many(values: list[bytes]) -> None:
        for v in values:
            kp.send(topic, v)

    def kp_flush() -> None:
        kp.flush()
        kp.close()
    return kp_send_many, kp_flush


def plain_identity(client: str, bootstrap: str, topic_in: str, topic_out: str, n: int) -> float:
    """consume -> stamp -> produce in one process; returns the time its final flush returned.
    inTime is taken per consumed batch, outTime per record as it is handed to the producer."""
    poll, close = _consumer(client, bootstrap, topic_in)
    send_many, flush = _producer(client, bootstrap, topic_out)
    done = 0
    while done < n:
        batch = poll()
        t_in = int(time.time() * 1000)
        send_many([b"%s,%d,%d" % (r, t_in, time.time() * 1000) for r in batch])
        done += len(batch)
    flush()
    t_done = time.time()
    close()
    return t_done


def _window_json(word: str, seq: dict[str, int], acc: list) -> bytes:
    """One closed window as rayflow's word count writes it (``examples.wordcount.to_json``)."""
    k = seq[word]
    seq[word] = k + 1
    text = word if word.isalnum() else json.dumps(word)[1:-1]  # valid JSON for any word
    return (f'{{"word": "{text}", "window": {k}, "count": {acc[0]}, '
            f'"minEventTime": {acc[1]}, "maxEventTime": {acc[2]}, '
            f'"minInTime": {acc[3]}, "maxInTime": {acc[4]}, '
            f'"outTime": {time.time()}}}').encode()


def plain_wordcount(client: str, bootstrap: str, topic_in: str, topic_out: str, n: int,
                    window: int = 10) -> float:
    """consume -> parse -> count windows of ``window`` per word -> produce, in one process,
    with the output records of rayflow's word count; returns when its final flush returned.
    Malformed records are counted and skipped."""
    poll, close = _consumer(client, bootstrap, topic_in)
    send_many, flush = _producer(client, bootstrap, topic_out)
    open_: dict[str, list] = {}
    seq: dict[str, int] = defaultdict(int)
    done = bad = 0
    while done < n:
        batch = poll()
        t_in = time.time()
        out = []
        for rec in batch:
            try:
                msg = json.loads(rec)
                ev = float(msg["eventTime"])
                words = str(msg["sentence"]).split()
            except (ValueError, KeyError, TypeError):
                bad += 1
                continue
            for word in words:
                acc = open_.get(word)
                if acc is None:
                    acc = open_[word] = [0, ev, ev, t_in, t_in]
                acc[0] += 1
                if ev < acc[1]:
                    acc[1] = ev
                if ev > acc[2]:
                    acc[2] = ev
                acc[4] = t_in
                if acc[0] == window:
                    del open_[word]
                    out.append(_window_json(word, seq, acc))
        send_many(out)
        done += len(batch)
    # as rayflow's count window: the open windows close at the end of the input
    send_many([_window_json(word, seq, acc) for word, acc in open_.items()])
    flush()
    t_done = time.time()
    close()
    return t_done


PLAIN = {"identity": plain_identity, "wordcount": plain_wordcount}


def run_plain(workload: str, client: str, bootstrap: str, topic_in: str, topic_out: str,
              n: int, timeout_s: float = 300) -> float:
    """:func:`plain_identity` or :func:`plain_wordcount` in a fresh Python process (this
    file run as a script); returns the time its final flush returned."""
    if workload not in PLAIN:
        raise ValueError(f"run_plain: workload is one of {sorted(PLAIN)}, got {workload!r}")
    cmd = [sys.executable, os.path.abspath(__file__), workload, client, bootstrap,
           topic_in, topic_out, str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"plain {workload} loop failed (exit {out.returncode}): "
                           f"{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # python _streams.py wordcount|identity CLIENT BS IN OUT N
    workload_, client_, bs_, t_in, t_out, n_ = sys.argv[1:7]
    print(PLAIN[workload_](client_, bs_, t_in, t_out, int(n_)))
