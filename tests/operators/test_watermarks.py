"""Watermark tracking without Ray: per-split generation at sources, the minimum over inputs
downstream, idleness, and the checkpointed state."""

import math

import numpy as np
import pytest

from rayflow.core.messages import Watermark
from rayflow.core.operators import Rescaled
from rayflow.operators.watermarks import (
    InputWatermarks,
    SourcePosition,
    SplitWatermarks,
    split_position,
)


def test_instance_watermark_is_the_minimum_over_splits_minus_the_delay():
    gen = SplitWatermarks(2.0, None, splits=[0, 1])
    gen.observe(np.array([0, 0, 1]), [5.0, 30.0, 12.0], now=0.0)
    assert gen.advance(0.0) == Watermark(10.0)  # min(30, 12) - 2
    gen.observe(1, [11.0], now=0.0)  # out of order on split 1: no change
    assert gen.advance(0.0) is None
    gen.observe(1, [40.0], now=0.0)
    assert gen.advance(0.0) == Watermark(28.0)  # now split 0 holds it


def test_a_split_without_records_holds_the_watermark_until_it_is_idle():
    gen = SplitWatermarks(0.0, 5.0, splits=["a", "b"], now=100.0)
    gen.observe("a", [50.0], now=103.0)
    assert gen.advance(104.9) is None  # "b" has said nothing: -inf
    assert gen.advance(105.0) == Watermark(50.0)  # "b" idle: left out, no wall-clock jump
    gen.observe("a", [60.0], now=106.0)
    assert gen.advance(106.0) == Watermark(60.0)
    # both idle: the instance says so once, with its last watermark
    assert gen.advance(111.0) == Watermark(60.0, idle=True)
    assert gen.advance(200.0) is None
    gen.observe("b", [20.0], now=201.0)
    assert gen.wake() == Watermark(60.0, idle=False)  # active again, never backwards
    assert gen.advance(201.0) is None  # "b" at 20 and "a" idle: nothing new


def test_a_split_without_records_turning_idle_with_the_last_one_holds_nothing_back():
    """A split with no record whose idle clock started with the other's last record: both
    turn idle at the same moment. The watermark the other reached goes out first, as if the
    empty split had turned idle a moment earlier; then the idle status."""
    gen = SplitWatermarks(0.0, 1.0, splits=[])
    gen.set_splits([0, 1], now=10.0)
    gen.observe(0, [19.9], now=10.0)  # the first poll brought every record of split 0
    assert gen.advance(10.5) is None  # split 1 has said nothing yet: -inf
    assert gen.advance(11.0) == Watermark(19.9)  # both idle now: 0's watermark first
    assert gen.advance(11.1) == Watermark(19.9, idle=True)
    assert gen.advance(12.0) is None


def test_all_idle_takes_the_splits_that_turned_idle_last():
    gen = SplitWatermarks(1.0, 1.0, splits=["a", "b"], now=0.0)
    gen.observe("a", [30.0], now=0.0)
    gen.observe("b", [12.0], now=0.5)  # "b" had a record later than "a"
    assert gen.advance(0.5) == Watermark(11.0)  # min(30, 12) - 1
    assert gen.advance(1.0) is None  # "a" idle at 1.0: "b" alone, still 11
    # "b" turned idle last: its watermark stands, not "a"'s higher one
    assert gen.advance(1.5) == Watermark(11.0, idle=True)


def test_no_splits_means_idle_at_once():
    gen = SplitWatermarks(1.0, 5.0, splits=[])
    assert gen.advance(0.0) == Watermark(-math.inf, idle=True)


def test_split_ids_must_match_the_records():
    gen = SplitWatermarks(0.0, None)
    with pytest.raises(ValueError, match="2 split ids for 3 records"):
        gen.observe(np.array([0, 1]), [1.0, 2.0, 3.0], now=0.0)
    with pytest.raises(ValueError, match="max_delay_s must be >= 0"):
        SplitWatermarks(-1.0, None)


