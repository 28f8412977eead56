"""The Nexmark generator against the specification's rules, computed independently here."""

from collections import Counter

import numpy as np
import pytest

from rayflow.nexmark import NexmarkConfig, NexmarkGenerator, max_delay_s
from rayflow.nexmark.generator import COLUMNS, KINDS, event_time_s

N = 5000


def _gen(**kw):
    return NexmarkGenerator(NexmarkConfig(seed=11, **kw))


def test_one_person_three_auctions_46_bids_in_every_50_events():
    kinds = [e["kind"] for e in _gen().rows(range(N))]
    assert Counter(kinds) == {"person": N // 50, "auction": 3 * N // 50, "bid": 46 * N // 50}
    assert kinds[:5] == ["person", "auction", "auction", "auction", "bid"]
    assert kinds[50:54] == ["person", "auction", "auction", "auction"]


def test_ids_are_consecutive_from_1000_and_references_point_at_existing_or_leading_ids():
    events = _gen().rows(range(N))
    people = [e["id"] for e in events if e["kind"] == "person"]
    auctions = [e["id"] for e in events if e["kind"] == "auction"]
    assert people == list(range(1000, 1000 + N // 50))
    assert auctions == list(range(1000, 1000 + 3 * N // 50))
    n_people = n_auctions = 0
    for e in events:
        if e["kind"] == "person":
            n_people += 1
        elif e["kind"] == "auction":
            n_auctions += 1
            assert 10 <= e["category"] <= 14
            assert e["reserve"] > e["initial_bid"] > 0
            assert e["expires"] > e["date_time"]
            assert 1000 <= e["seller"] < 1000 + n_people + 10
        else:
            # a bid is for an auction of the last 100 in flight (or a few ahead), by one of
            # the last 1000 people (or a few ahead)
            assert max(0, n_auctions - 1 - 100) + 1000 <= e["auction"] <= 1000 + n_auctions + 10
            assert max(0, n_people - 1000) + 1000 <= e["bidder"] < 1000 + n_people + 10
            assert 1 <= e["price"] <= 100_000_000


def test_most_bids_go_to_hot_auctions_and_come_from_hot_bidders():
    bids = [e for e in _gen().rows(range(50_000)) if e["kind"] == "bid"]
    hot_auction = np.mean([(b["auction"] - 1000) % 100 == 0 for b in bids])
    hot_bidder = np.mean([(b["bidder"] - 1000) % 100 == 1 for b in bids])
    # P(hot) = 1 - 1/2 and 1 - 1/4, plus the cold draws that hit a hot id
    assert 0.48 < hot_auction < 0.56
    assert 0.73 < hot_bidder < 0.80


def test_event_times_advance_by_the_inter_event_delay():
    gen = _gen(first_event_rate=200.0)
    times = [e["date_time"] for e in gen.rows(range(1000))]
    base = gen.config.base_time_ms
    assert times == [base + (i * 5000) // 1000 for i in range(1000)]


def test_an_event_depends_on_its_number_and_the_seed_only():
    gen = _gen(out_of_order_group_size=8)
    whole = gen.rows(range(600))
    assert gen.rows(range(1, 600, 3)) == whole[1::3]
    assert gen.rows(np.arange(599, -1, -1)) == whole[::-1]
    assert _gen(out_of_order_group_size=8).rows(range(600)) == whole
    other = NexmarkGenerator(NexmarkConfig(seed=12, out_of_order_group_size=8)).rows(range(600))
    assert [e["kind"] for e in other] == [e["kind"] for e in whole]  # same ids and times
    assert other != whole  # other random choices


def test_out_of_order_groups_shuffle_ids_and_times_within_each_group():
    g = 16
    ordered = _gen(first_event_rate=1000.0).rows(range(32 * g))
    shuffled_gen = _gen(first_event_rate=1000.0, out_of_order_group_size=g)
    shuffled = shuffled_gen.rows(range(32 * g))
    for lo in range(0, 32 * g, g):
        b = shuffled[lo:lo + g]
        assert b != ordered[lo:lo + g]
        # the same events, in another order: n takes number (n // g) * g + (n * 953) % g
        perm = [lo + (n * 953) % g for n in range(lo, lo + g)]
        assert b == [ordered[p] for p in perm]
    times = [e["date_time"] for e in shuffled]
    assert times != sorted(times)
    for n in range(len(times)):
        assert shuffled_gen.watermark_ms(n) <= min(times[n:])
        assert max(times[:n + 1]) - times[n] <= max_delay_s(shuffled_gen.config) * 1000


def test_the_arrow_batch_holds_the_same_events_as_the_rows():
    gen = _gen(out_of_order_group_size=4)
    table = gen.batch(np.arange(300, 700))
    assert table.column_names == list(COLUMNS)
    for row, full in zip(gen.rows(range(300, 700)), table.to_pylist()):
        assert KINDS[full["kind"]] == row["kind"]
        assert {k: full[k] for k in row if k != "kind"} == {k: v for k, v in row.items()
                                                             if k != "kind"}
    assert gen.batch(np.arange(0)).num_rows == 0


@pytest.mark.parametrize("kw, what", [
    ({"out_of_order_group_size": 0}, "out_of_order_group_size must be >= 1"),
    ({"out_of_order_group_size": 953 * 2}, "multiple of 953"),
    ({"first_event_rate": 0}, "first_event_rate must be a number > 0"),
    ({"bid_proportion": 2.5}, "bid_proportion must be an int"),
])
def test_a_bad_configuration_names_the_field(kw, what):
    with pytest.raises(ValueError, match=what):
        NexmarkConfig(**kw)


def test_unknown_options_and_bad_numbers_are_errors():
    with pytest.raises(TypeError, match="out_of_order"):
        NexmarkConfig(out_of_order=4)
    with pytest.raises(ValueError, match="event numbers must be >= 0"):
        _gen().rows([-1])
    with pytest.raises(TypeError, match="NexmarkConfig"):
        NexmarkGenerator({"seed": 1})


def test_event_times_without_the_events_equal_the_events_times():
    gen = _gen(out_of_order_group_size=4)
    numbers = np.arange(5, 2000, 3)
    assert gen.event_times_s(numbers).tolist() == [event_time_s(e) for e in gen.rows(numbers)]
