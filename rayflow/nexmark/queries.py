"""Nexmark queries as rayflow flows, each beside a plain-Python reference.

Each :class:`Query` has ``build(events) -> stream`` (the flow's steps, from a stream of events
to the query's output) and ``reference(events) -> rows`` (the same query over a list of
event dicts, in one process, in any order); ``rows(output)`` turns what the flow's sink
collected into those rows, so a test compares the two exactly. The queries follow the
Nexmark suite's SQL (nexmark/nexmark, ``queries/q*.sql``):

- ``q0`` pass-through of the bids; ``q1`` bid prices in euros (``0.908 * price``);
  ``q2`` the bids of auctions whose id is a multiple of 123.
- ``q5`` hot items: per sliding window of 10 s every 2 s, the auctions with the most bids.
- ``q7`` highest bid: per tumbling window of 10 s, the bids at its highest price (the
  suite joins the maximum back to the bids of ``[end - 10 s, end]``, both ends included;
  here they are the window's own bids, ``[start, end)``).
- ``q8`` new users: people who opened an auction in the 10 s tumbling window in which they
  registered (a window join of people and auctions).
- ``q9`` winning bids: each auction with its highest bid placed while it was open (a keyed
  process function per auction that keeps its best bid and emits it on an event-time timer
  at its expiry).
- ``q11`` user sessions: bids per bidder and session (10 s gap).
- ``q16`` channel statistics: per channel and (UTC) day, the latest minute and the number
  of bids, distinct bidders and distinct auctions, in all and per price range (a tumbling
  window of a day: its result is the final state of the suite's unwindowed GROUP BY).
- ``q20`` expanded bids: each bid with its auction's fields, for auctions of category 10
  (a regular join: a bid before its auction waits for it).

- ``q3`` local item suggestion: category-10 auctions with their sellers from OR, ID or CA
  (a regular join, as q20). ``q4`` the average winning price per category (q9's winners,
  then a running average per category: an updating result whose last row per category is
  the query's).
- ``q12`` bids per bidder in 10 s *processing-time* windows: which window a bid falls in
  depends on when it is processed, so the reference compares each bidder's total.
- ``q13`` bounded side-input join: each bid with the value of ``auction % 10000`` in a side
  table (a lookup join on event time: the table is valid from the start).
- ``q14`` bid prices in euros between 1 M and 50 M with the time of day (the generator
  has no ``extra`` field, so neither has the output); ``q21`` bids with a channel id;
  ``q22`` bids with the directories of their URL (SQL's ``SPLIT_INDEX``: None past the end).
- ``q15`` per day, and ``q17`` per auction and day: counts by price range (q17 also min,
  max, average and sum of the prices), as day windows, like q16.
- ``q18`` the last bid of each bidder on each auction, ``q19`` each auction's ten highest
  bids (``ROW_NUMBER() ... <= n``): updating results from ``stateful_map``; each update
  carries how many bids its key had seen, and the last update of a key is the query's row.

Windows are half-open ``[start, end)`` in event time, in seconds; event times are the
events' ``date_time`` (ms) / 1000.

One module, over 1,000 lines, on purpose: it is the suite's catalogue, one section per
query, each flow next to the plain-Python reference it is tested against, in the suite's
order, so that a query and its reference are read (and reviewed) together.

    >>> from rayflow.nexmark.generator import NexmarkConfig, NexmarkGenerator
    >>> events = NexmarkGenerator(NexmarkConfig(seed=1)).rows(range(200))
    >>> len(QUERIES["q0"].reference(events))  # 46 of every 50 events are bids
    184
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from rayflow.nexmark.generator import BID
from rayflow.operators.process import KeyedProcessFunction
from rayflow.operators.windows import (
    Aggregator,
    Count,
    EventTime,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
)

EURO_RATE = 0.908  # q1: dollars to euros, as the suite
Q2_MODULUS = 123
Q5_LENGTH_S, Q5_SLIDE_S = 10, 2
Q7_LENGTH_S = 10
Q8_LENGTH_S = 10
Q11_GAP_S = 10
Q20_CATEGORY = 10


@dataclass(frozen=True)
class Query:
    """One Nexmark query: its flow steps, its reference and how to read its output.

    Attributes:
        name: ``q0`` ... ``q20``.
        description: one line.
        build: ``(events stream, columnar, config) -> output stream``; ``columnar`` says
            whether the events arrive as Arrow batches (else as dicts); ``config`` is the
            generator's :class:`~rayflow.nexmark.generator.NexmarkConfig`.
        reference: ``events (dicts) -> sorted output rows``.
        rows: ``collected sink output -> sorted output rows`` (the reference's form).
        event_time: whether the query needs watermarks on its source.
        late_output: (event-time queries) whether a step of it sends late events aside (a
            window's or a join's ``late`` output); a process function has none.
        arrow: the query as one function over an Arrow batch of events (the queries
            without state), used by the Arrow path; None for the others.
    """

    name: str
    description: str
    build: Callable[[Any, bool, Any], Any]
    reference: Callable[[list[dict]], list]
    rows: Callable[[Any], list]
    event_time: bool = False
    arrow: Callable[[Any], Any] | None = None
    late_output: bool = True

    @property
    def late(self) -> bool:
        """Whether the flow has late events to send to a ``late_sink``."""
        return self.event_time and self.late_output

    @property
    def columnar(self) -> bool:
        """Whether the query has an Arrow (vectorized) path."""
        return self.arrow is not None


def _is_person(event: dict) -> bool:
    """Filter: person events (a module function: picklable, and half the cost of a call
    to a callable object)."""
    return event["kind"] == "person"


def _is_auction(event: dict) -> bool:
    """Filter: auction events."""
    return event["kind"] == "auction"


def _is_bid(event: dict) -> bool:
    """Filter: bid events."""
    return event["kind"] == "bid"


def _as_dicts(out: Any) -> list[dict]:
    if isinstance(out, list):
        return out
    return out.to_pylist()


# -- q0, q1, q2: stateless --------------------------------------------------------------------

def _bids_arrow(table):
    import pyarrow.compute as pc

    return table.filter(pc.equal(table.column("kind"), BID))


_BID_COLUMNS = ("auction", "bidder", "price", "channel", "url", "date_time")


def _q0_arrow(table):
    return _bids_arrow(table).select(list(_BID_COLUMNS))


def _q0_row(e: dict) -> dict:
    return {k: e[k] for k in _BID_COLUMNS}


def _q0_build(events, columnar, config):
    if columnar:
        return events.map_batches("q0", _q0_arrow)
    return events.filter("bids", _is_bid).map("q0", _q0_row)


def _q0_reference(events):
    return sorted(tuple(e[k] for k in _BID_COLUMNS) for e in events if e["kind"] == "bid")


def _q0_rows(out):
    return sorted(tuple(r[k] for k in _BID_COLUMNS) for r in _as_dicts(out))


def _q1_arrow(table):
    import pyarrow as pa
    import pyarrow.compute as pc

    bids = _bids_arrow(table)
    euros = pc.multiply(pc.cast(bids.column("price"), pa.float64()), EURO_RATE)
    return pa.table({"auction": bids.column("auction"), "bidder": bids.column("bidder"),
                     "price": euros, "date_time": bids.column("date_time")})


def _q1_row(e: dict) -> dict:
    return {"auction": e["auction"], "bidder": e["bidder"], "price": EURO_RATE * e["price"],
            "date_time": e["date_time"]}


def _q1_build(events, columnar, config):
    if columnar:
        return events.map_batches("q1", _q1_arrow)
    return events.filter("bids", _is_bid).map("q1", _q1_row)


def _q1_reference(events):
    return sorted((e["auction"], e["bidder"], EURO_RATE * e["price"], e["date_time"])
                  for e in events if e["kind"] == "bid")


def _q1_rows(out):
    return sorted((r["auction"], r["bidder"], r["price"], r["date_time"])
                  for r in _as_dicts(out))


def _q2_arrow(table):
    import pyarrow.compute as pc

    bids = _bids_arrow(table)
    keep = pc.equal(pc.subtract(bids.column("auction"),
                                pc.multiply(pc.divide(bids.column("auction"), Q2_MODULUS),
                                            Q2_MODULUS)), 0)
    return bids.filter(keep).select(["auction", "price"])


def _q2_keep(e: dict) -> bool:
    return e["kind"] == "bid" and e["auction"] % Q2_MODULUS == 0


def _q2_row(e: dict) -> dict:
    return {"auction": e["auction"], "price": e["price"]}


def _q2_build(events, columnar, config):
    if columnar:
        return events.map_batches("q2", _q2_arrow)
    return events.filter("q2-filter", _q2_keep).map("q2", _q2_row)


def _q2_reference(events):
    return sorted((e["auction"], e["price"]) for e in events
                  if e["kind"] == "bid" and e["auction"] % Q2_MODULUS == 0)


def _q2_rows(out):
    return sorted((r["auction"], r["price"]) for r in _as_dicts(out))


# -- q5: hot items (sliding windows) ----------------------------------------------------------

def _auction_of(e: dict) -> int:
    return e["auction"]


def _window_end(r) -> float:
    return r.end


@dataclass(frozen=True)
class TopCounts(Aggregator[tuple]):
    """The largest count among window results and the keys that have it:
    ``(count, sorted keys)``."""

    def create(self):
        return (-1, ())

    def add(self, acc, record):
        n, keys = acc
        if record.value > n:
            return (record.value, (record.key,))
        if record.value == n:
            return (n, keys + (record.key,))
        return acc

    def merge(self, a, b):
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return (a[0], a[1] + b[1])

    def result(self, acc):
        return (acc[0], tuple(sorted(acc[1])))


def _q5_expand(r) -> list[tuple]:
    n, auctions = r.value
    end = r.key
    return [(end - Q5_LENGTH_S, end, a, n) for a in auctions]


def _q5_build(events, columnar, config):
    counts = (events.filter("bids", _is_bid).key_by(_auction_of)
              .window("q5-count", SlidingWindow(Q5_LENGTH_S, Q5_SLIDE_S), Count(),
                      clock=EventTime()))
    # every count of one window carries the window's last instant as its event time: a
    # tumbling window of one slide, keyed by the window's end, gathers exactly them
    top = counts.key_by(_window_end).window("q5-top", TumblingWindow(Q5_SLIDE_S), TopCounts(),
                                            clock=EventTime())
    return top.flat_map("q5", _q5_expand)


def _q5_reference(events):
    slide, length = Q5_SLIDE_S * 1000, Q5_LENGTH_S * 1000
    counts: Counter = Counter()
    for e in events:
        if e["kind"] != "bid":
            continue
        t = e["date_time"]
        start = (t // slide) * slide
        while start > t - length:
            counts[(start, e["auction"])] += 1
            start -= slide
    best: dict[int, int] = defaultdict(int)
    for (start, _), n in counts.items():
        best[start] = max(best[start], n)
    return sorted((start / 1000, (start + length) / 1000, a, n)
                  for (start, a), n in counts.items() if n == best[start])


def _q5_rows(out):
    return sorted(out)


# -- q7: highest bid (tumbling windows) -------------------------------------------------------

def _everything(e) -> int:
    return 0


@dataclass(frozen=True)
class MaxBy(Aggregator[tuple]):
    """The records with the largest ``field``: ``(value, [records])``."""

    field: str

    def create(self):
        return (-math.inf, [])

    def add(self, acc, record):
        v = record[self.field]
        if v > acc[0]:
            return (v, [record])
        if v == acc[0]:
            return (v, acc[1] + [record])
        return acc

    def merge(self, a, b):
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return (a[0], a[1] + b[1])


def _q7_expand(r) -> list[tuple]:
    return [(r.start, r.end, b["auction"], b["price"], b["bidder"], b["date_time"])
            for b in r.value[1]]


def _q7_build(events, columnar, config):
    return (events.filter("bids", _is_bid).key_by(_everything)
            .window("q7-max", TumblingWindow(Q7_LENGTH_S), MaxBy("price"), clock=EventTime())
            .flat_map("q7", _q7_expand))


def _q7_reference(events):
    length = Q7_LENGTH_S * 1000
    best: dict[int, list] = {}
    for e in events:
        if e["kind"] != "bid":
            continue
        start = (e["date_time"] // length) * length
        cur = best.get(start)
        if cur is None or e["price"] > cur[0]["price"]:
            best[start] = [e]
        elif e["price"] == cur[0]["price"]:
            cur.append(e)
    return sorted((s / 1000, (s + length) / 1000, b["auction"], b["price"], b["bidder"],
                   b["date_time"]) for s, bids in best.items() for b in bids)


def _q7_rows(out):
    return sorted(out)


# -- q8: new users (window join) --------------------------------------------------------------

def _person_id(e: dict) -> int:
    return e["id"]


def _seller(e: dict) -> int:
    return e["seller"]


def _q8_row(pair) -> tuple:
    _, person, _auction = pair
    start = (person["date_time"] // (Q8_LENGTH_S * 1000)) * Q8_LENGTH_S
    return (person["id"], person["name"], float(start))


def _person_window(row) -> tuple:
    return row[0], row[2]


class _OncePerWindow(KeyedProcessFunction):
    """Per (person, window): the first row, once, whatever the number of auctions they
    opened in it; the key's mark is dropped when the watermark passes the window's end
    (the join emits a window's rows before it forwards that watermark), so the state holds
    the windows being emitted, not every person ever seen."""

    def process_element(self, row, ctx):
        if ctx.state.value() is None:
            ctx.state.update(True)
            ctx.timers.register(event_time=row[2] + Q8_LENGTH_S)
            yield row

    def on_timer(self, key, ts, ctx):
        ctx.state.clear()


#: a keyed output ``(key, value)`` -> its value
_value_of = itemgetter(1)


def _q8_build(events, columnar, config):
    persons, rest = events.branch("persons", _is_person)
    auctions = rest.filter("auctions", _is_auction)
    joined = persons.key_by(_person_id).join("q8-join", auctions.key_by(_seller),
                                             TumblingWindow(Q8_LENGTH_S), clock=EventTime())
    return joined.map("q8-row", _q8_row).key_by(_person_window).process("q8", _OncePerWindow())


def _q8_reference(events):
    length = Q8_LENGTH_S * 1000
    people = {(e["id"], e["date_time"] // length): e["name"] for e in events
              if e["kind"] == "person"}
    sellers = {(e["seller"], e["date_time"] // length) for e in events if e["kind"] == "auction"}
    return sorted((pid, name, float(w * Q8_LENGTH_S)) for (pid, w), name in people.items()
                  if (pid, w) in sellers)


def _q8_rows(out):
    return sorted(out)


# -- q9: winning bids (a process function per auction, closed by an event-time timer) ------

_Q9_AUCTION = ("id", "item_name", "initial_bid", "reserve", "date_time", "expires", "seller",
               "category")
_q9_auction_fields = itemgetter(*_Q9_AUCTION)


def _after_ms(ms: int) -> float:
    """The event time (s) of the timer that fires once every event of ``ms`` has arrived: a
    record is late only when it is older than the watermark, so a timer at ``ms`` itself
    could fire before an on-time event of that very millisecond."""
    return (ms + 1) / 1000


def _better(auction: dict, best: dict | None, bid: dict) -> dict | None:
    """The winning bid of ``auction`` so far, ``bid`` considered: placed while it was open,
    highest price, then earliest, then lowest bidder (the suite orders by price
    descending, then time)."""
    if not auction["date_time"] <= bid["date_time"] <= auction["expires"]:
        return best
    if best is None or (-bid["price"], bid["date_time"], bid["bidder"]) < (
            -best["price"], best["date_time"], best["bidder"]):
        return bid
    return best


class WinningBids(KeyedProcessFunction):
    """q9 per auction id: the state is ``(auction, best bid, bids that came before their
    auction)``. The auction's timer, just after it expires, emits the winner and clears the
    key; a bid whose auction has not come sets a timer just after its own time, when the
    watermark has passed every auction that could have held it, and is dropped then if
    none came (the later bids waiting with it wait on). So an auction's state lives until
    its expiry, with one bid in it."""

    def process_element(self, e, ctx):
        state = ctx.state
        st = state.value()
        if e["kind"] == "bid":
            if st is not None and st[0] is not None:  # the usual bid: its auction came
                # _better, inlined: in the auction's time, then by price, time, bidder
                auction, best, t = st[0], st[1], e["date_time"]
                if auction["date_time"] <= t <= auction["expires"] and (
                        best is None or e["price"] > best["price"]
                        or e["price"] == best["price"]
                        and (t, e["bidder"]) < (best["date_time"], best["bidder"])):
                    state.update((auction, e, ()))
                return None
            state.update((None, None, (st[2] if st is not None else ()) + (e,)))
            ctx.timers.register(event_time=_after_ms(e["date_time"]))
            return None
        best = None
        for b in st[2] if st is not None else ():
            best = _better(e, best, b)
        state.update((e, best, ()))
        ctx.timers.register(event_time=_after_ms(e["expires"]))
        return None

    def on_timer(self, key, ts, ctx):
        st = ctx.state.value()
        if st is None:
            return None
        auction, best, pending = st
        if auction is None:  # no auction came for the bids up to ts: none will
            kept = tuple(b for b in pending if _after_ms(b["date_time"]) > ts)
            ctx.state.update((None, None, kept) if kept else None)
            return None
        if ts != _after_ms(auction["expires"]):  # a bid's timer, from before its auction came
            return None
        ctx.state.clear()
        if best is None:
            return None
        return [(*_q9_auction_fields(auction), best["bidder"], best["price"],
                 best["date_time"])]


def _q9_build(events, columnar, config):
    return (events.filter("q9-events", _bid_or_auction).key_by(_auction_key)
            .process("q9", WinningBids()))


def _q9_reference(events):
    auctions = {e["id"]: e for e in events if e["kind"] == "auction"}
    best: dict[int, dict] = {}
    for b in events:
        a = auctions.get(b["auction"]) if b["kind"] == "bid" else None
        if a is None or not a["date_time"] <= b["date_time"] <= a["expires"]:
            continue
        cur = best.get(a["id"])
        if cur is None or (-b["price"], b["date_time"], b["bidder"]) < (
                -cur["price"], cur["date_time"], cur["bidder"]):
            best[a["id"]] = b
    return sorted((*_q9_auction_fields(auctions[i]), b["bidder"], b["price"],
                   b["date_time"]) for i, b in best.items())


def _q9_rows(out):
    return sorted(out)


# -- q11: user sessions (session windows) -----------------------------------------------------

def _bidder_of(e: dict) -> int:
    return e["bidder"]


def _q11_row(r) -> tuple:
    return (r.key, r.value, r.start, r.end)


def _q11_build(events, columnar, config):
    return (events.filter("bids", _is_bid).key_by(_bidder_of)
            .window("q11-sessions", SessionWindow(Q11_GAP_S), Count(), clock=EventTime())
            .map("q11", _q11_row))


def _q11_reference(events):
    # bounds in float seconds, as event times are: a bid at t opens [t, t + gap), and
    # sessions that touch or overlap merge
    gap = float(Q11_GAP_S)
    times: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if e["kind"] == "bid":
            times[e["bidder"]].append(e["date_time"] / 1000)
    out = []
    for bidder, ts in times.items():
        ts.sort()
        start, end, n = ts[0], ts[0] + gap, 0
        for t in ts:
            if t > end:
                out.append((bidder, n, start, end))
                start, n = t, 0
            end, n = max(end, t + gap), n + 1
        out.append((bidder, n, start, end))
    return sorted(out)


def _q11_rows(out):
    return sorted(out)


# -- q16: channel statistics per day ---------------------------------------------------------

Q16_DAY_S = 86_400
Q16_RANKS = (10_000, 1_000_000)  # price < 10,000; < 1,000,000; the rest


def _rank(price: int) -> int:
    return 0 if price < Q16_RANKS[0] else 1 if price < Q16_RANKS[1] else 2


def _hh_mm(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%H:%M")


def _day(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class ChannelStats(Aggregator[tuple]):
    """q16's counts of a channel's bids: ``(latest ms, bids per rank, bidders per rank,
    auctions per rank)``; rank 3 is every bid (the totals)."""

    def create(self):
        return (-1, [0, 0, 0, 0], [set(), set(), set(), set()], [set(), set(), set(), set()])

    def add(self, acc, bid):
        last, bids, bidders, auctions = acc
        for r in (_rank(bid["price"]), 3):
            bids[r] += 1
            bidders[r].add(bid["bidder"])
            auctions[r].add(bid["auction"])
        return (max(last, bid["date_time"]), bids, bidders, auctions)

    def merge(self, a, b):
        return (max(a[0], b[0]), [x + y for x, y in zip(a[1], b[1])],
                [x | y for x, y in zip(a[2], b[2])], [x | y for x, y in zip(a[3], b[3])])

    def result(self, acc):
        last, bids, bidders, auctions = acc
        return (_hh_mm(last), bids[3], *bids[:3], len(bidders[3]),
                *map(len, bidders[:3]), len(auctions[3]), *map(len, auctions[:3]))


def _channel_of(e: dict) -> str:
    return e["channel"]


def _q16_row(r) -> tuple:
    return (r.key, _day(int(r.start * 1000)), *r.value)


def _q16_build(events, columnar, config):
    return (events.filter("bids", _is_bid).key_by(_channel_of)
            .window("q16-stats", TumblingWindow(Q16_DAY_S), ChannelStats(), clock=EventTime())
            .map("q16", _q16_row))


def _q16_reference(events):
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e["kind"] == "bid":
            groups[(e["channel"], _day(e["date_time"]))].append(e)
    out = []
    for (channel, day), bids in groups.items():
        ranked = [[b for b in bids if _rank(b["price"]) == r] for r in range(3)]
        out.append((channel, day, max(_hh_mm(b["date_time"]) for b in bids), len(bids),
                    *map(len, ranked), len({b["bidder"] for b in bids}),
                    *(len({b["bidder"] for b in r}) for r in ranked),
                    len({b["auction"] for b in bids}),
                    *(len({b["auction"] for b in r}) for r in ranked)))
    return sorted(out)


def _q16_rows(out):
    return sorted(out)


# -- q20: bids expanded with their auction (a regular join) ----------------------------------

_Q20_BID = ("auction", "bidder", "price", "channel", "url", "date_time")
_Q20_AUCTION = ("item_name", "initial_bid", "reserve", "date_time", "expires", "seller",
                "category")
_q20_bid_fields, _q20_auction_fields = itemgetter(*_Q20_BID), itemgetter(*_Q20_AUCTION)


def _q20_row(bid: dict, auction: dict) -> tuple:
    return _q20_bid_fields(bid) + _q20_auction_fields(auction)


def _bid_or_auction(e: dict) -> bool:
    return e["kind"] != "person"


def _auction_key(e: dict) -> int:
    return e["id"] if e["kind"] == "auction" else e["auction"]


def _q20_step(state, events):
    """Per auction id: ``(auction, bids that came before it)``, over the auction's events of
    a batch in turn. ``auction`` is None until the auction comes, then its fields of the
    output row, or False for an auction of another category (its bids are dropped as they
    come); the early bids wait as their fields of the row. As Flink's regular join without
    a state TTL, an auction stays in the state for later bids. Emits the joined rows."""
    auction, early = state or (None, ())
    out = []
    for e in events:
        if e["kind"] == "auction":
            if e["category"] != Q20_CATEGORY:
                auction, early = False, ()
            else:
                auction = _q20_auction_fields(e)
                out += [b + auction for b in early]
                early = ()
        elif auction is None:
            early += (_q20_bid_fields(e),)
        elif auction:
            out.append(_q20_bid_fields(e) + auction)
    return (auction, early), out


def _q20_build(events, columnar, config):
    joined = (events.filter("bids-auctions", _bid_or_auction).key_by(_auction_key)
              .stateful_map_batches("q20-join", _q20_step))
    return joined.map("q20", _value_of)


def _q20_reference(events):
    auctions = {e["id"]: e for e in events
                if e["kind"] == "auction" and e["category"] == Q20_CATEGORY}
    return sorted(_q20_row(e, auctions[e["auction"]]) for e in events
                  if e["kind"] == "bid" and e["auction"] in auctions)


def _q20_rows(out):
    return sorted(out)


# -- q3: local item suggestion (a regular join of auctions and their sellers) ----------------

Q3_CATEGORY = 10
Q3_STATES = ("OR", "ID", "CA")


def _person_or_auction(e: dict) -> bool:
    return e["kind"] != "bid"


def _seller_key(e: dict) -> int:
    return e["id"] if e["kind"] == "person" else e["seller"]


def _q3_row(person: dict, auction: dict) -> tuple:
    return (person["name"], person["city"], person["state"], auction["id"])


_q3_person_fields = itemgetter("name", "city", "state")


def _q3_step(state, e):
    """Per person id: ``(person, ids of auctions that came before them)``, where ``person``
    is None until the person comes, then their fields of the output row, or False for a
    person of another state. Like q20, a regular join: each side waits in the state for the
    other; people of other states and auctions of other categories are dropped as they
    come."""
    person, early = state or (None, ())
    if e["kind"] == "person":
        if e["state"] not in Q3_STATES:
            return (False, ()), []
        person = _q3_person_fields(e)
        return (person, ()), [(*person, a) for a in early]
    if e["category"] != Q3_CATEGORY or person is False:
        return state, []
    if person is None:
        return (None, early + (e["id"],)), []
    return state, [(*person, e["id"])]


def _q3_build(events, columnar, config):
    joined = (events.filter("people-auctions", _person_or_auction).key_by(_seller_key)
              .stateful_map("q3-join", _q3_step))
    return joined.flat_map("q3", _value_of)


def _q3_reference(events):
    people = {e["id"]: e for e in events
              if e["kind"] == "person" and e["state"] in Q3_STATES}
    return sorted(_q3_row(people[e["seller"]], e) for e in events
                  if e["kind"] == "auction" and e["category"] == Q3_CATEGORY
                  and e["seller"] in people)


def _sorted(out):
    return sorted(out)


# -- q4: average winning price per category --------------------------------------------------

def _category_of(r) -> int:
    return r[7]  # _Q9_AUCTION's "category"


def _q4_average(state, row):
    """Running ``(auctions, sum of winning prices)`` of a category; emits ``(category,
    auctions, average)``: an updating result whose last row (most auctions) is the
    query's."""
    n, total = state or (0, 0)
    n, total = n + 1, total + row[9]  # the winning bid's price
    return (n, total), (row[7], n, total / n)


def _q4_build(events, columnar, config):
    winners = _q9_build(events, columnar, config)
    return (winners.key_by(_category_of).stateful_map("q4-avg", _q4_average)
            .map("q4", _value_of))


def _q4_reference(events):
    by_category: dict[int, list[int]] = defaultdict(list)
    for row in _q9_reference(events):
        by_category[row[7]].append(row[9])
    return sorted((c, len(p), sum(p) / len(p)) for c, p in by_category.items())


def _latest_per_key(out, key=lambda r: r[0], version=lambda r: r[1]):
    """The last row of each key of an updating result: the one with the highest version."""
    best: dict = {}
    for r in out:
        k = key(r)
        if k not in best or version(r) > version(best[k]):
            best[k] = r
    return sorted(best.values())


def _q4_rows(out):
    return _latest_per_key(out)


# -- q12: processing-time windows -------------------------------------------------------------

Q12_LENGTH_S = 10


def _q12_row(r) -> tuple:
    return (r.key, r.value, r.start, r.end)


def _q12_build(events, columnar, config):
    from rayflow.operators.windows import ProcessingTime

    return (events.filter("bids", _is_bid).key_by(_bidder_of)
            .window("q12-count", TumblingWindow(Q12_LENGTH_S), Count(),
                    clock=ProcessingTime())
            .map("q12", _q12_row))


def _q12_reference(events):
    # which wall-clock window a bid falls in depends on when it was processed; what does
    # not is each bidder's bids over all windows
    return sorted(Counter(e["bidder"] for e in events if e["kind"] == "bid").items())


def _q12_rows(out):
    total: Counter = Counter()
    for bidder, n, _start, _end in out:
        total[bidder] += n
    return sorted(total.items())


# -- q13: bounded side input join -------------------------------------------------------------

Q13_SIDE_KEYS = 10_000


def q13_side_input(n: int = Q13_SIDE_KEYS) -> list[tuple[int, str]]:
    """The side table: ``(key, value)`` for keys ``0 .. n - 1`` (the suite reads such a file)."""
    return [(k, f"side-{k * 7 % 1000}") for k in range(n)]


def _side_key(bid: dict) -> int:
    return bid["auction"] % Q13_SIDE_KEYS


#: How long a looked-up side value is kept before the table is asked again (Flink's
#: lookup-join cache ttl of a filesystem table, 60 minutes by default)
Q13_CACHE_TTL_S = 3600.0


class _SideTable:
    """The side input as a lookup table, as Flink's q13 reads it (``JOIN side_input FOR
    SYSTEM_TIME AS OF`` the bid's processing time: a lookup join into a file that is read
    once and cached): each instance loads the table at its first lookup."""

    def __init__(self) -> None:
        self.table: dict[int, str] | None = None

    def __call__(self, keys: list[int]) -> list[str]:
        if self.table is None:
            self.table = dict(q13_side_input())
        return [self.table[k] for k in keys]


def _q13_row(joined) -> tuple:
    _, b, value = joined
    return (b["auction"], b["bidder"], b["price"], b["date_time"], value)


def _q13_build(events, columnar, config):
    # a lookup per key into the bounded side table, cached: one step of one input, so it
    # runs chained to the source instead of in an actor of its own behind a channel
    bids = events.filter("bids", _is_bid)
    return (bids.key_by(_side_key)
            .enrich_cached("q13-join", _SideTable(), Q13_CACHE_TTL_S, batch=True)
            .map("q13", _q13_row))


def _q13_reference(events):
    side = dict(q13_side_input())
    return sorted((e["auction"], e["bidder"], e["price"], e["date_time"],
                   side[e["auction"] % Q13_SIDE_KEYS]) for e in events if e["kind"] == "bid")


# -- q14: calculation (stateless) -------------------------------------------------------------

def _hour(ms: int) -> int:
    return (ms // 3_600_000) % 24


def _bid_time_type(ms: int) -> str:
    h = _hour(ms)
    if 8 <= h <= 18:
        return "dayTime"
    if h <= 6 or h >= 20:
        return "nightTime"
    return "otherTime"


def _q14_row(e: dict) -> tuple:
    return (e["auction"], e["bidder"], EURO_RATE * e["price"], _bid_time_type(e["date_time"]),
            e["date_time"])


def _q14_keep(e: dict) -> bool:
    return e["kind"] == "bid" and 1_000_000 < EURO_RATE * e["price"] < 50_000_000


def _q14_build(events, columnar, config):
    return events.filter("q14-filter", _q14_keep).map("q14", _q14_row)


def _q14_reference(events):
    return sorted(_q14_row(e) for e in events if _q14_keep(e))


# -- q15 and q17: bidding statistics per day, in all and per auction --------------------------

def _q15_row(r) -> tuple:
    _minute, *counts = r.value
    return (_day(int(r.start * 1000)), *counts)


def _q15_build(events, columnar, config):
    return (events.filter("bids", _is_bid).key_by(_everything)
            .window("q15-stats", TumblingWindow(Q16_DAY_S), ChannelStats(), clock=EventTime())
            .map("q15", _q15_row))


def _q15_reference(events):
    return sorted(r[1:2] + r[3:] for r in _q16_reference(
        [{**e, "channel": ""} for e in events]))


@dataclass(frozen=True)
class AuctionStats(Aggregator[tuple]):
    """q17's figures of an auction's bids: ``(bids per rank, min, max, sum)``."""

    def create(self):
        return ((0, 0, 0), math.inf, -math.inf, 0)

    def add(self, acc, bid):
        ranks, lo, hi, total = acc
        p = bid["price"]
        r = _rank(p)
        ranks = tuple(n + (i == r) for i, n in enumerate(ranks))
        return (ranks, min(lo, p), max(hi, p), total + p)

    def merge(self, a, b):
        return (tuple(x + y for x, y in zip(a[0], b[0])), min(a[1], b[1]), max(a[2], b[2]),
                a[3] + b[3])

    def result(self, acc):
        ranks, lo, hi, total = acc
        n = sum(ranks)
        return (n, *ranks, lo, hi, total / n, total)


def _q17_row(r) -> tuple:
    return (r.key, _day(int(r.start * 1000)), *r.value)


def _q17_build(events, columnar, config):
    return (events.filter("bids", _is_bid).key_by(_auction_of)
            .window("q17-stats", TumblingWindow(Q16_DAY_S), AuctionStats(), clock=EventTime())
            .map("q17", _q17_row))


def _q17_reference(events):
    groups: dict[tuple, list[int]] = defaultdict(list)
    for e in events:
        if e["kind"] == "bid":
            groups[(e["auction"], _day(e["date_time"]))].append(e["price"])
    return sorted((a, d, len(p), *(sum(_rank(x) == r for x in p) for r in range(3)), min(p),
                   max(p), sum(p) / len(p), sum(p)) for (a, d), p in groups.items())


# -- q18 and q19: the last bid of each bidder on an auction; an auction's top 10 --------------

_Q18_BID = ("auction", "bidder", "price", "channel", "url", "date_time")
Q19_TOP = 10


#: a bid's row: its fields of ``_Q18_BID`` as a tuple
_bid_row = itemgetter(*_Q18_BID)


def _bidder_auction(e: dict) -> tuple:
    return (e["bidder"], e["auction"])


def _q18_latest(state, bids):
    """Per (bidder, auction): the bid with the latest time (ties: the largest row), emitted
    with the number of bids seen when a batch's bids make a new one the latest: an updating
    result, once per key and batch."""
    n, best = state or (0, None)
    top = best
    for e in bids:
        row = _bid_row(e)
        if top is None or (row[5], row) > (top[5], top):
            top = row
    n += len(bids)
    return (n, top), (() if top is best else ((n, top),))


def _q18_build(events, columnar, config):
    return (events.filter("bids", _is_bid).key_by(_bidder_auction)
            .stateful_map_batches("q18-last", _q18_latest))


def _q18_reference(events):
    best: dict = {}
    for e in events:
        if e["kind"] == "bid":
            row, k = _bid_row(e), _bidder_auction(e)
            if k not in best or (row[5], row) > (best[k][5], best[k]):
                best[k] = row
    return sorted(best.values())


def _q18_rows(out):
    return sorted(row for _, (_, row) in _latest_per_key(out, key=lambda r: r[0],
                                                         version=lambda r: r[1][0]))


def _top_order(row: tuple) -> tuple:
    return (-row[2], row[5], row)  # price descending, then earliest, then the row


def _q19_top(state, bids):
    """Per auction: ``(bids seen, its top 10 bids)``; emits them when a batch's bids change
    the top 10 (the sort is stable and ends on the whole row, so ties are exact)."""
    n, top = state or (0, ())
    new = tuple(sorted(top + tuple(map(_bid_row, bids)), key=_top_order)[:Q19_TOP])
    n += len(bids)
    return (n, new), (() if new == top else ((n, new),))


def _q19_build(events, columnar, config):
    return (events.filter("bids", _is_bid).key_by(_auction_of)
            .stateful_map_batches("q19-top", _q19_top))


def _q19_reference(events):
    bids: dict[int, list] = defaultdict(list)
    for e in events:
        if e["kind"] == "bid":
            bids[e["auction"]].append(_bid_row(e))
    return sorted((rank, row) for rows in bids.values()
                  for rank, row in enumerate(sorted(rows, key=_top_order)[:Q19_TOP], 1))


def _q19_rows(out):
    return sorted((rank, row) for _, (_, top) in _latest_per_key(
        out, key=lambda r: r[0], version=lambda r: r[1][0]) for rank, row in enumerate(top, 1))


# -- q21 and q22: channel ids, URL directories (stateless) -----------------------------------

_Q21_CHANNEL_IDS = {"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}


def _url_channel_id(url: str) -> str | None:
    import re

    m = re.search(r"(&|^|\?)channel_id=([^&]*)", url)
    return m.group(2) if m else None


def _q21_row(e: dict) -> tuple | None:
    channel = e["channel"].lower()
    cid = _Q21_CHANNEL_IDS.get(channel) or _url_channel_id(e["url"])
    if cid is None:
        return None
    return (e["auction"], e["bidder"], e["price"], e["channel"], cid)


def _q21_rows_of(e: dict) -> list:
    row = _q21_row(e) if e["kind"] == "bid" else None
    return [] if row is None else [row]


def _q21_build(events, columnar, config):
    return events.flat_map("q21", _q21_rows_of)


def _q21_reference(events):
    return sorted(r for e in events for r in _q21_rows_of(e))


def _split_index(text: str, sep: str, i: int) -> str | None:
    parts = text.split(sep)
    return parts[i] if i < len(parts) else None


def _q22_row(e: dict) -> tuple:
    return (e["auction"], e["bidder"], e["price"], e["channel"],
            *(_split_index(e["url"], "/", i) for i in (3, 4, 5)))


def _q22_build(events, columnar, config):
    return events.filter("bids", _is_bid).map("q22", _q22_row)


def _q22_reference(events):
    return sorted(_q22_row(e) for e in events if e["kind"] == "bid")


QUERIES: dict[str, Query] = {q.name: q for q in (
    Query("q0", "pass-through of the bids", _q0_build, _q0_reference, _q0_rows,
          arrow=_q0_arrow),
    Query("q1", "bid prices in euros", _q1_build, _q1_reference, _q1_rows,
          arrow=_q1_arrow),
    Query("q2", "bids of auctions whose id is a multiple of 123", _q2_build, _q2_reference,
          _q2_rows, arrow=_q2_arrow),
    Query("q5", "hot items: auctions with the most bids per 10 s window, every 2 s",
          _q5_build, _q5_reference, _q5_rows, event_time=True),
    Query("q7", "highest bid per 10 s window", _q7_build, _q7_reference, _q7_rows,
          event_time=True),
    Query("q8", "people who opened an auction in the 10 s window they registered in",
          _q8_build, _q8_reference, _q8_rows, event_time=True),
    Query("q9", "winning bids: each auction's highest bid while it was open", _q9_build,
          _q9_reference, _q9_rows, event_time=True, late_output=False),
    Query("q11", "bids per bidder and session (10 s gap)", _q11_build, _q11_reference,
          _q11_rows, event_time=True),
    Query("q16", "per channel and day: bids, bidders and auctions, by price range",
          _q16_build, _q16_reference, _q16_rows, event_time=True),
    Query("q20", "bids expanded with their auction, for auctions of category 10", _q20_build,
          _q20_reference, _q20_rows),
    Query("q3", "local item suggestion: category-10 auctions of sellers in OR, ID, CA",
          _q3_build, _q3_reference, _sorted),
    Query("q4", "average winning price per category", _q4_build, _q4_reference, _q4_rows,
          event_time=True, late_output=False),
    Query("q12", "bids per bidder per 10 s processing-time window", _q12_build,
          _q12_reference, _q12_rows),
    Query("q13", "bids joined with a bounded side input", _q13_build, _q13_reference,
          _sorted),
    Query("q14", "bid prices in euros between 1M and 50M, with the time of day", _q14_build,
          _q14_reference, _sorted),
    Query("q15", "per day: bids, bidders and auctions, by price range", _q15_build,
          _q15_reference, _sorted, event_time=True),
    Query("q17", "per auction and day: bids by price range, min, max, average, sum",
          _q17_build, _q17_reference, _sorted, event_time=True),
    Query("q18", "the last bid of each bidder on each auction", _q18_build, _q18_reference,
          _q18_rows),
    Query("q19", "each auction's 10 highest bids", _q19_build, _q19_reference, _q19_rows),
    Query("q21", "bids with a channel id", _q21_build, _q21_reference, _sorted),
    Query("q22", "bids with the directories of their URL", _q22_build, _q22_reference,
          _sorted),
)}