def test_snapshot_restores_every_split():
    gen = SplitWatermarks(1.0, None, splits=[0, 1])
    gen.observe(np.array([0, 1]), [10.0, 20.0], now=0.0)
    gen.advance(0.0)
    again = SplitWatermarks(1.0, None, splits=[0, 1], state=gen.snapshot())
    assert again.emitted == 9.0
    again.observe(0, [15.0], now=0.0)
    assert again.advance(0.0) == Watermark(14.0)


def test_input_minimum_forwards_only_when_it_advances():
    valve = InputWatermarks(["l", "r"])
    assert valve.update("l", Watermark(10.0)) is None
    assert valve.update("r", Watermark(4.0)) == Watermark(4.0)
    assert valve.update("r", Watermark(3.0)) is None  # a late, lower watermark is ignored
    assert valve.update("r", Watermark(12.0)) == Watermark(10.0)
    assert valve.update("l", Watermark(11.0)) == Watermark(11.0)


def test_idle_and_finished_inputs_leave_the_minimum():
    valve = InputWatermarks(["l", "r"])
    valve.update("l", Watermark(10.0))
    assert valve.update("r", Watermark(2.0, idle=True)) == Watermark(10.0)
    assert valve.update("l", Watermark(10.0, idle=True)) == Watermark(10.0, idle=True)
    assert valve.update("r", Watermark(2.0)) == Watermark(10.0)  # active; no going back
    assert valve.update("r", Watermark(15.0)) == Watermark(15.0)  # "l" idle: "r" alone
    assert valve.update("l", Watermark(12.0)) is None  # "l" back, behind: no going back
    assert valve.update("l", Watermark(20.0)) is None  # min(20, 15) is where we are
    assert valve.update("r", Watermark(25.0)) == Watermark(20.0)


def test_finished_input():
    valve = InputWatermarks(["l", "r"])
    valve.update("l", Watermark(30.0))
    valve.update("r", Watermark(5.0))
    assert valve.finish("r") == Watermark(30.0)
    assert valve.finish("l") is None  # all finished: end of stream says the rest
    with pytest.raises(KeyError, match="not an input"):
        valve.update("x", Watermark(1.0))


def test_split_position_unwraps_plain_wrapped_and_rescaled_states():
    assert split_position({0: 5}) == ({0: 5}, None)
    pos = SourcePosition({0: 5}, {"max_seen": {0: 3.0}, "emitted": 2.0})
    assert split_position(pos) == ({0: 5}, {"max_seen": {0: 3.0}, "emitted": 2.0})
    old = Rescaled((pos, SourcePosition({1: 7}, {"max_seen": {1: 9.0, 0: 1.0},
                                                 "emitted": 8.0})), 2)
    resc, state = split_position(old)
    assert resc == Rescaled(({0: 5}, {1: 7}), 2)
    assert state == {"max_seen": {0: 3.0, 1: 9.0}, "emitted": -math.inf}


def test_one_inputs_watermark_is_the_minimum_of_its_senders_until_they_finish():
    """``of``: the watermark of one input of a step with several (a lookup join's table):
    an idle sender still holds it (it may wake with records from its last watermark), a
    finished one no longer does, one that has said nothing holds it at NEVER."""
    from rayflow.operators.watermarks import NEVER

    table, stream = [("t", 0), ("t", 1)], [("s", 0)]
    valve = InputWatermarks(table + stream)
    assert valve.of(table) == NEVER
    valve.update(("t", 0), Watermark(5.0))
    valve.update(("s", 0), Watermark(1.0))
    assert valve.of(table) == NEVER and valve.of(stream) == 1.0
    valve.update(("t", 1), Watermark(8.0))
    assert valve.of(table) == 5.0
    valve.update(("t", 0), Watermark(5.0, True))  # idle: still holds the table at 5
    assert valve.of(table) == 5.0 and valve.current == 1.0
    valve.finish(("t", 0))
    assert valve.of(table) == 8.0
    valve.finish(("t", 1))
    assert valve.of(table) == math.inf and valve.of(stream) == 1.0
