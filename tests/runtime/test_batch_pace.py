"""Batches follow the receiver's pace: the sizing decision from given call durations, how a
batch is dealt over channels, and what a source may poll. Pure: no Ray cluster."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pyarrow as pa
import pytest

from rayflow.core.records import Batch
from rayflow.runtime.channel import Emitter, _part
from rayflow.runtime.pace import CallPace, deal, least_loaded
from rayflow.runtime.plan import OutEdge

# -- the sizing decision -------------------------------------------------------------------


def _warm(p):
    """The first call a receiver reports, which pays its warm-up: far slower than the rest."""
    p.observe(CallPace.FIRST_ROWS, 10.0)


def test_a_receiver_not_measured_yet_gets_a_first_part_of_first_rows():
    assert CallPace(0.1).rows() == CallPace.FIRST_ROWS == 512
    assert CallPace(0.1).next_part() == 512  # no probe before a measurement


def test_the_first_call_is_warm_up_and_not_counted():
    p = CallPace(0.1)
    p.observe(512, 10.0)  # ~20 ms a record: the imports, the first connections downstream
    assert p.per_record_s is None and p.fixed_s == 0.0 and p.rows() == 512
    p.observe(64, 0.064)  # 1 ms a record: the pace is that of the second call alone
    assert p.per_record_s == pytest.approx(0.001) and p.fixed_s == 0.0 and p.rows() == 100
    q = CallPace(0.1)  # the warm-up is the first call, not the first size
    for _ in range(2):
        q.observe(64, 0.064)
    assert list(q._calls) == [(64, 0.064)]


def test_per_record_cost_sizes_a_part_to_the_target():
    p = CallPace(0.1)
    _warm(p)
    p.observe(64, 0.064)  # 1 ms a record
    assert p.rows() == 100  # 0.1 s of work
    # every fourth part is twice as large, so that sizes differ for the fit
    assert [p.next_part() for _ in range(8)] == [100, 100, 100, 200] * 2
    p.observe(100, 0.1)
    p.observe(200, 0.2)
    assert p.per_record_s == pytest.approx(0.001) and p.fixed_s == pytest.approx(0.0)
    assert p.rows() == 100


def test_a_fast_receiver_keeps_large_batches():
    p = CallPace(0.1)
    _warm(p)
    p.observe(64, 64e-6)  # 1 us a record
    assert p.rows() == 100_000  # above any batch_size (and the channel sends it whole)
    p.observe(16384, 0.016384)
    assert p.rows() == 100_000


def test_a_fixed_cost_per_call_is_not_split_into_more_calls():
    # 0.2 s a call whatever its size (a flush, a request): splitting would only add calls
    p = CallPace(0.1)
    _warm(p)
    p.observe(64, 0.2)
    assert p.rows() == 32  # one size seen: all of it looks per-record
    p.observe(32, 0.2)  # a second size: the fit sees the cost does not follow the rows
    assert (p.fixed_s, p.per_record_s, p.rows(), p.next_part()) == (0.2, 0.0, None, None)


def test_a_fixed_cost_takes_at_most_half_a_call():
    # 60 ms a call plus 1 ms a record: 0.1 s would leave 40 records, the fixed cost 60 %;
    # the part is as large as twice the fixed cost instead: 60 records, 0.12 s
    p = CallPace(0.1)
    _warm(p)
    for n in (20, 40, 80):
        p.observe(n, 0.06 + 0.001 * n)
    assert p.fixed_s == pytest.approx(0.06) and p.per_record_s == pytest.approx(0.001)
    assert p.rows() == 60
    q = CallPace(0.1)  # 20 ms fixed: the target decides, 80 records
    _warm(q)
    for n in (20, 40, 80):
        q.observe(n, 0.02 + 0.001 * n)
    assert q.rows() == 80


def test_one_size_keeps_the_fitted_fixed_cost():
    p = CallPace(0.1)
    _warm(p)
    for n in (20, 40, 80):
        p.observe(n, 0.02 + 0.001 * n)
    for _ in range(CallPace.SAMPLES):  # one size only: no new fit, the fixed cost stays
        p.observe(80, 0.02 + 0.001 * 80)
    assert p.fixed_s == pytest.approx(0.02) and p.per_record_s == pytest.approx(0.001)
    for _ in range(CallPace.SAMPLES):
        p.observe(80, 0.02 + 0.002 * 80)  # the receiver got twice as slow per record
    assert p.fixed_s == pytest.approx(0.02) and p.per_record_s == pytest.approx(0.002)
    assert p.rows() == 40


def test_the_pace_follows_the_last_calls():
    p = CallPace(0.1)
    _warm(p)
    p.observe(64, 0.064)
    assert p.rows() == 100
    for _ in range(CallPace.SAMPLES):
        p.observe(100, 1.0)  # 10 ms a record now: the 64-record call has left the window
    assert p.rows() == 10


def test_calls_without_records_or_duration_are_ignored_and_off_means_whole():
    p = CallPace(0.1)
    p.observe(0, 0.5)
    p.observe(10, -1.0)
    assert p.per_record_s is None and p.rows() == 512
    _warm(p)  # nor were they the warm-up: this is
    assert p.per_record_s is None
    p.observe(64, 0.064)
    assert p.rows() == 100
    off = CallPace(0.0)
    off.observe(64, 64.0)
    off.observe(64, 64.0)
    assert off.rows() is None and off.next_part() is None


# -- dealing a batch over channels ---------------------------------------------------------


def _turns(*channels):
    it = iter(channels)
    return lambda: next(it)


def test_deal_gives_each_part_what_its_channel_takes():
    caps = {0: 4, 1: 3, 2: None}
    def rows_for(c, left):
        return caps[c]

    assert list(deal(12, rows_for, _turns(1, 2))) == [(1, 0, 3), (2, 3, 12)]
    assert list(deal(12, rows_for, _turns(0, 1, 0, 1))) == \
        [(0, 0, 4), (1, 4, 7), (0, 7, 11), (1, 11, 12)]
    assert list(deal(5, lambda c, left: 0)) == [(0, 0, 1), (0, 1, 2), (0, 2, 3), (0, 3, 4),
                                               (0, 4, 5)]  # at least 1 a part
    assert list(deal(0, rows_for, _turns())) == []


def test_deal_asks_the_channel_and_its_pace_just_before_each_part():
    asked = []
    sizes = iter([2, 5, 1, 100])

    def rows_for(c, left):
        asked.append((c, left))
        return next(sizes)

    assert list(deal(9, rows_for, _turns(2, 0, 1, 2))) == \
        [(2, 0, 2), (0, 2, 7), (1, 7, 8), (2, 8, 9)]
    assert asked == [(2, 9), (0, 7), (1, 2), (2, 1)]


def test_least_loaded_takes_turns_among_equals_and_skips_the_busy():
    assert [least_loaded([0, 0, 0], s) for s in range(4)] == [0, 1, 2, 0]
    assert least_loaded([3, 1, 2], 0) == 1
    assert least_loaded([1, 3, 1], 1) == 2 and least_loaded([1, 3, 1], 0) == 0
    # a channel whose receiver lags gets no part until the others have as many in flight
    loads, got = [5, 0, 0], []
    for _ in range(10):
        i = least_loaded(loads, (got[-1] + 1) if got else 0)
        got.append(i)
        loads[i] += 1
    assert got == [1, 2, 1, 2, 1, 2, 1, 2, 1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_deal_sends_every_record_once_in_order_per_channel(seed):
    rng = random.Random(seed)
    n, channels = rng.randint(1, 500), rng.randint(1, 6)
    caps = {c: rng.choice([None, 1, 7, 64]) for c in range(channels)}
    parts = list(deal(n, lambda c, left: caps[c], lambda: rng.randrange(channels)))
    records = list(range(n))
    got = {c: [] for c in range(channels)}
    for c, lo, hi in parts:
        assert hi - lo <= (caps[c] or n)
        got[c] += records[lo:hi]
    assert sorted(itertools.chain(*got.values())) == records
    assert all(v == sorted(v) for v in got.values())


def test_a_part_keeps_its_records_and_event_times_in_each_container():
    t = np.arange(6, dtype=np.float64)
    for items in ([10, 11, 12, 13, 14, 15], np.arange(10, 16),
                  pa.table({"x": list(range(10, 16))})):
        part = _part(Batch(items, t, 7.0), 2, 5)
        got = part.items if not isinstance(part.items, pa.Table) else part.items["x"].to_pylist()
        assert list(got) == [12, 13, 14]
        assert part.event_times.tolist() == [2.0, 3.0, 4.0] and part.in_time == 7.0
    whole = Batch([1, 2], None, 0.0)
    assert _part(whole, 0, 2) is whole and _part(whole, 1, 2).event_times is None


# -- what a source may poll ----------------------------------------------------------------


class _Chained:
    """A stand-in for a step chained into the sender's actor."""

    def __init__(self, emitter):
        self.emitter = emitter


