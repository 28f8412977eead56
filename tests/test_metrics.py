import numpy as np

from rayflow.metrics import LatencyRecorder, StepCounters, latency_windows, summarize_latency


def test_latency_recorder_samples_one_in_n_across_batches():
    rec = LatencyRecorder(every=4)
    for b in range(5):  # 5 batches of 3 records: 15 records -> samples at 0,4,8,12
        rec.record(np.full(3, 10.0), out_time=10.0 + b)
    s = rec.samples()
    assert len(s) == 4
    assert s[:, 1].tolist() == [0.0, 1.0, 2.0, 4.0]


def test_latency_without_event_times_counts_from_in_time():
    rec = LatencyRecorder(every=1)
    rec.record(None, out_time=5.0, n=2, in_time=4.5)
    assert rec.samples()[:, 1].tolist() == [0.5, 0.5]


def test_recorder_is_bounded():
    rec = LatencyRecorder(every=1, capacity=1000)
    for _ in range(50):
        rec.record(np.zeros(100), 1.0)
    assert 1000 <= len(rec.samples()) <= 1100


def test_summaries_match_numpy():
    lat = np.random.default_rng(0).exponential(0.01, 10_000)
    s = np.stack([np.linspace(0, 5, lat.size), lat], axis=1)
    summ = summarize_latency([s])
    assert summ["p99_ms"] == round(float(np.percentile(lat * 1000, 99)), 3)
    wins = latency_windows([s], 1.0)
    assert [w["n"] for w in wins] == [2000, 2000, 2000, 2000, 1999, 1]


def test_counters_merge():
    a = StepCounters(records_in=3, first_in_time=5.0, last_out_time=9.0)
    b = StepCounters(records_in=4, first_in_time=2.0, last_out_time=7.0)
    m = a.merge(b)
    assert (m.records_in, m.first_in_time, m.last_out_time) == (7, 2.0, 9.0)
