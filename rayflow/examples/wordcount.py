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
from rayflow.operators.base import Logic, OperatorSpec, Output, describe_exception
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

    def merge(self, a, b):
        return [a[0] + b[0], min(a[1], b[1]), max(a[2], b[2]), min(a[3], b[3]), max(a[4], b[4])]

    def reduce_segments(self, items, starts):
        counts = np.diff(np.append(starts, len(items))).tolist()
        ev, it = column(items, "eventTime"), column(items, "inTime")
        cols = (np.minimum.reduceat(ev, starts).tolist(), np.maximum.reduceat(ev, starts).tolist(),
                np.minimum.reduceat(it, starts).tolist(), np.maximum.reduceat(it, starts).tolist())
        return [list(acc) for acc in zip(counts, *cols)]


def to_json(result) -> bytes:
    n, e0, e1, i0, i1 = result.value
    return (f'{{"word": "{result.key}", "window": {int(result.start)}, "count": {n}, '
            f'"minEventTime": {e0}, "maxEventTime": {e1}, "minInTime": {i0}, '
            f'"maxInTime": {i1}, "outTime": {time.time()}}}').encode()


def build_flow(input_topic: str, output_topic: str, bootstrap: str, parallelism: int = 1,
               window: int = 10, name: str = "wordcount", bounded: bool = True,
               client: Literal["kafka-python", "confluent"] = "kafka-python") -> rf.Dataflow:
    flow = rf.Dataflow(name)
    (flow.source("source", rf.KafkaSource(input_topic, bootstrap=bootstrap, bounded=bounded,
                                          client=client))
         .rebalance()
         .apply("parse", ParseSentences(), parallelism=parallelism, on_error="dead_letter")
         .key_by("word")
         .window("count", CountWindow(window), WindowStats(), parallelism=parallelism)
         .map("format", to_json, parallelism=parallelism)
         .sink("sink", rf.KafkaSink(output_topic, bootstrap=bootstrap, client=client),
               parallelism=1))
    return flow


def sentences(n: int, seed: int = 0, words: int = 12):
    """``n`` deterministic JSON sentences of ``words`` words (about 150 bytes each)."""
    import random

    rnd = random.Random(seed)
    t0 = 1_700_000_000.0
    for i in range(n):
        text = " ".join(rnd.choice(WORDS) for _ in range(words))
        yield json.dumps({"msgId": i, "eventTime": t0 + i / 1000, "sentence": text}).encode()
