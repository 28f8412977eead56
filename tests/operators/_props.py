"""Hypothesis strategies and backends shared by the property tests of the operators."""

from __future__ import annotations

import math

import pytest
from hypothesis import strategies as st

from rayflow.core.operators import Output, Rescaled, StepContext, owns
from rayflow.state import MemoryBackend, RocksDBBackend, backend_from_name

GRID = 0.25  # event times are multiples of this: exact in binary, often on a window bound


def draw_partition(draw, delay: float, keys: str, most: int, last_tick: int, misplace) -> list:
    """One partition's records ``(key, t)`` in the order they arrive: up to ``most`` of
    them, at times on the grid up to ``last_tick`` ticks, in order by their time plus a
    jitter within ``delay``. ``misplace(t, arrival, m)``, with ``m`` drawn from 0-12 per
    record, returns its ``(t, arrival)``: how a test puts a few records behind the
    watermark."""
    n = draw(st.integers(0, most))
    ticks = sorted(draw(st.lists(st.integers(0, last_tick), min_size=n, max_size=n)))
    names = draw(st.lists(st.sampled_from(keys), min_size=n, max_size=n))
    jitter = draw(st.lists(st.integers(0, int(delay / GRID)), min_size=n, max_size=n))
    moves = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    recs = [(*misplace(tick * GRID, (tick + j) * GRID, m), key)
            for tick, key, j, m in zip(ticks, names, jitter, moves)]
    return [(key, t) for t, _, key in sorted(recs, key=lambda r: r[1])]


def _arrive_late(t: float, arrival: float, m: int) -> tuple[float, float]:
    """One record in six arrives 3 s or more after its place."""
    return t, arrival + m * GRID * 4 if m > 10 else arrival


@st.composite
def streams(draw):
    """``(batches, watermarks)``: records ``(key, t, id)`` from 1-3 partitions, each in time
    order give or take ``delay``, interleaved in batches of 1-9 records; a few records come
    much later than their time. After each batch the watermark is the minimum over the
    partitions of the largest time each has shown, less ``delay`` (as a source computes
    it; an ended partition no longer holds it back)."""
    delay = draw(st.sampled_from([0.0, 0.5, 1.25]))
    parts = []
    rid = 0
    for _ in range(draw(st.integers(1, 3))):
        part = draw_partition(draw, delay, "abcd", 25, 48, _arrive_late)
        parts.append([(key, t, rid + i) for i, (key, t) in enumerate(part)])
        rid += len(part)
    pos = [0] * len(parts)
    top = [-math.inf] * len(parts)
    batches, marks = [], []
    while any(p < len(part) for p, part in zip(pos, parts)):
        i = draw(st.sampled_from([j for j, part in enumerate(parts) if pos[j] < len(part)]))
        n = draw(st.integers(1, 9))
        batch = parts[i][pos[i]:pos[i] + n]
        pos[i] += len(batch)
        top[i] = max(top[i], max(r[1] for r in batch))
        ended = [math.inf if pos[j] == len(parts[j]) else top[j] for j in range(len(parts))]
        batches.append(batch)
        marks.append(min(ended) - delay)
    return batches, marks


def backend_for(name: str, where: str):
    """``memory``, ``filesystem`` or ``rocksdb-N`` (RocksDB with a cache of N entries)."""
    if name == "memory":
        return MemoryBackend()
    if name == "filesystem":
        return backend_from_name("filesystem", where)
    pytest.importorskip("rocksdict")
    return RocksDBBackend(where, cache_entries=int(name.split("-")[1]))


def _records_owned(batch: list, ctx: StepContext) -> list | None:
    """The records of ``batch`` whose key (their first field) ``ctx``'s instance owns."""
    return [rec for rec in batch if owns(rec[0], ctx)] or None


def run_rounds(spec, backend, batches: list, marks: list | None, restore_at: int,
               rescale_to: int, part_of=_records_owned, with_times: bool = False) -> list:
    """A step over ``batches`` as the runtime drives it: each instance takes its part of a
    batch (``part_of(batch, ctx)``, None: nothing of it) and then the watermark after it
    (``marks``; None: no watermarks); after batch ``restore_at`` the step goes on from a
    snapshot in ``rescale_to`` new instances. ``with_times``: each record's event time
    (its second field) goes with it. Returns per batch, and once more for the end of the
    input, the outputs the instances returned."""
    def ctx(i=0, n=1):
        return StepContext("prop", i, n, "prop", backend)

    logics = [spec.build(ctx())]
    rounds: list[list[Output]] = []
    for r, batch in enumerate(batches):
        outs = []
        for logic in logics:
            part = part_of(batch, logic.ctx)
            if part is not None:
                times = [rec[1] for rec in part] if with_times else None
                outs.append(logic.process(part, times))
            if marks is not None:
                outs.append(logic.on_watermark(marks[r]))
        rounds.append([o for o in outs if o is not None])
        if r == restore_at:
            handles = tuple(logic.snapshot() for logic in logics)
            resume = handles[0] if len(logics) == rescale_to == 1 else Rescaled(
                handles, len(logics))
            for logic in logics:
                logic.close()
            logics = [spec.build(ctx(i, rescale_to), resume) for i in range(rescale_to)]
    end = []
    for logic in logics:
        end.append(logic.on_end())
        logic.close()
    rounds.append([o for o in end if o is not None])
    return rounds
