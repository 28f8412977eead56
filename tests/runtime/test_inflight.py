"""Unaligned checkpoints' pure parts: which in-flight batches a restore hands to which
instance, and when a task snapshots (no Ray)."""

from __future__ import annotations

import pytest

from rayflow.core.messages import Barrier
from rayflow.core.records import Batch
from rayflow.runtime.alignment import Abandoned, Aligned, BarrierAligner
from rayflow.runtime.inflight import UnalignedHandle, replay, state_of


def _b(*items):
    return Batch(list(items), None, 0.0)


def _items(got):
    return {k: [x for _, b in v for x in b.items] for k, v in sorted(got.items())}


def test_replay_hands_each_receiver_what_it_had_not_handled_in_send_order():
    handles = {
        ("s", 0): UnalignedHandle("p0", {("k", 0): ((4, _b(1)), (5, _b(2)), (7, _b(3))),
                                         ("k", 1): ((2, _b(10)),)}),
        ("s", 1): UnalignedHandle("p1", {("k", 0): ((0, _b(20)), (1, _b(21)))}),
        ("k", 0): UnalignedHandle("w0", {}, {("s", 0): 5, ("s", 1): 0}),
        ("k", 1): UnalignedHandle("w1", {}, {("s", 0): 3}),
    }
    got = replay(handles, frozenset(), {"s": 2, "k": 2}, {})
    # k0 had handled s0's messages up to 4 and none of s1's; k1 had handled s0's 2 already
    assert _items(got) == {("k", 0): [2, 3, 20, 21]}
    assert [sender for sender, _ in got[("k", 0)]] == [("s", 0)] * 2 + [("s", 1)] * 2
    assert [state_of(h) for h in handles.values()] == ["p0", "p1", "w0", "w1"]


def test_a_finished_receiver_gets_nothing_and_a_receiver_without_positions_is_an_error():
    handles = {("s", 0): UnalignedHandle(0, {("k", 0): ((0, _b(1)),)}), ("k", 0): "final"}
    assert replay(handles, frozenset({("k", 0)}), {"k": 1}, {}) == {}
    with pytest.raises(ValueError, match=r"\('k', 0\) holds no channel positions"):
        replay(handles, frozenset(), {"k": 1}, {})


def test_rescaled_receivers_get_the_batches_where_their_edge_sends_them_now():
    handles = {("s", 0): UnalignedHandle(0, {("k", 0): ((0, _b(*range(12))),),
                                             ("m", 0): ((0, _b("a")), (1, _b("b")), (2, _b("c")))}),
               ("k", 0): UnalignedHandle(0), ("m", 0): UnalignedHandle(0)}
    routes = {("s", "k"): ("hash", lambda x: x), ("s", "m"): ("rebalance", None)}
    got = replay(handles, frozenset(), {"k": 3, "m": 2}, routes)
    from rayflow.core.records import stable_hash

    for j in range(3):  # each record goes to the instance its key hashes to
        assert sorted(x for _, b in got.get(("k", j), []) for x in b.items) == \
            [x for x in range(12) if stable_hash(x) % 3 == j]
    assert _items({k: v for k, v in got.items() if k[0] == "m"}) == \
        {("m", 0): ["a", "c"], ("m", 1): ["b"]}
    with pytest.raises(ValueError, match="broadcast batches in flight"):
        replay(handles, frozenset(), {"k": 1, "m": 2}, {("s", "m"): ("broadcast", None)})


def test_a_late_out_of_band_barrier_blocks_the_input_whose_channel_reached_it():
    o = BarrierAligner([("a", 0), ("b", 0)])
    assert o.on_barrier(Barrier(1), ("a", 0)) == []  # a's queue drained to the barrier
    assert o.is_blocked(("a", 0)) and not o.is_blocked(("b", 0))
    # b's, out of band
    assert o.on_barrier(Barrier(1), ("b", 0), block=False) == [Aligned(Barrier(1))]
    assert not o.is_blocked(("a", 0))
    assert o.on_barrier(Barrier(1), ("b", 0)) == []  # b's copy, later: nothing to do
    assert not o.is_blocked(("b", 0))


def test_an_ended_input_is_not_waited_for_and_a_newer_barrier_abandons_the_older():
    o = BarrierAligner([("a", 0), ("b", 0)])
    assert o.on_barrier(Barrier(1), ("a", 0)) == []
    # 1 was aborted upstream of b
    assert o.on_barrier(Barrier(2), ("b", 0), block=False) == [Abandoned(1)]
    assert not o.is_blocked(("a", 0))
    assert o.on_end(("a", 0)) == [Aligned(Barrier(2))]
    # a ended: b alone
    assert o.on_barrier(Barrier(3), ("b", 0), block=False) == [Aligned(Barrier(3))]
    assert o.on_barrier(Barrier(2), ("b", 0), block=False) == []  # stale
