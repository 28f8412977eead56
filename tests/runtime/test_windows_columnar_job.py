"""Tumbling windows over Arrow batches on the runtime: keyed by a field, the windows kept as
columns give the plain-Python windows at parallelism 2, and the same through a crash of a
window instance mid-stream under exactly-once."""

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest

import rayflow as rf
from rayflow.core.records import Field
from rayflow.operators.windows import EventTime, Sum, TumblingWindow, Windowed
from rayflow.testing import CrashDuringCheckpoint

N = 12_000


@dataclass(frozen=True)
class _Events:
    """GeneratorSource ``make``: event numbers -> an Arrow batch of ``k`` and ``v``."""

    def __call__(self, seq: np.ndarray):
        return pa.table({"k": seq % 7, "v": seq % 100})


def _times(seq: np.ndarray) -> np.ndarray:
    """Out of order in pairs, 2 ms apart: 24 s of event time, windows of 5 s."""
    return (seq ^ 1) * 0.002


def _reference():
    got: Counter = Counter()
    for i in range(N):
        got[(i % 7, math.floor(((i ^ 1) * 0.002) / 5.0) * 5.0)] += i % 100
    return got


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_arrow_windows_through_a_crash_give_the_failure_free_windows(ray_session, tmp_path,
                                                                      backend):
    """On RocksDB each checkpoint writes a window's columns since the last as an entry of
    its own, and the restored instance's firings read them back."""
    if backend == "rocksdb":
        pytest.importorskip("rocksdict")
    spec = Windowed(TumblingWindow(5.0), Sum(Field("v")), Field("k"), EventTime())
    for crash in (False, True):
        flow = rf.Dataflow(f"arrow-windows-{backend}-{crash}")
        win = CrashDuringCheckpoint(spec, 2, str(tmp_path / "m")) if crash else spec
        sums = (flow.source("src", rf.GeneratorSource(_Events(), count=N, rate=8_000,
                                                      columnar=True, timestamps=_times),
                            parallelism=2, watermarks=EventTime(max_delay_s=0.01))
                .key_by("k").apply("win", win, parallelism=2))
        sums.sink("out", rf.CollectSink())
        sums.side("late").sink("late", rf.CollectSink())
        job = flow.run(checkpoint={"interval_s": 0.2, "processing_guarantee": "exactly_once",
                                   "state_backend": backend,
                                   "state_dir": str(tmp_path / "state")},
                       stream={"batch_size": 400}, timeout_s=120)
        assert len(job.recoveries) == (1 if crash else 0)
        assert job.collect("late") == []
        got = [(r.key, r.start, r.value) for r in job.collect("out")]
        assert len(got) == len(set((k, s) for k, s, _ in got))  # each window once
        assert Counter({(k, s): v for k, s, v in got}) == _reference()
    assert (tmp_path / "m").exists()  # (it crashed)
