"""The exactly-once Kafka sink's writer on the embedded broker: each epoch pickled once, a
bounded backlog of uncommitted records (writes wait for a running commit), restores."""

import pickle
import threading
import time

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition

import rayflow as rf
from rayflow.connectors.kafka.transactional import (
    EPOCH_HEADER,
    PackedEpoch,
    TransactionalState,
    pack_epoch,
    unpack_epoch,
)
from rayflow.core.operators import StepContext


def _committed(bootstrap, topic, expect, timeout_s=20):
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      auto_offset_reset="earliest", isolation_level="read_committed")
    c.assign([TopicPartition(topic, 0)])
    got, deadline = [], time.time() + timeout_s
    while len(got) < expect and time.time() < deadline:
        for recs in c.poll(200).values():
            got.extend((r.value, dict(r.headers)[EPOCH_HEADER]) for r in recs)
    got.extend((r.value, dict(r.headers)[EPOCH_HEADER])  # nothing more may come
               for recs in c.poll(500).values() for r in recs)
    c.close()
    return got


class _GatedCommits:
    """The real commit process, whose transactions wait for ``gate`` (a slow broker)."""

    def __init__(self, committer):
        self.inner, self.gate, self.started = committer, threading.Event(), threading.Event()

    def transaction(self, *args):
        self.started.set()
        assert self.gate.wait(30)
        return self.inner.transaction(*args)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _writer(kafka_broker, topic, resume=None, **kw):
    sink = rf.KafkaSink(topic, bootstrap=kafka_broker.bootstrap, **kw)
    ctx = StepContext("out", 0, 1, "txn-test", guarantee="exactly_once", run_id="r1")
    return sink.build(ctx, resume)


def _batch(epoch, n):
    return [f"e{epoch}-{i:04d}".encode() for i in range(n)]


def test_an_epoch_is_packed_once_and_its_size_is_what_the_checkpoint_added(
        kafka_broker, new_topic):
    """An epoch's records go into the checkpoint as numpy arrays (sent out of band, with no
    record pickled), packed once: a later checkpoint carries the same object."""
    topic = new_topic(1)
    w = _writer(kafka_broker, topic)
    try:
        w.write(_batch(1, 100), None, 0.0)
        first = w.snapshot(1)
        assert isinstance(first, TransactionalState)
        epoch = first.pending[1]["parts"]
        assert isinstance(epoch, PackedEpoch)
        assert all(isinstance(a, np.ndarray) for v, _ in epoch.batches for a in v)
        assert first.checkpoint_bytes == epoch.nbytes == 100 * 7 + 100 * 8  # values, lengths
        assert unpack_epoch(epoch) == [(_batch(1, 100), None)]
        # as the checkpoint store keeps it
        assert unpack_epoch(pickle.loads(pickle.dumps(first)).pending[1]["parts"]) == \
            [(_batch(1, 100), None)]
        w.write(_batch(2, 50), None, 0.0)
        second = w.snapshot(2)  # epoch 1 not committed yet: carried, the same object
        assert second.pending[1]["parts"] is epoch
        assert second.checkpoint_bytes == second.pending[2]["parts"].nbytes
        assert w.snapshot(3).checkpoint_bytes == 0  # nothing new
        assert w.uncommitted_bytes() == epoch.nbytes + second.checkpoint_bytes
        w.commit(2)
        assert w.pending == {} and w.uncommitted_bytes() == 0
        got = _committed(kafka_broker.bootstrap, topic, 150)
        assert [v for v, _ in got] == _batch(1, 100) + _batch(2, 50)
        assert len({t for _, t in got}) == 150  # each record named once
    finally:
        w.close()


