"""W4 windowed word count: JSON sentences from Kafka, count windows of 10 per word, to Kafka.

Input ``{"msgId", "eventTime", "sentence"}``; output per window
``{"word", "window", "count", "minEventTime", "maxEventTime", "minInTime", "maxInTime",
"outTime"}``. Malformed JSON, missing fields and oversize records go to the dead-letter output.

    python jobs/wordcount.py --records 50000 --guarantee exactly_once
    ray job submit --working-dir . -- python jobs/wordcount.py --address auto --bootstrap HOST:9092

The flow and its helpers, shared by ``jobs/wordcount.py`` (the CLI), the demo, the
tests and the benchmarks.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

import rayflow as rf
from rayflow.core.operators import Logic, OperatorSpec, Output, describe_exception
from rayflow.operators.windows import Aggregator, CountWindow, column

MAX_RECORD_BYTES = 10_000
WORDS = ("stream batch window state barrier kafka ray actor rank block matrix vector "
         "latency throughput checkpoint").split()


def parse(record: bytes) -> list[tuple[str, float, float]]:
    """One JSON sentence -> (word, eventTime, inTime) per word; raises on bad input."""
    if len(record) > MAX_RECORD_BYTES:
        raise ValueError(f"oversize record: {len(record)} bytes > {MAX_RECORD_BYTES}")
    msg = json.loads(record)
    if not isinstance(msg, dict):
        raise ValueError("record is not a JSON object")
    missing = [f for f in ("msgId", "eventTime", "sentence") if f not in msg]
    if missing:
        raise ValueError(f"missing fields: {', '.join(missing)}")
    now = time.time()
    event_time = float(msg["eventTime"])
    return [(w, event_time, now) for w in str(msg["sentence"]).split()]


@dataclass(frozen=True)
class ParseSentences(OperatorSpec):
    """Parse + split as one batch operator that emits an Arrow table (word, eventTime,
    inTime): columnar batches cross to the window step as a few buffers instead of one
    pickled tuple per word. Bad records become dead letters one by one."""

    def build(self, ctx, resume_state=None):
        return _ParseLogic(ctx)


_SCHEMA = pa.schema([("eventTime", pa.float64()), ("sentence", pa.string())])


def parse_batch(records: list[bytes]) -> pa.Table | None:
    """Vectorized :func:`parse` of a batch: Arrow's JSON reader and whitespace split (C++).
    None when any record needs the record-by-record path (oversize, malformed, not an object,
    a missing or mistyped field): that path finds the bad ones and says why."""
    if not records or max(map(len, records)) > MAX_RECORD_BYTES:
        return None
    try:
        t = pj.read_json(pa.BufferReader(b"\n".join(records)), parse_options=pj.ParseOptions(
            explicit_schema=_SCHEMA, unexpected_field_behavior="infer"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if (t.num_rows != len(records) or "msgId" not in t.column_names
            or any(t.column(f).null_count for f in ("msgId", "eventTime", "sentence"))):
        return None
    lists = pc.utf8_split_whitespace(t.column("sentence").combine_chunks())
    words = pc.list_flatten(lists)
    keep = pc.not_equal(words, "")  # Arrow keeps the empty strings str.split() drops
    ev = t.column("eventTime").combine_chunks().take(pc.list_parent_indices(lists))
    return pa.table({"word": words.filter(keep), "eventTime": ev.filter(keep)})


class _ParseLogic(Logic):
    def process(self, items, event_times):
        fast = parse_batch(items)
        if fast is not None:
            now = time.time()
            return Output(fast.append_column(
                "inTime", pa.array(np.full(fast.num_rows, now), pa.float64())), None)
        words, evs, dead = [], [], []
        counts = []
        for rec in items:
            try:
                parsed = parse(rec)
            except Exception as exc:  # noqa: BLE001 - bad input: a dead letter, not a crash
                dead.append(self.dead(describe_exception(exc), rec))
                continue
            words.extend(w for w, _, _ in parsed)
            evs.extend(e for _, e, _ in parsed)
            counts.append(len(parsed))
        now = time.time()
        table = pa.table({"word": pa.array(words, pa.string()),
                          "eventTime": pa.array(evs, pa.float64()),
                          "inTime": pa.array([now] * len(words), pa.float64())})
        return Output(table, None, dead)


@dataclass(frozen=True)
class WindowStats(Aggregator):
    """The study's window value: count, min/max eventTime and min/max inTime (a mutable list
    accumulator: one per open window, updated in place)."""

    def create(self):
        return [0, math.inf, -math.inf, math.inf, -math.inf]

    def add(self, acc, r):
        ev, it = r["eventTime"], r["inTime"]
        acc[0] += 1
        if ev < acc[1]:
            acc[1] = ev
        if ev > acc[2]:
            acc[2] = ev
        if it < acc[3]:
            acc[3] = it
        if it > acc[4]:
            acc[4] = it
        return acc

    def merge(self, a, b):  # into ``a``, in place (as ``add``)
        a[0] += b[0]
        if b[1] < a[1]:
            a[1] = b[1]
        if b[2] > a[2]:
            a[2] = b[2]
        if b[3] < a[3]:
            a[3] = b[3]
        if b[4] > a[4]:
            a[4] = b[4]
        return a

    def reduce_segments(self, items, starts):
        counts = np.diff(np.append(starts, len(items))).tolist()
        ev, it = column(items, "eventTime"), column(items, "inTime")
        cols = (np.minimum.reduceat(ev, starts).tolist(), np.maximum.reduceat(ev, starts).tolist(),
                np.minimum.reduceat(it, starts).tolist(), np.maximum.reduceat(it, starts).tolist())
        return [list(acc) for acc in zip(counts, *cols)]


def json_string(word: str) -> str:
    """``word`` as the inside of a JSON string: as is when it is letters and digits (text
    almost always is), escaped by :func:`json.dumps` otherwise (quotes, backslashes,
    control characters)."""
    return word if word.isalnum() else json.dumps(word)[1:-1]


def to_json(result) -> bytes:
    """One window result as a JSON record (``outTime``: now)."""
    n, e0, e1, i0, i1 = result.value
    return (f'{{"word": "{json_string(result.key)}", "window": {int(result.start)}, '
            f'"count": {n}, "minEventTime": {e0}, "maxEventTime": {e1}, "minInTime": {i0}, '
            f'"maxInTime": {i1}, "outTime": {time.time()}}}').encode()


_STRING_ESCAPES = r'[\x00-\x1f"\\]'  # what a JSON string may not hold as it is (RE2)


def format_windows(results: list) -> list[bytes]:
    """:func:`to_json` of a whole batch of window results, formatted by Arrow (C++) instead of
    one f-string per window: the same JSON, numbers written as the shortest decimal that
    reads back to the same float (as Python's ``repr``; a whole float has no ``.0``). One
    ``outTime`` for the batch, taken when it is formatted.

        >>> from rayflow.operators.windows import WindowResult
        >>> format_windows([WindowResult('a"b', 0, 1, [2, 1.5, 2.0, 3.25, 3.5])])
        [b'{"word": "a\\\\"b", "window": 0, "count": 2, "minEventTime": 1.5, "maxEventTime": 2, "minInTime": 3.25, "maxInTime": 3.5, "outTime": ...}']
    """
    if not len(results):
        return []
    keys, starts, _, values = zip(*results)  # (window results are named tuples)
    words = pa.array(keys, pa.string())
    odd = pc.match_substring_regex(words, _STRING_ESCAPES)
    if odd.true_count:
        words = pa.array([json_string(w) for w in keys], pa.string())
    n, e0, e1, i0, i1 = zip(*values)

    def text(values, kind=None):
        return pa.array(values, kind or pa.float64()).cast(pa.string())

    out = pc.binary_join_element_wise(
        '{"word": "', words, '", "window": ', text(starts, pa.int64()),
        ', "count": ', text(n, pa.int64()), ', "minEventTime": ', text(e0),
        ', "maxEventTime": ', text(e1), ', "minInTime": ', text(i0), ', "maxInTime": ',
        text(i1), f', "outTime": {time.time()}}}', "")
    return out.cast(pa.binary()).to_pylist()


def build_flow(input_topic: str, output_topic: str, bootstrap: str, parallelism: int = 1,
               window: int = 10, name: str = "wordcount", bounded: bool = True,
               client: Literal["confluent", "kafka-python"] | None = None,
               split: bool = False,
               sink_client: Literal["confluent", "kafka-python"] | None = None,
               sink_parallelism: int = 1) -> rf.Dataflow:
    """The word count. At parallelism 1 every step runs in one actor (one process, chained);
    ``split=True`` starts the window step in an actor of its own (a second process: parsing
    and counting overlap, as Flink, which never chains across a key_by, runs it).
    ``client``: the Kafka client (default the job's ``kafka.client``); ``sink_client`` is
    the sink's when it differs from the source's. ``sink_parallelism``: the sink's instances
    (at ``parallelism`` each is chained to a format instance, in its actor)."""
    flow = rf.Dataflow(name)
    (flow.source("source", rf.KafkaSource(input_topic, bootstrap=bootstrap, bounded=bounded,
                                          client=client))
         .rebalance()
         .apply("parse", ParseSentences(), parallelism=parallelism, on_error="dead_letter")
         .key_by("word")
         .window("count", CountWindow(window), WindowStats(), parallelism=parallelism,
                 start_new_chain=split)
         .map_batches("format", format_windows, parallelism=parallelism)
         .sink("sink", rf.KafkaSink(output_topic, bootstrap=bootstrap,
                                    client=sink_client or client),
               parallelism=sink_parallelism))
    return flow


def sentences(n: int, seed: int = 0, words: int = 12, vocabulary: int | None = None):
    """``n`` deterministic JSON sentences of ``words`` words.

    With ``vocabulary=None`` the words come uniformly from the 15 of :data:`WORDS` (about 150
    bytes a sentence: a small test vocabulary). With ``vocabulary=V`` they follow Zipf's law
    (the k-th most frequent word has probability proportional to 1/k, as in natural text) over
    ``V`` distinct lower-case words of 2-10 letters, as made by :func:`zipf_vocabulary`.

        >>> first = json.loads(next(sentences(1, vocabulary=10_000, words=16)))
        >>> len(first["sentence"].split()), sorted(first)
        (16, ['eventTime', 'msgId', 'sentence'])
    """
    t0 = 1_700_000_000.0
    if vocabulary is None:
        import random

        rnd = random.Random(seed)
        for i in range(n):
            text = " ".join(rnd.choice(WORDS) for _ in range(words))
            yield json.dumps({"msgId": i, "eventTime": t0 + i / 1000, "sentence": text}).encode()
        return
    vocab = zipf_vocabulary(vocabulary, seed)
    p = 1.0 / np.arange(1, vocabulary + 1)
    rng = np.random.default_rng(seed)
    chunk = 10_000
    for lo in range(0, n, chunk):
        ranks = rng.choice(vocabulary, size=(min(chunk, n - lo), words), p=p / p.sum())
        for j, row in enumerate(ranks.tolist()):
            text = " ".join([vocab[r] for r in row])
            yield json.dumps({"msgId": lo + j, "eventTime": t0 + (lo + j) / 1000,
                              "sentence": text}).encode()


def zipf_vocabulary(size: int, seed: int = 0) -> list[str]:
    """``size`` distinct deterministic lower-case words of 2-10 letters, most frequent first
    (shorter words rank higher on average, as in natural text)."""
    rng = np.random.default_rng(seed + 1)
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)
    freq = np.linspace(2.0, 0.1, len(letters))
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < size:
        rank = len(out)
        length = int(min(10, max(2, rng.poisson(2 + 4 * min(1.0, rank / 2000)))))
        w = bytes(rng.choice(letters, size=length, p=freq / freq.sum())).decode()
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out
