"""Counters and latency samples of a step, and their summaries. Pure: no Ray.

The runtime keeps one :class:`StepCounters` per instance and one :class:`LatencyRecorder`
per sink instance; the job merges them. Latency is ``outTime - eventTime`` per record,
sampled (1 in N records) into a bounded buffer; percentiles come from numpy over the
samples, not from a hand-made histogram.

:class:`StepExporter` and :class:`StageExporter` send the same figures to Prometheus through
Ray's metrics export (``ray.util.metrics``; Ray is imported only when one is built), and
:data:`SERIES` names every series they make.

    >>> rec = LatencyRecorder(every=1)
    >>> import numpy as np
    >>> rec.record(np.array([1.0, 2.0, 3.0]), out_time=4.0)
    >>> summarize_latency([rec.samples()])["p50_ms"]
    2000.0
"""

from __future__ import annotations

import threading
import time
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
    state_expired: int = 0  # keys whose state a step removed when their ttl_s ran out
    backpressure_s: float = 0.0
    busy_s: float = 0.0
    checkpoints: int = 0  # snapshots this instance took (one per checkpoint it aligned)
    checkpoint_s: float = 0.0  # time spent taking them
    checkpoint_bytes: int = 0  # their size, summed
    first_in_time: float = float("inf")  # earliest source stamp seen (sinks)
    last_out_time: float = 0.0  # latest write (sinks)
    # when the sink's output last became durable and visible: its final flush returned, or
    # (a sink that commits) its latest commit returned (sinks)
    delivered_time: float = 0.0

    def merge(self, other: StepCounters) -> StepCounters:
        out = StepCounters()
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "first_in_time":
                v = min(a, b)
            elif f.name in ("last_out_time", "delivered_time"):
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
        self._total = 0  # samples ever recorded (dropped ones too): cursors of since()
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
        self._total += len(part)
        while self._n > self.capacity and len(self._parts) > 1:
            self._n -= len(self._parts.popleft())

    def since(self, cursor: int) -> tuple[np.ndarray, int]:
        """Latencies (seconds) of the samples recorded after ``cursor`` (0 at first), and
        the cursor to pass next time. Samples the bound dropped meanwhile are not returned."""
        need, out = self._total - cursor, []
        for part in reversed(self._parts):
            if need <= 0:
                break
            take = part[-need:] if need < len(part) else part
            out.append(take[:, 1])
            need -= len(take)
        lat = np.concatenate(out[::-1]) if out else np.empty(0)
        return lat, self._total

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


# -- export to Prometheus through Ray ------------------------------------------------------
# Ray's metrics agent serves what workers record at every node's metrics export port, as
# ``ray_<name>`` with ``_total`` on counters and ``_bucket``/``_sum``/``_count`` on
# histograms. The labels below are rayflow's; Ray adds its own (SessionName, WorkerId, ...).

STEP_LABELS = ("job", "step", "instance")

#: Counters of a stream step instance: exported name -> (StepCounters field, help text).
STEP_COUNTERS: dict[str, tuple[str, str]] = {
    "rayflow_records_in": ("records_in", "records a step instance received (sources: read)"),
    "rayflow_records_out": ("records_out", "records a step instance emitted (sinks: wrote)"),
    "rayflow_bytes_out": ("bytes_out", "bytes a step instance sent to other actors"),
    "rayflow_dead_letters": ("dead_letters", "records a step instance could not process"),
    "rayflow_side_records": ("side_records", "records sent to side outputs (late records)"),
    "rayflow_backpressure_seconds": ("backpressure_s", "time blocked on a full channel "
                                     "(an exactly-once sink: on its commits)"),
    "rayflow_busy_seconds": ("busy_s", "time spent on the step's own work"),
    "rayflow_checkpoints": ("checkpoints", "snapshots a step instance took"),
}
#: Seconds from a record's event time (or read time) to its write, sampled, at sinks.
LATENCY = "rayflow_latency_seconds"
LATENCY_BOUNDARIES_S = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                        10.0, 30.0, 60.0]
CHECKPOINT_DURATION = "rayflow_checkpoint_duration_seconds"  # histogram, per snapshot
CHECKPOINT_DURATION_BOUNDARIES_S = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0]
CHECKPOINT_SIZE = "rayflow_checkpoint_size_bytes"  # gauge: the instance's last snapshot
#: HPC stages (``mpimap``): ``step`` is the stage name, ``instance`` the rank.
STAGE_SECONDS = "rayflow_stage_seconds"  # histogram of a stage's wall time (instance "all")
STAGE_RANK_SECONDS = "rayflow_stage_rank_seconds"  # gauge: a rank's time in its function
STAGE_RANK_MAXRSS = "rayflow_stage_rank_maxrss_bytes"  # gauge: a rank's peak RSS
STAGE_ATTEMPTS = "rayflow_stage_attempts"  # counter: runs of a stage (retries included)
STAGE_SECONDS_BOUNDARIES_S = [0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0]

