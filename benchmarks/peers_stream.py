"""Bytewax and Pathway as same-run peers of W2 (identity) and W4 (windowed word count).

    from peers_stream import AVAILABLE, run_peer
    res = run_peer("bytewax", "identity", broker.bootstrap, "in", "out", n=200_000)
    rate = n / (res["t_done"] - res["t_launch"])

    python benchmarks/peers_stream.py PEER WORKLOAD BOOTSTRAP TOPIC_IN TOPIC_OUT N   # the child

Each run is a fresh subprocess (its threads, memory and import time are its own) with one
engine worker: Bytewax through ``bytewax.run.cli_main(flow, workers_per_process=1)`` (what
``python -m bytewax.run -w 1`` calls), Pathway with ``PATHWAY_THREADS=1`` and
``PATHWAY_PROCESSES=1`` (what ``pathway spawn -t 1`` sets). It reads the input topic from the
beginning until all ``n`` records are consumed, writes the output topic, flushes and exits,
printing one line ``PEER-RESULT {json}``.

Same data and output format as rayflow's jobs:

- identity: ``msgId,eventTime`` -> ``msgId,eventTime,inTime,outTime`` (ms since the epoch;
  inTime when the record's poll batch was consumed, outTime in the last step before the
  producer, per batch).
- wordcount: JSON ``{"msgId", "eventTime", "sentence"}``; per word a tumbling count window of
  10 occurrences, in input order; each closed window is one JSON record with the fields and
  key order of :func:`rayflow.examples.wordcount.to_json` (times in seconds). A word whose
  last window has fewer than 10 occurrences at the end of input emits nothing for it.
  Malformed records go nowhere and are counted (``"malformed"`` in the result).

Connectors. Bytewax uses its own ``KafkaSource(tail=False)`` (it stops at each partition's
end, which librdkafka takes from fetch responses) and ``KafkaSink``. Pathway writes with its
own ``pw.io.kafka.write``, but its Kafka reader cannot make a bounded run on the embedded
broker: ``mode="static"`` stops at the end offset ListOffsets reports, which Tansu gives as
the last record batch's base offset + 1, so it dropped records (1,992 of 2,000 in one
partition, 993 of 2,000 in three, 19,586 of 20,000), and ``mode="streaming"`` never ends by
itself. So Pathway reads through its documented Python input, a ``pw.io.python.ConnectorSubject``
around the same confluent-kafka consumer, that ends after ``n`` records.

Every client is confluent-kafka (librdkafka) with rayflow's confluent settings
(:data:`CONSUMER_CONF`, :data:`PRODUCER_CONF`, the same as
``rayflow.connectors.kafka.clients``), and every source polls at most :data:`POLL_RECORDS`
records at a time (rayflow's ``stream.batch_size``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PEERS = ("bytewax", "pathway")
WORKLOADS = ("identity", "wordcount")
AVAILABLE: dict[str, bool] = {p: importlib.util.find_spec(p) is not None for p in PEERS}

# rayflow's confluent-kafka consumer and producer settings (clients._ConfluentConsumer and
# _ConfluentProducer, at-least-once): the same clients and settings on every side.
CONSUMER_CONF = {"enable.auto.commit": False, "auto.offset.reset": "earliest",
                 "fetch.wait.max.ms": 5}
PRODUCER_CONF = {"linger.ms": 5, "acks": 1}
POLL_RECORDS = 16384  # rayflow's default stream.batch_size: records per source poll
WINDOW = 10  # occurrences per count window (W4)
# rayflow's W4 limit (rayflow.examples.wordcount.MAX_RECORD_BYTES), kept here so that the
# child imports no rayflow (its import time is the peer's)
MAX_RECORD_BYTES = 10_000
# Pathway: how often the Python input commits what it read into the engine (its default is
# 1500 ms); a minibatch every 100 ms keeps windows closing while the input is read.
PATHWAY_COMMIT_MS = 100

RESULT_PREFIX = "PEER-RESULT "


def run_peer(peer: str, workload: str, bootstrap: str, topic_in: str, topic_out: str,
             n: int, timeout_s: float = 300) -> dict:
    """Run ``peer`` ("bytewax"|"pathway") on ``workload`` ("identity"|"wordcount") in a fresh
    subprocess: read ``topic_in`` from the beginning until all ``n`` records are consumed,
    write ``topic_out``, flush, exit.

    Returns:
        ``{"peer", "workload", "version", "t_launch", "t_done", "workers", "notes"}`` plus
        the child's ``t_start`` (its first line, before importing the peer), ``t_run`` (just
        before the dataflow starts), ``records_in``, ``records_out``, ``malformed`` and
        ``threads_peak`` (the most OS threads it had: engine, Kafka clients, helpers).
        ``t_launch`` is ``time.time()`` just before the subprocess starts and ``t_done`` the
        child's ``time.time()`` after its final producer flush returned.

    Raises:
        ValueError: an unknown peer or workload, or a bad ``n``.
        ImportError: the peer is not installed.
        RuntimeError: the child failed (with the tail of its stderr).
        TimeoutError: the child ran past ``timeout_s`` (it is killed).
    """
    _check(peer, workload, n)
    if not AVAILABLE[peer]:
        raise ImportError(f"run_peer: {peer} is not installed (pip install {peer})")
    env = {**os.environ, "PATHWAY_THREADS": "1", "PATHWAY_PROCESSES": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), peer, workload, bootstrap,
           topic_in, topic_out, str(n)]
    t_launch = time.time()
    # its own session, so that a timeout takes down everything the child started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise TimeoutError(f"run_peer({peer!r}, {workload!r}): no result after {timeout_s:.0f} s; "
                           f"stderr tail:\n{err[-3000:]}") from None
    except BaseException:  # interrupted: leave no child behind
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    result = None
    for line in out.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
    if proc.returncode != 0 or result is None:
        raise RuntimeError(f"run_peer({peer!r}, {workload!r}) failed (exit {proc.returncode}); "
                           f"stderr tail:\n{err[-3000:]}")
    return {"peer": peer, "workload": workload, "t_launch": t_launch, **result}


def _check(peer: str, workload: str, n: int) -> None:
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}: expected one of {', '.join(PEERS)}")
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}: expected one of {', '.join(WORKLOADS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (the input records to consume), got {n!r}")


# -- the per-record work, shared by both peers ------------------------------------------------

def stamp_identity(record: bytes, in_ms: int, out_ms: int) -> bytes:
    """``msgId,eventTime`` -> ``msgId,eventTime,inTime,outTime``."""
    return b"%s,%d,%d" % (record, in_ms, out_ms)


def parse_sentence(record: bytes) -> list[tuple[str, float]] | None:
    """One JSON sentence -> (word, eventTime) per word; None when malformed (rayflow's
    :func:`~rayflow.examples.wordcount.parse` rules: a JSON object with msgId, eventTime and
    sentence, at most ``MAX_RECORD_BYTES``)."""
    if len(record) > MAX_RECORD_BYTES:
        return None
    try:
        msg = json.loads(record)
        if not isinstance(msg, dict) or not all(f in msg for f in ("msgId", "eventTime",
                                                                    "sentence")):
            return None
        ev = float(msg["eventTime"])
        return [(w, ev) for w in str(msg["sentence"]).split()]
    except (ValueError, TypeError):
        return None


def window_json(word: str, window: int, acc, out_s: float) -> bytes:
    """A closed window as rayflow's ``to_json`` writes it (same fields, same order).
    ``acc`` is ``[count, minEventTime, maxEventTime, minInTime, maxInTime]``."""
    n, e0, e1, i0, i1 = acc
    return (f'{{"word": "{word}", "window": {int(window)}, "count": {n}, '
            f'"minEventTime": {e0}, "maxEventTime": {e1}, "minInTime": {i0}, '
            f'"maxInTime": {i1}, "outTime": {out_s}}}').encode()


class CountWindows:
    """One word's tumbling count windows: ``add`` occurrences in order; each ``WINDOW``-th
    closes the open window and returns it as ``(window, [count, minEv, maxEv, minIn,
    maxIn])``."""

    __slots__ = ("acc", "seq")

    def __init__(self):
        self.seq = 0
        self.acc = None

    def add(self, ev: float, in_s: float):
        acc = self.acc
        if acc is None:
            acc = self.acc = [0, ev, ev, in_s, in_s]
        acc[0] += 1
        if ev < acc[1]:
            acc[1] = ev
        if ev > acc[2]:
            acc[2] = ev
        if in_s < acc[3]:
            acc[3] = in_s
        if in_s > acc[4]:
            acc[4] = in_s
        if acc[0] >= WINDOW:
            closed = (self.seq, acc)
            self.seq, self.acc = self.seq + 1, None
            return closed
        return None


# -- the child ---------------------------------------------------------------------------------

def _partitions(consumer, topic: str) -> list[int]:
    md = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if md is None or md.error is not None or not md.partitions:
        raise ValueError(f"Kafka topic {topic!r} does not exist or has no partitions")
    return sorted(md.partitions)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


class _Stats:
    """What the child counts as it runs (one engine worker: one process, no locks)."""

    records_in = 0
    records_out = 0
    malformed = 0


def _bytewax(workload: str, bootstrap: str, topic_in: str, topic_out: str) -> dict:
    import bytewax.operators as op
    from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.run import cli_main
    from confluent_kafka import OFFSET_BEGINNING

    stats = _Stats
    flow = Dataflow(f"peer-{workload}")
    src = KafkaSource([bootstrap], [topic_in], tail=False, starting_offset=OFFSET_BEGINNING,
                      add_config=dict(CONSUMER_CONF), batch_size=POLL_RECORDS)
    msgs = op.input("kafka-in", flow, src)

    if workload == "identity":
        def entry(batch):
            now = int(time.time() * 1000)
            stats.records_in += len(batch)
            return [(m.value, now) for m in batch]

        def exit_(batch):
            now = int(time.time() * 1000)
            stats.records_out += len(batch)
            return [KafkaSinkMessage(None, stamp_identity(v, t, now)) for v, t in batch]

        out = op.flat_map_batch("stamp-out", op.flat_map_batch("stamp-in", msgs, entry), exit_)
    else:
        def entry(batch):
            now = time.time()
            stats.records_in += len(batch)
            words = []
            for m in batch:
                got = parse_sentence(m.value)
                if got is None:
                    stats.malformed += 1
                    continue
                words.extend((w, (ev, now)) for w, ev in got)
            return words

        def count(state, value):
            state = state or CountWindows()
            closed = state.add(*value)
            return state, (() if closed is None else (closed,))

        def exit_(batch):
            now = time.time()
            stats.records_out += len(batch)
            return [KafkaSinkMessage(None, window_json(w, seq, acc, now))
                    for w, (seq, acc) in batch]

        words = op.flat_map_batch("parse", msgs, entry)
        windows = op.stateful_flat_map("count-window", words, count)
        out = op.flat_map_batch("format", windows, exit_)
    op.output("kafka-out", out, KafkaSink([bootstrap], topic_out, add_config=dict(PRODUCER_CONF)))

    t_run = time.time()
    cli_main(flow, workers_per_process=1)  # returns after the sink's final flush (close)
    t_done = time.time()
    return {"version": _version("bytewax"), "workers": 1, "t_run": t_run, "t_done": t_done,
            "notes": (f"bytewax.run.cli_main(flow, workers_per_process=1) (= python -m "
                      f"bytewax.run -w 1): 1 worker thread, plus librdkafka's threads; "
                      f"KafkaSource(tail=False, batch_size={POLL_RECORDS}, add_config="
                      f"{CONSUMER_CONF}) and KafkaSink(add_config={PRODUCER_CONF}), which "
                      f"flushes the producer after every batch it writes; inTime per poll "
                      f"batch in the first step, outTime per batch in the last step before "
                      f"the sink; count windows with op.stateful_flat_map")}


def _pathway(workload: str, bootstrap: str, topic_in: str, topic_out: str, n: int) -> dict:
    import pathway as pw
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    stats = _Stats

    class KafkaInput(pw.io.python.ConnectorSubject):
        """The first ``n`` records of ``topic_in`` from the beginning, with the time (s) of
        the poll that consumed them and their consumption order; then the input ends."""

        def run(self):
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": "peer-pathway",
                          **CONSUMER_CONF})
            try:
                c.assign([TopicPartition(topic_in, p, OFFSET_BEGINNING)
                          for p in _partitions(c, topic_in)])
                got = 0
                while got < n:
                    batch = c.consume(min(POLL_RECORDS, n - got), 0.1)
                    now = time.time()
                    for m in batch:
                        if m.error():
                            raise RuntimeError(f"Kafka consume error on {topic_in!r}: "
                                               f"{m.error()}")
                        self.next(data=m.value(), in_s=now, seq=got)
                        got += 1
                stats.records_in = got
            finally:
                c.close()

    class InSchema(pw.Schema):
        data: bytes
        in_s: float
        seq: int

    table = pw.io.python.read(KafkaInput(), schema=InSchema,
                              autocommit_duration_ms=PATHWAY_COMMIT_MS)

    if workload == "identity":
        @pw.udf(deterministic=False)
        def stamp_out(data: bytes, in_s: float) -> bytes:
            stats.records_out += 1
            return stamp_identity(data, int(in_s * 1000), int(time.time() * 1000))

        out = table.select(value=stamp_out(pw.this.data, pw.this.in_s))
    else:
        @pw.udf
        def parse(data: bytes) -> tuple[tuple[int, str, float], ...] | None:
            got = parse_sentence(data)
            if got is None:
                stats.malformed += 1
                return None
            return tuple((i, w, ev) for i, (w, ev) in enumerate(got))

        parsed = table.select(words=parse(pw.this.data), in_s=pw.this.in_s, seq=pw.this.seq)
        flat = parsed.filter(pw.this.words.is_not_none()).flatten(pw.this.words)
        occ = flat.select(word=pw.this.words[1], ev=pw.this.words[2], pos=pw.this.words[0],
                          in_s=pw.this.in_s, seq=pw.this.seq)
        windows = pathway_count_windows(pw, occ)

        @pw.udf(deterministic=False)
        def format_window(word: str, closed: tuple) -> bytes:
            stats.records_out += 1
            seq, acc = closed
            return window_json(word, seq, list(acc), time.time())

        out = windows.select(value=format_window(pw.this.word, pw.this.closed))
    pw.io.kafka.write(out, {"bootstrap.servers": bootstrap,
                            **{k: str(v) for k, v in PRODUCER_CONF.items()}},
                      topic_out, format="raw", value=out.value)

    t_run = time.time()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)  # returns after the writer's flush
    t_done = time.time()
    return {"version": _version("pathway"), "workers": 1, "t_run": t_run, "t_done": t_done,
            "notes": (f"PATHWAY_THREADS=1 PATHWAY_PROCESSES=1 (= pathway spawn -t 1): 1 "
                      f"engine thread, plus the Python input's thread and librdkafka's; input: "
                      f"pw.io.python.ConnectorSubject around confluent-kafka Consumer("
                      f"{CONSUMER_CONF}), polls of up to {POLL_RECORDS}, ending after n "
                      f"records, autocommit_duration_ms={PATHWAY_COMMIT_MS} (pw.io.kafka.read "
                      f"cannot end a bounded run on this broker: static mode stops at the "
                      f"ListOffsets end, which Tansu reports short); output: pw.io.kafka.write("
                      f"format='raw', {PRODUCER_CONF}); inTime per poll in the input, outTime "
                      f"in the last UDF before the writer; count windows with a "
                      f"pw.reducers.stateful_many reducer per word, folding each minibatch "
                      f"in consumption order, its closed windows out through to_stream()")}


def pathway_count_windows(pw, occ):
    """Pathway: the closed count windows of a table of word occurrences ``(word, seq, pos,
    ev, in_s)``, one row ``(word, closed=(window, (count, minEv, maxEv, minIn, maxIn)))`` per
    window, append-only. A stateful reducer keeps each word's open window; each minibatch's
    update of a word carries the windows that minibatch closed, and as a stream of upserts
    (``to_stream``) every window reaches the writer once, with no retractions."""
    counted = occ.groupby(pw.this.word).reduce(
        pw.this.word, state=_count_reducer(pw)(pw.this.ev, pw.this.in_s, pw.this.seq,
                                               pw.this.pos))
    changes = counted.to_stream().filter(pw.this.is_upsert)
    closed = changes.select(pw.this.word, closed=pw.this.state[2])
    return closed.flatten(pw.this.closed).select(pw.this.word, pw.this.closed)


def _count_reducer(pw):
    """A Pathway stateful reducer (``pw.reducers.stateful_many``: called once per minibatch
    with the key's new rows, minibatches in time order) over one word's occurrences
    ``(eventTime, inTime, seq, pos)``. Its state, which is also its value, is ``(next window,
    open window's [count, minEv, maxEv, minIn, maxIn] or (), the windows this minibatch
    closed)``; a minibatch's rows are folded in consumption order (seq, then position in the
    sentence), whatever order they come in."""

    @pw.reducers.stateful_many
    def count_windows(state, rows):
        windows = CountWindows()
        if state is not None:
            windows.seq, acc, _ = state
            windows.acc = list(acc) if acc else None
        closed = []
        add = windows.add
        for row, count in sorted(rows, key=lambda r: (r[0][2], r[0][3])):
            if count < 0:
                raise ValueError("count windows take an append-only input; got a retraction")
            for _ in range(count):
                got = add(row[0], row[1])
                if got is not None:
                    closed.append((got[0], tuple(got[1])))
        return (windows.seq, tuple(windows.acc or ()), tuple(closed))

    return count_windows


class _ThreadPeak:
    """The most OS threads this process had (``/proc/self/status``, sampled every 0.1 s, this
    sampler's own thread left out): the peer's engine, client and helper threads."""

    def __init__(self):
        import threading

        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> int:
        try:
            with open("/proc/self/status") as f:
                return next(int(ln.split()[1]) for ln in f if ln.startswith("Threads:"))
        except (OSError, StopIteration):
            return 0

    def _run(self):
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.now() - 1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def child(peer: str, workload: str, bootstrap: str, topic_in: str, topic_out: str,
          n: int) -> dict:
    t_start = time.time()
    _check(peer, workload, n)
    with _ThreadPeak() as threads:
        if peer == "bytewax":
            res = _bytewax(workload, bootstrap, topic_in, topic_out)
        else:
            res = _pathway(workload, bootstrap, topic_in, topic_out, n)
    res["threads_peak"] = threads.peak or None
    if _Stats.records_in != n:
        raise RuntimeError(f"{peer}: consumed {_Stats.records_in} records of {topic_in!r}, "
                           f"expected n={n}")
    return {**res, "t_start": t_start, "records_in": _Stats.records_in,
            "records_out": _Stats.records_out, "malformed": _Stats.malformed}


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print(__doc__.splitlines()[4].strip(), file=sys.stderr)
        return 2
    peer, workload, bootstrap, topic_in, topic_out, n = argv
    try:
        n_records = int(n)
    except ValueError:
        print(f"N must be an int, got {n!r}", file=sys.stderr)
        return 2
    res = child(peer, workload, bootstrap, topic_in, topic_out, n_records)
    print(RESULT_PREFIX + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