def test_writes_wait_for_a_running_commit_past_max_uncommitted_bytes(kafka_broker, new_topic):
    topic = new_topic(1)
    w = _writer(kafka_broker, topic, max_uncommitted_bytes=1000)
    w.p = gated = _GatedCommits(w.p)
    try:
        w.write(_batch(1, 200), None, 0.0)  # 1,800 bytes: over the bound, but no commit runs
        w.snapshot(1)
        assert w.uncommitted_bytes() > 1000
        committer = threading.Thread(target=w.commit, args=(1,))
        committer.start()
        assert gated.started.wait(20)
        writer = threading.Thread(target=w.write, args=(_batch(2, 10), None, 0.0))
        writer.start()
        writer.join(0.5)
        assert writer.is_alive(), "a write past the bound went on while the commit ran"
        assert w.buffer == []
        gated.gate.set()
        committer.join(20)
        writer.join(20)
        assert not writer.is_alive() and w.waited_s > 0
        assert w.buffer == [(_batch(2, 10), None)] and list(w.pending) == []
        w.snapshot(2)
        w.commit(2)
        got = [v for v, _ in _committed(kafka_broker.bootstrap, topic, 210)]
        assert got == _batch(1, 200) + _batch(2, 10)
    finally:
        gated.gate.set()
        w.close()


def test_without_a_running_commit_writes_past_the_bound_go_on(kafka_broker, new_topic):
    """The bound never blocks when no commit is under way: the epochs may belong to a
    checkpoint that was aborted, committed only once a later barrier passes this task."""
    topic = new_topic(1)
    w = _writer(kafka_broker, topic, max_uncommitted_bytes=100)
    try:
        for epoch in (1, 2, 3):
            w.write(_batch(epoch, 100), None, 0.0)
            w.snapshot(epoch)
        w.write(_batch(4, 100), None, 0.0)
        assert w.waited_s == 0.0 and w.uncommitted_bytes() > 100
    finally:
        w.close()


def test_a_restored_writer_commits_its_pickled_epochs_once(kafka_broker, new_topic):
    topic = new_topic(1)
    w = _writer(kafka_broker, topic)
    w.write(_batch(1, 30), None, 0.0)
    state = w.snapshot(1)
    w.commit(1)  # committed, but the checkpoint a restore reads still lists the epoch
    w.write(_batch(2, 20), None, 0.0)
    state = w.snapshot(2)  # holds epoch 2 only
    w.close()  # dies before committing epoch 2
    restored = _writer(kafka_broker, topic, TransactionalState(
        state.run, {**state.pending, 1: {"parts": pickle.dumps([(_batch(1, 30), None)]),
                                         "low": {0: 0}}}))
    try:
        assert restored.pending == {}
        got = [v for v, _ in _committed(kafka_broker.bootstrap, topic, 50)]
        assert got == _batch(1, 30) + _batch(2, 20)
    finally:
        restored.close()


def test_a_checkpoint_of_the_earlier_format_still_restores(kafka_broker, new_topic):
    """Checkpoints written before epochs were pickled hold a dict with the record lists."""
    topic = new_topic(1)
    old = {"run": "r0", "pending": {4: {"parts": [(_batch(4, 12), None)], "low": {0: 0}}}}
    restored = _writer(kafka_broker, topic, old)
    try:
        assert restored.run == "r0" and restored.pending == {}
        assert [v for v, _ in _committed(kafka_broker.bootstrap, topic, 12)] == _batch(4, 12)
    finally:
        restored.close()


def test_an_epoch_packs_and_unpacks_to_the_records_it_held():
    """Bytes values and keys go as one joined array each; str values, None keys and empty
    batches come back as they were; the blobs of the earlier formats (packed batches
    pickled, as bytes or in an array; the lists pickled) unpack too."""
    from array import array

    parts = [(_batch(1, 5), [b"k%d" % i for i in range(5)]), ([], None),
             (["text", "more"], [None, b"k"]), ([b"", b"x" * 70_000], None)]
    assert unpack_epoch(pack_epoch(parts)) == parts
    assert unpack_epoch(pickle.loads(pickle.dumps(pack_epoch(parts)))) == parts
    assert pack_epoch(parts).nbytes == (35 + 5 * 8) + (10 + 5 * 8) + 0 + 8 + 1 + \
        (70_000 + 2 * 8)  # str values and keys with None: their lengths

    def earlier(items):
        try:
            return b"".join(items), array("q", map(len, items))
        except TypeError:
            return items

    blob = pickle.dumps([(earlier(v), None if k is None else earlier(k)) for v, k in parts])
    assert unpack_epoch(blob) == parts
    assert unpack_epoch(np.frombuffer(blob, dtype=np.uint8)) == parts
    assert unpack_epoch(pickle.dumps(parts)) == parts


