"""Nexmark queries as rayflow flows, each beside a plain-Python reference.

Each :class:`Query` has ``build(events) -> stream`` (the flow's steps, from a stream of events
to the query's output) and ``reference(events) -> rows`` (the same query over a list of
event dicts, in one process, in any order); ``rows(output)`` turns what the flow's sink
collected into those rows, so a test compares the two exactly. The queries follow the
Nexmark suite's SQL (nexmark/nexmark, ``queries/q*.sql``):

- ``q0`` pass-through of the bids; ``q1`` bid prices in euros (``0.908 * price``);
  ``q2`` the bids of auctions whose id is a multiple of 123.
- ``q5`` hot items: per sliding window of 10 s every 2 s, the auctions with the most bids.
- ``q7`` highest bid: per tumbling window of 10 s, the bids at its highest price.
- ``q8`` new users: people who opened an auction in the 10 s tumbling window in which they
  registered (a window join of people and auctions).
- ``q11`` user sessions: bids per bidder and session (10 s gap).

Windows are half-open ``[start, end)`` in event time, in seconds; event times are the
events' ``date_time`` (ms) / 1000.

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
from typing import Any

from rayflow.nexmark.generator import BID
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


@dataclass(frozen=True)
class Query:
    """One Nexmark query: its flow steps, its reference and how to read its output.

    Attributes:
        name: ``q0`` ... ``q20``.
        description: one line.
        build: ``(events stream, columnar) -> output stream``; ``columnar`` says whether
            the events arrive as Arrow batches (else as dicts).
        reference: ``events (dicts) -> sorted output rows``.
        rows: ``collected sink output -> sorted output rows`` (the reference's form).
        event_time: whether the query needs watermarks on its source.
        arrow: the query as one function over an Arrow batch of events (the queries
            without state), used by the Arrow path; None for the others.
    """

    name: str
    description: str
    build: Callable[[Any, bool], Any]
    reference: Callable[[list[dict]], list]
    rows: Callable[[Any], list]
    event_time: bool = False
    arrow: Callable[[Any], Any] | None = None

    @property
    def columnar(self) -> bool:
        """Whether the query has an Arrow (vectorized) path."""
        return self.arrow is not None


def _kind(name: str) -> Callable[[dict], bool]:
    return _IsKind(name)


@dataclass(frozen=True)
class _IsKind:
    name: str

    def __call__(self, event: dict) -> bool:
        return event["kind"] == self.name


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


def _q0_build(events, columnar):
    if columnar:
        return events.map_batches("q0", _q0_arrow)
    return events.filter("bids", _kind("bid")).map("q0", _q0_row)


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


def _q1_build(events, columnar):
    if columnar:
        return events.map_batches("q1", _q1_arrow)
    return events.filter("bids", _kind("bid")).map("q1", _q1_row)


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


def _q2_build(events, columnar):
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


def _q5_build(events, columnar):
    counts = (events.filter("bids", _kind("bid")).key_by(_auction_of)
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


def _q7_build(events, columnar):
    return (events.filter("bids", _kind("bid")).key_by(_everything)
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


def _first_time(seen, row):
    # a person has one registration, so one window: emit their row once, whatever the
    # number of auctions they opened in it
    return True, (None if seen else row)


def _value_of(keyed) -> Any:
    return keyed[1]


def _is_not_none(x) -> bool:
    return x is not None


def _q8_build(events, columnar):
    persons, rest = events.branch("persons", _kind("person"))
    auctions = rest.filter("auctions", _kind("auction"))
    joined = persons.key_by(_person_id).join("q8-join", auctions.key_by(_seller),
                                             TumblingWindow(Q8_LENGTH_S), clock=EventTime())
    rows = joined.map("q8-row", _q8_row).key_by(_q8_key)
    return (rows.stateful_map("q8-once", _first_time).map("q8-value", _value_of)
            .filter("q8", _is_not_none))


def _q8_key(row) -> int:
    return row[0]


def _q8_reference(events):
    length = Q8_LENGTH_S * 1000
    people = {(e["id"], e["date_time"] // length): e["name"] for e in events
              if e["kind"] == "person"}
    sellers = {(e["seller"], e["date_time"] // length) for e in events if e["kind"] == "auction"}
    return sorted((pid, name, float(w * Q8_LENGTH_S)) for (pid, w), name in people.items()
                  if (pid, w) in sellers)


def _q8_rows(out):
    return sorted(out)


# -- q11: user sessions (session windows) -----------------------------------------------------

def _bidder_of(e: dict) -> int:
    return e["bidder"]


def _q11_row(r) -> tuple:
    return (r.key, r.value, r.start, r.end)


def _q11_build(events, columnar):
    return (events.filter("bids", _kind("bid")).key_by(_bidder_of)
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
    Query("q11", "bids per bidder and session (10 s gap)", _q11_build, _q11_reference,
          _q11_rows, event_time=True),
)}