def _emitter(partitioning, n, target_s=0.1, local=None):
    edge = OutEdge("down", partitioning, tuple(range(n)))
    return Emitter(("up", 0), [edge], {"down": [None] * n}, max_bytes=1 << 30, max_calls=16,
                   local=local, batch_target_s=target_s)


def _measure(em, per_record):
    """Each channel's receiver: a warm-up call, then ``per_record`` seconds a record."""
    for chan, per in zip(em.edges[0][1], per_record):
        _warm(chan.pace)
        chan.pace.observe(64, 64 * per)


def test_a_source_polls_what_its_channels_take_in_engage_rounds():
    assert CallPace.ENGAGE == 10
    reb = _emitter("rebalance", 3)
    assert reb.batch_rows() == 3 * 512 * 10  # nothing measured yet
    _measure(reb, [0.001, 0.002, 0.001])
    assert reb.batch_rows() == (100 + 50 + 100) * 10  # each channel ENGAGE parts
    fast = _emitter("rebalance", 2)
    _measure(fast, [0.0, 0.001])  # no cost per record on the first
    assert fast.batch_rows() is None  # one channel takes any batch whole
    assert _emitter("rebalance", 3, target_s=0.0).batch_rows() is None  # off


def test_only_a_rebalance_to_several_instances_is_paced():
    # elsewhere a part goes where its whole batch would: smaller calls only repeat each
    # call's fixed (per-key) cost. A slow receiver there still gets whole batches
    for kind, n in (("forward", 1), ("broadcast", 3), ("hash", 3), ("rebalance", 1)):
        em = _emitter(kind, n)
        _measure(em, [0.001] * n)
        assert [c.pace.target_s for c in em.edges[0][1]] == [0.0] * n, kind
        assert [em._rows_for(c, 5000) for c in em.edges[0][1]] == [None] * n, kind
        assert em.batch_rows() is None, kind
    reb = _emitter("rebalance", 2)
    _measure(reb, [0.001] * 2)
    assert [c.pace.target_s for c in reb.edges[0][1]] == [0.1, 0.1]
    assert [reb._rows_for(c, 5000) for c in reb.edges[0][1]] == [100, 100]