def test_max_uncommitted_bytes_must_be_positive():
    with pytest.raises(ValueError, match="max_uncommitted_bytes must be > 0"):
        rf.KafkaSink("t", max_uncommitted_bytes=0)


def test_a_commit_sends_the_records_it_holds_with_their_keys_and_tags(kafka_broker, new_topic,
                                                                      monkeypatch):
    """A live writer commits the records it holds as written, not an unpickled copy of its
    checkpoint, with each record's key and a tag ``writer:epoch:seq`` counted per epoch."""
    topic = new_topic(1)
    w = _writer(kafka_broker, topic, key=lambda v: v[:2])
    try:
        w.write(_batch(1, 5), None, 0.0)
        w.write(_batch(1, 3), None, 0.0)
        w.snapshot(7)
        import rayflow.connectors.kafka.transactional as txn

        def no_loads(_blob):
            raise AssertionError("a live writer unpickled its own epoch")

        monkeypatch.setattr(txn.pickle, "loads", no_loads)
        w.commit(7)
        monkeypatch.undo()
        c = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False,
                          auto_offset_reset="earliest", isolation_level="read_committed")
        c.assign([TopicPartition(topic, 0)])
        got, deadline = [], time.time() + 20
        while len(got) < 8 and time.time() < deadline:
            got.extend(r for recs in c.poll(200).values() for r in recs)
        c.close()
        assert [(r.key, r.value) for r in got] == [(v[:2], v) for v in
                                                   _batch(1, 5) + _batch(1, 3)]
        assert [dict(r.headers)[EPOCH_HEADER] for r in got] == [
            f"{w.writer}:7:{i}".encode() for i in range(8)]
    finally:
        w.close()


def test_a_full_producer_queue_resumes_at_the_record_it_refused(kafka_broker, new_topic):
    """confluent-kafka raises BufferError when its local queue is full: the send waits for
    deliveries and goes on from the refused record, so none is lost or sent twice."""
    from rayflow.connectors.kafka.clients import _ConfluentProducer

    topic = new_topic(1)
    p = _ConfluentProducer(kafka_broker.bootstrap, {"queue.buffering.max.messages": 7})
    values = [b"%04d" % i for i in range(200)]
    p.send_many(topic, values, None, ("h", values))
    p.send_many(topic, values[:50], [b"k"] * 50)
    p.close()
    c = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    c.assign([TopicPartition(topic, 0)])
    got, deadline = [], time.time() + 20
    while len(got) < 250 and time.time() < deadline:
        got.extend(r for recs in c.poll(200).values() for r in recs)
    c.close()
    assert [r.value for r in got] == values + values[:50]
    assert [dict(r.headers)["h"] for r in got[:200]] == values
    assert [r.key for r in got[200:]] == [b"k"] * 50


# -- commits one at a time on Tansu --------------------------------------------------------

def test_commits_are_serialized_on_tansu_and_not_elsewhere():
    from rayflow.connectors.kafka.transactional import serializes_commits

    assert serializes_commits("tansu_cluster", None)  # Tansu's default cluster id
    assert serializes_commits("Tansu-prod", None)
    assert not serializes_commits("MkU3OEVBNTcwNTJENDM2Qk", None)  # an Apache Kafka id
    assert not serializes_commits(None, None)
    assert serializes_commits("MkU3OEVBNTcwNTJENDM2Qk", True)  # the setting wins
    assert not serializes_commits("tansu_cluster", False)


def test_serialize_commits_takes_only_none_or_a_bool():
    with pytest.raises(ValueError, match="serialize_commits must be None, True or False"):
        rf.KafkaSink("t", serialize_commits="yes")
    with pytest.raises(ValueError, match="serialize_commits must be None, True or False"):
        rf.KafkaSink("t", serialize_commits=1)