#: Every series as Prometheus names it, with its kind.
SERIES: dict[str, str] = {
    **{f"ray_{name}_total": "counter" for name in STEP_COUNTERS},
    **{f"ray_{name}{suffix}": "histogram"
       for name in (LATENCY, CHECKPOINT_DURATION, STAGE_SECONDS)
       for suffix in ("_bucket", "_sum", "_count")},
    f"ray_{CHECKPOINT_SIZE}": "gauge",
    f"ray_{STAGE_RANK_SECONDS}": "gauge",
    f"ray_{STAGE_RANK_MAXRSS}": "gauge",
    f"ray_{STAGE_ATTEMPTS}_total": "counter",
}

EXPORT_INTERVAL_S = 1.0  # a step records into Ray's metrics at most this often
MAX_LATENCY_OBSERVATIONS_PER_S = 2000  # latency samples recorded per second, at most

_metrics_cache: dict[str, object] = {}


def _metric(kind: str, name: str, help_text: str, boundaries: list[float] | None = None):
    """One Ray metric object per name and process (they are cheap to share)."""
    m = _metrics_cache.get(name)
    if m is None:
        from ray.util import metrics as rm

        if kind == "counter":
            m = rm.Counter(name, help_text, STEP_LABELS)
        elif kind == "gauge":
            m = rm.Gauge(name, help_text, STEP_LABELS)
        else:
            m = rm.Histogram(name, help_text, boundaries or [], STEP_LABELS)
        _metrics_cache[name] = m
    return m


