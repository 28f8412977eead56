"""Counters and latency samples of a step, and their summaries. Pure: no Ray.

The runtime keeps one :class:`StepCounters` per instance and one :class:`LatencyRecorder`
per sink instance; the job merges them. Latency is ``outTime - eventTime`` per record,
sampled (1 in N records) into a bounded buffer; percentiles come from numpy over the
samples, not from a hand-made histogram.

    >>> rec = LatencyRecorder(every=1)
    >>> import numpy as np
    >>> rec.record(np.array([1.0, 2.0, 3.0]), out_time=4.0)
    >>> summarize_latency([rec.samples()])["p50_ms"]
    2000.0
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, fields

import numpy as np


@dataclass
class StepCounters:
    """What one instance counted. All additive, so instances merge by summing."""

    records_in: int = 0
    records_out: int = 0
    batches_in: int = 0
    batches_out: int = 0
    bytes_out: int = 0
    dead_letters: int = 0
    side_records: int = 0  # records sent to side outputs (late records of windows)
    backpressure_s: float = 0.0
    busy_s: float = 0.0
    first_in_time: float = float("inf")  # earliest source stamp seen (sinks)
    last_out_time: float = 0.0  # latest write (sinks)

    def merge(self, other: StepCounters) -> StepCounters:
        out = StepCounters()
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "first_in_time":
                v = min(a, b)
            elif f.name == "last_out_time":
                v = max(a, b)
            else:
                v = a + b
            setattr(out, f.name, v)
        return out

    def as_dict(self) -> dict:
        d = asdict(self)
        if d["first_in_time"] == float("inf"):
            d["first_in_time"] = None
        return d


class LatencyRecorder:
    """Bounded buffer of (outTime, latency) samples, one in ``every`` records."""

    def __init__(self, every: int = 16, capacity: int = 400_000):
        self.every, self.capacity = every, capacity
        self._parts: deque[np.ndarray] = deque()
        self._n = 0
        self._phase = 0

    def record(self, event_times: np.ndarray | None, out_time: float, n: int = 0,
               in_time: float = 0.0) -> None:
        """Sample the latencies of one written batch. Without event times (a source that
        has none), the batch's ``n`` records count from ``in_time``, when they were read."""
        count = n if event_times is None else len(event_times)
        if count == 0:
            return
        if event_times is None:  # only the sampled records need a value
            picked = np.full(len(range(self._phase, count, self.every)), in_time)
        else:
            picked = event_times[self._phase :: self.every]
        self._phase = (self._phase - count) % self.every
        if len(picked) == 0:
            return
        part = np.empty((len(picked), 2))
        part[:, 0] = out_time
        part[:, 1] = out_time - picked
        self._parts.append(part)
        self._n += len(part)
        while self._n > self.capacity and len(self._parts) > 1:
            self._n -= len(self._parts.popleft())

    def samples(self) -> np.ndarray:
        """Array of shape (k, 2): outTime, latency seconds."""
        if not self._parts:
            return np.empty((0, 2))
        return np.concatenate(list(self._parts))


def summarize_latency(sample_sets: list[np.ndarray], skip_s: float = 0.0) -> dict:
    """Median, p90, p99 and max latency in ms over the merged samples.

    Args:
        sample_sets: arrays from :meth:`LatencyRecorder.samples`.
        skip_s: ignore samples written in the first ``skip_s`` seconds (warm-up).
    """
    parts = [s for s in sample_sets if len(s)]
    if not parts:
        return {"samples": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    s = np.concatenate(parts)
    if skip_s:
        s = s[s[:, 0] >= s[:, 0].min() + skip_s]
    lat = s[:, 1] * 1000.0
    p50, p90, p99 = np.percentile(lat, [50, 90, 99])
    return {"samples": int(len(lat)), "p50_ms": round(float(p50), 3),
            "p90_ms": round(float(p90), 3), "p99_ms": round(float(p99), 3),
            "max_ms": round(float(lat.max()), 3)}


def latency_windows(sample_sets: list[np.ndarray], window_s: float = 1.0) -> list[dict]:
    """Median and p99 per window of outTime (the study's "over windows")."""
    parts = [s for s in sample_sets if len(s)]
    if not parts:
        return []
    s = np.concatenate(parts)
    s = s[np.argsort(s[:, 0])]
    t0 = s[0, 0]
    idx = ((s[:, 0] - t0) // window_s).astype(np.int64)
    out = []
    for w in np.unique(idx):
        lat = s[idx == w, 1] * 1000.0
        out.append({"t_s": float(w * window_s), "n": int(len(lat)),
                    "p50_ms": float(np.median(lat)), "p99_ms": float(np.percentile(lat, 99))})
    return out
