"""The Nexmark event generator: people, auctions and bids of an online auction site.

It follows the Nexmark benchmark's generator (the ``NexmarkGenerator`` and
``GeneratorConfig`` of the nexmark/nexmark suite): out of every 50 events 1 is a new person,
3 are new auctions and 46 are bids; ids start at 1000 and categories at 10; a bid goes to a
"hot" auction (the first of the latest 100) with probability 1 - 1/``hot_auction_ratio``,
otherwise to one of the ~100 auctions still in flight; bidders and sellers are chosen the same
way among the 1000 active people; prices are ``round(10 ** (6 u) * 100)`` cents; an auction
lasts a random time averaging the time until 100 more auctions exist.

Event ``n`` (n = 0, 1, 2, ...) takes the *adjusted* number
``a = (n // g) * g + (n * 953) % g`` of its out-of-order group of ``g`` events, and both its
id and its event time come from ``a``: within each group of ``g`` consecutive events the event
times are shuffled, and the minimum event time of all events from ``n`` on is the time of the
group's first number. With ``g = 1`` (the suite's default) events are in order.

Unlike the reference, which draws each event from ``java.util.Random(eventId)``, every random
choice here is a counter-based hash of ``(seed, event number, field)``: an event depends on
its number and the configuration only, so any instance of a parallel source, a reference
implementation or a Kafka pre-fill makes the same events, in vectorized numpy.

    >>> gen = NexmarkGenerator(NexmarkConfig(seed=7))
    >>> [e["kind"] for e in gen.rows(range(0, 5))]
    ['person', 'auction', 'auction', 'auction', 'bid']
    >>> gen.rows([0])[0]["id"], gen.rows([1])[0]["id"]
    (1000, 1000)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_AUCTION_RATIO = 100  # hot auctions are the first of each block of this many
HOT_BIDDER_RATIO = 100
HOT_SELLER_RATIO = 100
_OUT_OF_ORDER_STRIDE = 953

PERSON, AUCTION, BID = 0, 1, 2
KINDS = ("person", "auction", "bid")

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

#: The columns of an event batch (one flat schema for the three kinds; a column a kind does
#: not have holds 0 or ""). ``id`` is the person id of a person and the auction id of an
#: auction; times are milliseconds since the epoch.
COLUMNS = ("kind", "date_time", "id", "name", "email_address", "credit_card", "city", "state",
           "item_name", "initial_bid", "reserve", "expires", "seller", "category", "auction",
           "bidder", "price", "channel", "url")


@dataclass(frozen=True)
class NexmarkConfig:
    """What the generator makes (the defaults are the Nexmark suite's).

    Args:
        seed: seeds every random choice; equal seeds make equal events.
        first_event_rate: events per second of *event time* (the suite's
            ``nexmark.rate.limited``-free default, 10,000/s: one event every 100 us).
        base_time_ms: event time of event 0, ms since the epoch.
        out_of_order_group_size: events whose event times are shuffled among themselves.
        person_proportion, auction_proportion, bid_proportion: the mix of events.
        num_active_people: people that bidders and sellers are drawn from.
        num_in_flight_auctions: open auctions that a cold bid is drawn from.
        hot_auction_ratio, hot_bidders_ratio, hot_sellers_ratio: a bid goes to a hot auction
            (is by a hot bidder; an auction by a hot seller) with probability ``1 - 1/ratio``.
    """

    seed: int = 0
    first_event_rate: float = 10_000.0
    base_time_ms: int = 1_436_918_400_000  # 2015-07-15, the suite's base time
    out_of_order_group_size: int = 1
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_bidders_ratio: int = 4
    hot_sellers_ratio: int = 4

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "first_event_rate":
                if not isinstance(v, (int, float)) or not v > 0:
                    raise ValueError(f"NexmarkConfig.first_event_rate must be a number > 0, "
                                     f"got {v!r}")
                continue
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ValueError(f"NexmarkConfig.{f.name} must be an int, got {v!r}")
            if f.name not in ("seed", "base_time_ms") and v < 1:
                raise ValueError(f"NexmarkConfig.{f.name} must be >= 1, got {v!r}")
        if self.out_of_order_group_size % _OUT_OF_ORDER_STRIDE == 0:
            raise ValueError(f"NexmarkConfig.out_of_order_group_size must not be a multiple "
                             f"of {_OUT_OF_ORDER_STRIDE} (the shuffle would not be a "
                             f"permutation)")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    @property
    def inter_event_delay_us(self) -> float:
        return 1e6 / self.first_event_rate


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class NexmarkGenerator:
    """Makes the events of given numbers, as an Arrow table (:meth:`batch`) or as dicts
    (:meth:`rows`). Picklable; holds no position: a source asks for the numbers it wants."""

    def __init__(self, config: NexmarkConfig | None = None):
        self.config = config or NexmarkConfig()
        if not isinstance(self.config, NexmarkConfig):
            raise TypeError(f"NexmarkGenerator takes a NexmarkConfig, got {config!r}")

    # -- numbering ---------------------------------------------------------------------------

    def adjusted_numbers(self, n: np.ndarray) -> np.ndarray:
        """The adjusted number of event ``n``: its id and event time come from it."""
        g = self.config.out_of_order_group_size
        return (n // g) * g + (n * _OUT_OF_ORDER_STRIDE) % g

    def timestamps_ms(self, numbers: np.ndarray) -> np.ndarray:
        """Event time (ms since the epoch) of the given adjusted numbers."""
        c = self.config
        return c.base_time_ms + np.floor(numbers * c.inter_event_delay_us / 1000.0
                                         ).astype(np.int64)

    def event_times_s(self, n: np.ndarray) -> np.ndarray:
        """Event times (s) of the events numbered ``n``: their ``date_time`` / 1000, as
        :func:`event_time_s` gives them, without making the events."""
        return self.timestamps_ms(self.adjusted_numbers(np.asarray(n, dtype=np.int64))) / 1000.0

    def watermark_ms(self, n: int) -> int:
        """The minimum event time of events ``n, n + 1, ...`` (the start of n's group)."""
        g = self.config.out_of_order_group_size
        return int(self.timestamps_ms(np.array([(n // g) * g]))[0])

    def kinds(self, n: Iterable[int] | np.ndarray) -> np.ndarray:
        """PERSON, AUCTION or BID for each event number."""
        a = self.adjusted_numbers(np.asarray(n, dtype=np.int64)) % self.config.total_proportion
        c = self.config
        return np.where(a < c.person_proportion, PERSON,
                        np.where(a < c.person_proportion + c.auction_proportion, AUCTION, BID))

    def _last_person(self, eid: np.ndarray) -> np.ndarray:
        c = self.config
        epoch, off = eid // c.total_proportion, eid % c.total_proportion
        off = np.minimum(off, c.person_proportion - 1)
        return epoch * c.person_proportion + off

    def _last_auction(self, eid: np.ndarray) -> np.ndarray:
        c = self.config
        epoch, off = eid // c.total_proportion, eid % c.total_proportion
        is_person = off < c.person_proportion
        is_bid = off >= c.person_proportion + c.auction_proportion
        epoch = np.where(is_person, epoch - 1, epoch)
        off = np.where(is_person | is_bid, c.auction_proportion - 1, off - c.person_proportion)
        return epoch * c.auction_proportion + off

    # -- randomness --------------------------------------------------------------------------

    def _uniform(self, eid: np.ndarray, field: int) -> np.ndarray:
        """A uniform double in [0, 1) per event and field."""
        key = np.uint64((self.config.seed * 0x9E3779B97F4A7C15 + field * 0xD1B54A32D192ED03)
                        & 0xFFFFFFFFFFFFFFFF)
        h = _mix(_mix(eid.astype(np.uint64) ^ key) + np.uint64(field))
        return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2.0**53)

    def _below(self, eid: np.ndarray, field: int, bound) -> np.ndarray:
        """A uniform int in [0, bound) per event and field."""
        b = np.asarray(bound, dtype=np.int64)
        return np.minimum((self._uniform(eid, field) * b).astype(np.int64), b - 1)

    def _price(self, eid: np.ndarray, field: int) -> np.ndarray:
        return np.round(10.0 ** (self._uniform(eid, field) * 6.0) * 100.0).astype(np.int64)

    def _next_person(self, eid: np.ndarray, field: int) -> np.ndarray:
        num = self._last_person(eid) + 1
        active = np.minimum(num, self.config.num_active_people)
        return num - active + self._below(eid, field, active + PERSON_ID_LEAD)

    def _next_auction(self, eid: np.ndarray, field: int) -> np.ndarray:
        last = self._last_auction(eid)
        lo = np.maximum(last - self.config.num_in_flight_auctions, 0)
        return lo + self._below(eid, field, last - lo + 1 + AUCTION_ID_LEAD)

    # -- events ------------------------------------------------------------------------------

    def columns(self, n: Iterable[int] | np.ndarray, *, urls: bool = True
                ) -> dict[str, np.ndarray]:
        """The events numbered ``n`` as numpy columns (see :data:`COLUMNS`); without
        ``urls`` the ``url`` column is left out (:meth:`batch` builds it in Arrow)."""
        c = self.config
        n = np.asarray(n, dtype=np.int64)
        if n.ndim != 1:
            raise ValueError(f"NexmarkGenerator: event numbers must be 1-d, got shape {n.shape}")
        if n.size and n.min() < 0:
            raise ValueError("NexmarkGenerator: event numbers must be >= 0")
        eid = self.adjusted_numbers(n)
        ts = self.timestamps_ms(eid)
        rem = eid % c.total_proportion
        kind = np.where(rem < c.person_proportion, PERSON,
                        np.where(rem < c.person_proportion + c.auction_proportion, AUCTION, BID))
        person, auction, bid = kind == PERSON, kind == AUCTION, kind == BID
        zeros = np.zeros(n.size, dtype=np.int64)

        # people
        pid = self._last_person(eid) + FIRST_PERSON_ID
        first = self._below(eid, 1, len(FIRST_NAMES))
        last = self._below(eid, 2, len(LAST_NAMES))
        city = self._below(eid, 3, len(US_CITIES))
        state = self._below(eid, 4, len(US_STATES))
        card = self._below(eid, 5, 10**16)

        # auctions
        aid = self._last_auction(eid) + FIRST_AUCTION_ID
        hot_seller = self._below(eid, 6, c.hot_sellers_ratio) > 0
        seller = np.where(hot_seller,
                          (self._last_person(eid) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO,
                          self._next_person(eid, 7)) + FIRST_PERSON_ID
        category = FIRST_CATEGORY_ID + self._below(eid, 8, NUM_CATEGORIES)
        initial = self._price(eid, 9)
        reserve = initial + self._price(eid, 10)
        ahead = (c.num_in_flight_auctions * c.total_proportion) // c.auction_proportion
        horizon = self.timestamps_ms(eid + ahead) - ts
        expires = ts + 1 + self._below(eid, 11, np.maximum(horizon * 2, 1))

        # bids
        hot_auction = self._below(eid, 12, c.hot_auction_ratio) > 0
        b_auction = np.where(hot_auction,
                             (self._last_auction(eid) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO,
                             self._next_auction(eid, 13)) + FIRST_AUCTION_ID
        hot_bidder = self._below(eid, 14, c.hot_bidders_ratio) > 0
        bidder = np.where(hot_bidder,
                          (self._last_person(eid) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1,
                          self._next_person(eid, 15)) + FIRST_PERSON_ID
        price = self._price(eid, 16)
        chan = self._below(eid, 17, len(CHANNELS))

        return {
            "kind": kind.astype(np.int8),
            "date_time": ts,
            "id": np.where(person, pid, np.where(auction, aid, zeros)),
            "name": _strings(person, lambda i: _NAMES[first[i] * len(LAST_NAMES) + last[i]]),
            "email_address": _strings(person, lambda i: _EMAILS[first[i] * len(LAST_NAMES)
                                                                + last[i]]),
            "credit_card": _strings(person, lambda i: [f"{v:016d}" for v in card[i].tolist()]),
            "city": _strings(person, lambda i: _CITIES[city[i]]),
            "state": _strings(person, lambda i: _STATES[state[i]]),
            "item_name": _strings(auction, lambda i: [f"item-{v}" for v in aid[i].tolist()]),
            "initial_bid": np.where(auction, initial, zeros),
            "reserve": np.where(auction, reserve, zeros),
            "expires": np.where(auction, expires, zeros),
            "seller": np.where(auction, seller, zeros),
            "category": np.where(auction, category, zeros),
            "auction": np.where(bid, b_auction, zeros),
            "bidder": np.where(bid, bidder, zeros),
            "price": np.where(bid, price, zeros),
            "channel": _strings(bid, lambda i: _CHANNELS[chan[i]]),
            **({"url": _strings(bid, lambda i: [_URL + str(v) for v in b_auction[i].tolist()])}
               if urls else {}),
        }

    def batch(self, n: Iterable[int] | np.ndarray):
        """The events numbered ``n`` as an Arrow table (columns :data:`COLUMNS`)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        cols = self.columns(n, urls=False)
        table = {k: pa.array(v, pa.string()) if v.dtype == object else pa.array(v)
                 for k, v in cols.items()}
        urls = pc.binary_join_element_wise(_URL, pc.cast(table["auction"], pa.string()), "")
        table["url"] = pc.if_else(pc.equal(table["kind"], BID), urls, "")
        return pa.table(table)

    def rows(self, n: Iterable[int] | np.ndarray) -> list[dict[str, Any]]:
        """The events numbered ``n`` as dicts: the fields of their kind, plus ``kind``
        (``"person"``, ``"auction"`` or ``"bid"``) and ``date_time`` (ms since the epoch)."""
        cols = self.columns(np.asarray(list(n) if not isinstance(n, np.ndarray) else n,
                                       dtype=np.int64))
        lists = {k: v.tolist() for k, v in cols.items()}
        out = []
        for i, k in enumerate(lists["kind"]):
            out.append({f: lists[f][i] for f in ("kind", "date_time", *_FIELDS[k])})
            out[-1]["kind"] = KINDS[k]
        return out


_NAMES = np.array([f"{a} {b}" for a in FIRST_NAMES for b in LAST_NAMES], dtype=object)
_EMAILS = np.array([f"{a.lower()}.{b.lower()}@example.com" for a in FIRST_NAMES
                    for b in LAST_NAMES], dtype=object)
_CITIES = np.array(US_CITIES, dtype=object)
_STATES = np.array(US_STATES, dtype=object)
_CHANNELS = np.array(CHANNELS, dtype=object)
_URL = "https://www.nexmark.com/item/"


def _strings(mask: np.ndarray, make) -> np.ndarray:
    """A string column: ``make(indices)`` where ``mask`` holds, "" elsewhere (only the rows of
    one kind are built)."""
    out = np.full(mask.size, "", dtype=object)
    idx = np.flatnonzero(mask)
    if idx.size:
        out[idx] = make(idx)
    return out


_FIELDS = {
    PERSON: ("id", "name", "email_address", "credit_card", "city", "state"),
    AUCTION: ("id", "item_name", "initial_bid", "reserve", "expires", "seller", "category"),
    BID: ("auction", "bidder", "price", "channel", "url"),
}


def event_time_s(event: dict[str, Any]) -> float:
    """An event's event time in seconds (the timestamp function for ``EventTime``)."""
    return event["date_time"] / 1000.0