class StepExporter:
    """Exports one step instance's :class:`StepCounters` and latency samples.

    The hot path asks :meth:`due` once per batch and calls :meth:`export`, which records
    the deltas since the last export into Ray's metrics, only when ``interval_s`` passed:
    never per record.
    :meth:`export` at the end of a run sends the last counts. Latency samples become
    observations of the ``rayflow_latency_seconds`` histogram, evenly thinned to at most
    ``max_observations_per_s`` per second since the last export (each costs a call into
    Ray; the histogram's ``_count`` is samples, not records).
    """

    def __init__(self, job: str, step: str, instance: int,
                 interval_s: float = EXPORT_INTERVAL_S,
                 max_observations_per_s: int = MAX_LATENCY_OBSERVATIONS_PER_S):
        self.tags = {"job": job, "step": step, "instance": str(instance)}
        self.interval_s, self.max_observations_per_s = interval_s, max_observations_per_s
        self._sent = StepCounters()
        self._latency_sent = 0  # samples of the recorder already observed
        self._last = time.monotonic()
        self._lock = threading.Lock()  # the data and control threads both export
        try:
            self._counters = {name: (fld, _metric("counter", name, text))
                              for name, (fld, text) in STEP_COUNTERS.items()}
            self._latency = _metric("histogram", LATENCY, "record latency at sinks (sampled)",
                                    LATENCY_BOUNDARIES_S)
            self._chk_s = _metric("histogram", CHECKPOINT_DURATION,
                                  "time a step instance took to snapshot its state",
                                  CHECKPOINT_DURATION_BOUNDARIES_S)
            self._chk_bytes = _metric("gauge", CHECKPOINT_SIZE,
                                      "size of a step instance's last snapshot")
            self.enabled = True
        except Exception:  # noqa: BLE001 - Ray without its metrics: counting still works
            self.enabled = False

    def due(self) -> bool:
        """Whether the export interval has passed (cheap: the hot path asks per batch)."""
        return self.enabled and time.monotonic() - self._last >= self.interval_s

    def export(self, counters: StepCounters, latency: LatencyRecorder | None = None) -> None:
        """Record what changed since the last export (now, whatever the interval)."""
        if not self.enabled:
            return
        with self._lock:
            now = time.monotonic()
            bound = int(self.max_observations_per_s * max(now - self._last, self.interval_s))
            self._last = now
            for _name, (fld, metric) in self._counters.items():
                delta = getattr(counters, fld) - getattr(self._sent, fld)
                if delta > 0:
                    metric.inc(delta, self.tags)
                    setattr(self._sent, fld, getattr(counters, fld))
            if latency is not None:
                fresh, self._latency_sent = latency.since(self._latency_sent)
                if len(fresh) > bound:
                    fresh = fresh[(np.arange(bound) * (len(fresh) / bound)).astype(np.int64)]
                for v in fresh.tolist():
                    self._latency.observe(max(v, 0.0), self.tags)

    def checkpoint(self, duration_s: float, size_bytes: int) -> None:
        """One snapshot taken (rare: recorded at once)."""
        if self.enabled:
            self._chk_s.observe(duration_s, self.tags)
            self._chk_bytes.set(size_bytes, self.tags)


def handle_bytes(handle: object) -> int:
    """The size of a snapshot handle: bytes, a file or directory it names, what an incremental
    snapshot wrote (``checkpoint_bytes``), or its pickle."""
    import os
    import pickle

    if handle is None:
        return 0
    written = getattr(handle, "checkpoint_bytes", None)  # an incremental snapshot's own part
    if isinstance(written, int):
        return written
    if isinstance(handle, (bytes, bytearray, memoryview)):
        return len(handle)
    if isinstance(handle, (str, os.PathLike)) and os.path.exists(handle):
        path = str(os.fspath(handle))
        if os.path.isfile(path):
            return os.path.getsize(path)
        total = 0
        for d, _, files in os.walk(path):
            total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
        return total
    try:
        return len(pickle.dumps(handle, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - an unpicklable handle (e.g. an ObjectRef) is not sized
        return 0


class StageExporter:
    """Timings of one HPC stage run (recorded once, when it ends), by the driver."""

    def __init__(self, job: str, stage: str):
        self.job, self.stage = job, stage

    def export(self, wall_s: float, attempts: int, rank_wall_s: list[float],
               rank_maxrss_bytes: list[int]) -> None:
        try:
            whole = {"job": self.job, "step": self.stage, "instance": "all"}
            _metric("histogram", STAGE_SECONDS, "wall time of an HPC stage, all attempts",
                    STAGE_SECONDS_BOUNDARIES_S).observe(wall_s, whole)
            _metric("counter", STAGE_ATTEMPTS, "runs of an HPC stage (retries included)"
                    ).inc(attempts, whole)
            secs = _metric("gauge", STAGE_RANK_SECONDS, "a rank's time in the stage function")
            rss = _metric("gauge", STAGE_RANK_MAXRSS, "a rank's peak RSS in the stage")
            for r, (w, m) in enumerate(zip(rank_wall_s, rank_maxrss_bytes)):
                tags = {"job": self.job, "step": self.stage, "instance": str(r)}
                secs.set(w, tags)
                rss.set(m, tags)
        except Exception:  # noqa: BLE001 - Ray without its metrics: the stage still ran
            pass