def test_parts_only_when_what_is_left_costs_more_than_engage_targets():
    em = _emitter("rebalance", 2, target_s=0.125)
    a, b = em.edges[0][1]
    _warm(a.pace)
    a.pace.observe(512, 0.5)  # 1/1024 s a record: 128 records a part, 1.25 s = 1280
    assert em._rows_for(a, 0) == 128 * 10  # what a source may poll for this channel
    assert em._rows_for(a, 1280) is None  # 1.25 s left: not worth parts, the rest goes whole
    assert em._rows_for(a, 1281) == 128
    # a part of a batch that goes in parts: at the pace to its end, whatever is left, but a
    # rest of at most one and a half parts goes as one
    assert em._rows_for(a, 1000, whole=5000) == 128
    assert em._rows_for(a, 193, whole=5000) == 128
    assert em._rows_for(a, 192, whole=5000) is None
    assert em._rows_for(b, 1281) == 512  # not measured yet: a first part
    # the fixed cost counts: 0.25 s a call plus 1/1024 s a record is 1.25 s at 1024 records
    _warm(b.pace)
    b.pace.observe(256, 0.5)
    b.pace.observe(512, 0.75)
    assert (b.pace.fixed_s, b.pace.per_record_s) == (0.25, 1 / 1024)
    assert em._rows_for(b, 1024) is None
    assert em._rows_for(b, 1025) == 256  # twice the fixed cost: 0.25 s of records


def test_a_receiver_faster_than_slow_record_s_gets_whole_batches():
    assert CallPace.SLOW_RECORD_S == 1e-4
    em = _emitter("rebalance", 2, target_s=0.125)
    fast, slow = em.edges[0][1]
    _measure(em, [1 / 16384, 1 / 8192])  # 61 us and 122 us a record
    assert fast.pace.rows() == 2048  # what its pace alone would allow
    assert em._rows_for(fast, 10 ** 6) is None and em._rows_for(fast, 0) is None
    assert em._rows_for(slow, 10 ** 6) == 1024 and em._rows_for(slow, 0) == 10240
    assert em.batch_rows() is None  # the fast channel takes any batch whole


def test_waited_s_counts_the_chained_steps_waits_too():
    inner = _emitter("rebalance", 2)
    inner.backpressure_s = 0.25
    outer = _emitter("forward", 1, local={("down", 0): _Chained(inner)})
    outer.backpressure_s = 0.5
    assert (inner.waited_s(), outer.waited_s()) == (0.25, 0.75)


def test_a_chained_step_answers_for_its_own_outputs():
    inner = _emitter("rebalance", 2)
    _measure(inner, [0.001, 0.001])
    outer = _emitter("forward", 1, local={("down", 0): _Chained(inner)})
    assert outer.batch_rows() == 2 * 100 * 10
    sink = Emitter(("s", 0), [], {}, 1 << 30, 16, batch_target_s=0.1)  # a sink: no outputs
    assert _emitter("forward", 1, local={("down", 0): _Chained(sink)}).batch_rows() is None