def _sink_instance(kafka_broker, topic, i, n, **kw):
    sink = rf.KafkaSink(topic, bootstrap=kafka_broker.bootstrap, **kw)
    ctx = StepContext("out", i, n, f"serial-{topic}", guarantee="exactly_once", run_id="r1")
    return sink.build(ctx, None)


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_on_the_embedded_broker_a_commit_waits_for_the_turn_of_another(kafka_broker,
                                                                      new_topic, client):
    """Another instance holds the turn (here, the test): a commit waits for it, then goes."""
    from rayflow.connectors.kafka.transactional import commit_lock

    topic = new_topic(1)
    w = _sink_instance(kafka_broker, topic, 0, 1, client=client)
    try:
        w.write(_batch(1, 10), None, 0.0)
        w.snapshot(1)
        done = threading.Event()
        with commit_lock(kafka_broker.bootstrap):
            t = threading.Thread(target=lambda: (w.commit(1), done.set()), daemon=True)
            t.start()
            assert not done.wait(1.0), "the commit did not wait for its turn"
        assert done.wait(30)
        assert sorted(v for v, _ in _committed(kafka_broker.bootstrap, topic, 10)) == \
            _batch(1, 10)
    finally:
        w.close()


def test_serialize_commits_false_does_not_take_turns(kafka_broker, new_topic):
    from rayflow.connectors.kafka.transactional import commit_lock

    topic = new_topic(1)
    w = _sink_instance(kafka_broker, topic, 0, 1, serialize_commits=False)
    try:
        w.write(_batch(1, 10), None, 0.0)
        w.snapshot(1)
        with commit_lock(kafka_broker.bootstrap):
            w.commit(1)  # would wait SERIAL_COMMIT_TIMEOUT_S for the turn, then fail
        assert len(_committed(kafka_broker.bootstrap, topic, 10)) == 10
    finally:
        w.close()


def test_concurrent_instances_commit_every_record_once(kafka_broker, new_topic):
    """Six instances commit three epochs each at once into two shared partitions: each
    record is visible once under read_committed. (On the embedded broker, transactions that
    overlapped lost or hid records in about one such round in ten.)"""
    from rayflow.connectors.kafka import read_values

    for _ in range(6):
        topic = new_topic(2)
        writers = [_sink_instance(kafka_broker, topic, i, 6) for i in range(6)]
        start = threading.Barrier(6)
        errors = []

        def run(i, w, start=start, errors=errors):
            try:
                start.wait()
                for epoch in (1, 2, 3):
                    w.write([f"{i}:{epoch}:{k}".encode() for k in range(150)], None, 0.0)
                    w.snapshot(epoch)
                    w.commit(epoch)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate(writers)]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
        [w.close() for w in writers]
        assert not errors, errors
        got = sorted(read_values(kafka_broker.bootstrap, topic, "read_committed"))
        assert got == sorted(f"{i}:{e}:{k}".encode() for i in range(6) for e in (1, 2, 3)
                             for k in range(150))


# -- the commit process ----------------------------------------------------------------------

def test_a_commit_runs_in_a_process_of_its_own_and_one_that_died_is_replaced(kafka_broker,
                                                                            new_topic):
    """The transactions run in a child process. One that dies (here killed between two
    commits, so its death shows at the next) is replaced at that commit: the new one
    fences the instance's transactional id and writes each record once."""
    import os

    topic = new_topic(1)
    w = _writer(kafka_broker, topic)
    try:
        first = w.p
        first.ready()
        assert first.proc.pid != os.getpid() and first.proc.poll() is None
        w.write(_batch(1, 40), None, 0.0)
        w.snapshot(1)
        w.commit(1)
        w.write(_batch(2, 30), None, 0.0)
        w.snapshot(2)
        first.kill()
        w.commit(2)
        assert w.p is not first and w.p.proc.poll() is None and w.pending == {}
        w.write(_batch(3, 20), None, 0.0)
        w.snapshot(3)
        w.commit(3)
        got = [v for v, _ in _committed(kafka_broker.bootstrap, topic, 90)]
        assert got == _batch(1, 40) + _batch(2, 30) + _batch(3, 20)
    finally:
        w.close()
    assert w.p.proc.poll() is not None  # closed: the process has ended


