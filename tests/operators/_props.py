"""Hypothesis strategies and backends shared by the property tests of the operators."""

from __future__ import annotations

import math

import pytest
from hypothesis import strategies as st

from rayflow.state import MemoryBackend, RocksDBBackend, backend_from_name

GRID = 0.25  # event times are multiples of this: exact in binary, often on a window bound


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
        n = draw(st.integers(0, 25))
        ticks = sorted(draw(st.lists(st.integers(0, 48), min_size=n, max_size=n)))
        keys = draw(st.lists(st.sampled_from("abcd"), min_size=n, max_size=n))
        jitter = draw(st.lists(st.integers(0, int(delay / GRID)), min_size=n, max_size=n))
        late = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
        recs = []
        for tick, key, j, back in zip(ticks, keys, jitter, late):
            t = tick * GRID
            # in order by t + jitter (within delay); one in six far behind its place
            recs.append((t + j * GRID + (back * GRID * 4 if back > 10 else 0.0), (key, t, rid)))
            rid += 1
        parts.append([r for _, r in sorted(recs, key=lambda x: x[0])])
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