def test_the_commit_process_ends_with_the_sink_process_however_it_dies(kafka_broker,
                                                                       new_topic, tmp_path):
    """A sink's process killed outright (as Ray kills an actor) leaves no commit process
    behind: the child sees its end of the socket close, and exits."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    topic = new_topic(1)
    script = tmp_path / "sink.py"
    script.write_text(
        "import sys, time\n"
        "import rayflow as rf\n"
        "from rayflow.core.operators import StepContext\n"
        f"sink = rf.KafkaSink({topic!r}, bootstrap={kafka_broker.bootstrap!r})\n"
        "ctx = StepContext('out', 0, 1, 'orphan-test', guarantee='exactly_once', run_id='r1')\n"
        "w = sink.build(ctx, None)\n"
        "w.p.ready()\n"
        "print(w.p.proc.pid, flush=True)\n"
        "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(proc.stdout.readline()))
        assert child.is_running() and child.ppid() == proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        child.wait(10)  # raises TimeoutExpired if the child outlived its parent
    finally:
        proc.kill()


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_a_bounded_source_reads_to_the_end_of_what_an_exactly_once_job_wrote(
        ray_session, kafka_broker, new_topic, client):
    """Each transaction ends with a commit marker, an offset that no consumer returns: a
    bounded read of such a topic takes the consumer's position past it and ends. Before,
    it waited for the offset after the last record for ever (the job never ended)."""
    if client == "confluent":
        pytest.importorskip("confluent_kafka")
    bs, topic = kafka_broker.bootstrap, new_topic(2)
    w = rf.Dataflow("eo-write")
    (w.source("in", rf.GeneratorSource(lambda i: str(i).encode(), count=400, rate=400))
      .sink("out", rf.KafkaSink(topic, bootstrap=bs, key=lambda v: v)))
    w.run(timeout_s=120, checkpoint={"interval_s": 0.2, "processing_guarantee": "exactly_once"})
    r = rf.Dataflow("bounded-read")
    (r.source("in", rf.KafkaSource(topic, bootstrap=bs, bounded=True, client=client),
              parallelism=2)
      .sink("out", rf.CollectSink()))
    got = r.run(timeout_s=60).collect("out")
    assert sorted(int(v) for v in got) == list(range(400))


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_restores_read_back_takes_every_record_and_skips_an_empty_partition(
        kafka_broker, new_topic, client):
    """What a restored exactly-once writer reads back to find what is already there: every
    header past the start, on a topic with one partition written and one empty. The empty
    one is not read at all. Before, its position never came to its end, and every such
    read waited for 20 empty polls (6 s) and then ended however far it had got."""
    from rayflow.connectors.kafka.clients import (
        _READ_COMMITTED,
        _ConfluentConsumer,
        _KPConsumer,
    )
    from rayflow.connectors.kafka.committer import EPOCH_HEADER

    bs, topic = kafka_broker.bootstrap, new_topic(2)
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bs)
    tags = [b"w:1:%d" % i for i in range(300)]
    for tag in tags:
        producer.send(topic, b"v", partition=0, headers=[(EPOCH_HEADER, tag)])
    producer.flush()
    producer.close()
    scan = (_ConfluentConsumer if client == "confluent" else _KPConsumer)(
        bs, None, dict(_READ_COMMITTED[client]))
    ends = scan.watermarks(topic, [0, 1])[1]  # (this consumer's: read_committed)
    assert ends[1] == 0 and ends[0] > 0  # (Tansu counts offsets per batch: not 300)
    t0 = time.monotonic()
    got = scan.scan_headers(topic, {0: 0, 1: 0}, EPOCH_HEADER)
    took = time.monotonic() - t0
    scan.close()
    assert sorted(got) == sorted(tags)
    assert took < 5.0, took  # (not 20 empty polls of 0.3 s)


def test_a_restores_read_back_waits_through_a_stalled_broker():
    """A broker that answers nothing for longer than 20 polls, then the records: the read
    back goes on to the end of the topic, and raises if the end never comes. Before, 20
    empty polls ended it with what it had, and the restore wrote again what it had not
    seen: duplicates under exactly-once."""
    from rayflow.connectors.kafka.clients import _ReadBack

    class Stalled(_ReadBack):  # a consumer adapter over a broker that stalls
        def __init__(self, stall_polls, records):
            self.stall, self.records, self.pos = stall_polls, records, -1001

        def partitions(self, topic):
            return {0}

        def watermarks(self, topic, parts):
            return {0: 0}, {0: len(self.records)}

        def assign_tps(self, offsets):
            pass

        def _headers(self, key):
            if self.stall > 0:
                self.stall -= 1
                return None
            got, self.records = self.records, []
            self.pos = 0 if self.pos < 0 else self.pos
            self.pos += len(got)
            return got or None

        def next_offsets(self, topic, parts):
            return {0: self.pos}

        def log_end_offsets(self, topic, parts=None):
            return self.watermarks(topic, parts)[1]

        def cluster_id(self):
            return None

    recs = [b"w:1:%d" % i for i in range(50)]
    assert Stalled(30, list(recs)).scan_headers("t", {0: 0}, "h") == recs
    with pytest.raises(TimeoutError, match="reading topic 't' back"):
        Stalled(10**9, list(recs)).scan_headers("t", {0: 0}, "h", timeout_s=0.2)


def test_a_restores_read_back_waits_for_a_transaction_left_open(kafka_broker, new_topic):
    """The cause of a duplicated epoch after a sink died inside its transaction: the
    other instance committed its epoch after the open transaction, and its restore read
    the topic back before the dead one's successor fenced it. Under read_committed the
    open transaction hides everything after it, and the broker's end under
    read_committed is 0 (Tansu), so the read-back saw nothing, and the restore wrote the
    whole epoch again. The read-back now ends at the end past open transactions, and so
    waits for the fence however long it takes (here 7 s; 20 empty polls, 6 s, ended it
    before), with either client."""
    from confluent_kafka import Producer

    from rayflow.connectors.kafka.clients import (
        _READ_COMMITTED,
        _ConfluentConsumer,
        _KPConsumer,
    )
    from rayflow.testing import leave_transaction_open

    bs, topic = kafka_broker.bootstrap, new_topic(1)
    dead, live_id = f"dead-{topic}", f"live-{topic}"  # (ids of their own: the broker lives on)
    leave_transaction_open(bs, topic, dead)
    live = Producer({"bootstrap.servers": bs, "transactional.id": live_id})
    live.init_transactions(30)
    live.begin_transaction()
    tags = [b"live:1:%d" % i for i in range(7)]
    for tag in tags:
        live.produce(topic, value=b"v", partition=0, headers=[(EPOCH_HEADER, tag)])
    live.commit_transaction(30)

    scans = {c: cls(bs, None, dict(_READ_COMMITTED[c])) for c, cls in
             (("confluent", _ConfluentConsumer), ("kafka-python", _KPConsumer))}
    ends = scans["confluent"]
    assert ends.watermarks(topic, [0])[1] == {0: 0}  # the last stable offset: the open one's start
    assert ends.log_end_offsets(topic)[0] > 0  # past it
    got: dict = {}

    def scan(client):
        got[client] = scans[client].scan_headers(topic, {0: 0}, EPOCH_HEADER)

    threads = [threading.Thread(target=scan, args=(c,)) for c in scans]
    for t in threads:
        t.start()
    time.sleep(7.0)
    assert got == {}  # both wait for the end
    successor = Producer({"bootstrap.servers": bs, "transactional.id": dead})
    successor.init_transactions(30)  # fences (aborts) the dead one's transaction
    for t in threads:
        t.join(30)
    for scan_ in scans.values():
        scan_.close()
    assert {c: sorted(t for t in tags_ if t.startswith(b"live:")) for c, tags_ in got.items()
            } == {"confluent": sorted(tags), "kafka-python": sorted(tags)}
