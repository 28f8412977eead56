"""State time to live (``ttl_s``) on every stateful step, without Ray, on every backend: a
key untouched for ttl_s loses all its state entries (and nothing else does), each removal is
counted, and a key that comes back starts afresh; expiry survives a restore."""

import math

import numpy as np
import pytest

from rayflow.operators.joins import IntervalJoin, WindowJoin
from rayflow.operators.lookup import LookupJoin
from rayflow.operators.process import Process
from rayflow.operators.stateful import StatefulMap, StatefulMapBatches
from rayflow.operators.windows import (
    Count,
    CountWindow,
    EventTime,
    SessionWindow,
    TumblingWindow,
    Windowed,
)
from tests.operators._drive import ctx_for

TTL = 10.0
KEY = lambda r: r[0]  # noqa: E731


def _element(rec, ctx):
    ctx.state.update(ctx.state.value(0) + 1)
    ctx.timers.register(event_time=1e9)  # never due in the test: dropped with the key
    yield (ctx.key, ctx.state.value())


SPECS = {
    "stateful_map": (StatefulMap(lambda s, r: ((s or 0) + 1, (s or 0) + 1), KEY, TTL), None),
    "stateful_map_batches": (StatefulMapBatches(
        lambda s, rs: ((s or 0) + len(rs), [(s or 0) + len(rs)]), KEY, TTL), None),
    "count_window": (Windowed(CountWindow(5), Count(), KEY, ttl_s=TTL), None),
    "tumbling": (Windowed(TumblingWindow(1e6), Count(), KEY, EventTime(), TTL), None),
    "session": (Windowed(SessionWindow(1e6), Count(), KEY, EventTime(), TTL), None),
    "window_join": (WindowJoin(TumblingWindow(1e6), "inner", KEY, KEY, EventTime(), TTL), 0),
    "interval_join": (IntervalJoin(-1e6, 1e6, KEY, KEY, EventTime(), TTL), 0),
    "lookup_join": (LookupJoin(KEY, KEY, "inner", EventTime(), TTL), 1),
    "process": (Process((_element, lambda k, ts, ctx: None), KEY, TTL), None),
}


def _feed(logic, index, recs):
    times = np.array([r[1] for r in recs], dtype=np.float64)
    if index is None:
        return logic.process(recs, times)
    return logic.process_input(index, recs, times)


def _keys_in_state(logic):
    """The user keys that own an entry in the backend (the state key's second element, a
    window's partial's third, ``("__p", window, key, seq)``, or the state key itself for
    stateful_map, stateful_map_batches and count windows); the instance's watermarks
    (``"__watermark__"``, a lookup join's ``"__table_watermark__"``) are no key's."""
    keys = set()
    for k, _ in logic.state.items():
        if k in ("__watermark__", "__table_watermark__"):
            continue
        if isinstance(k, tuple) and k[0] == "__p":
            keys.add(k[2])
            continue
        keys.add(k[1] if isinstance(k, tuple) and isinstance(k[0], str) and
                 k[0].startswith("__") else k)
    return keys


@pytest.mark.parametrize("name", list(SPECS))
def test_an_untouched_key_is_removed_and_counted(backend, name):
    spec, index = SPECS[name]
    clock = [1000.0]
    logic = spec.build(ctx_for(backend))
    logic.now = lambda: clock[0]
    _feed(logic, index, [("a", 1.0, 0), ("b", 2.0, 0)])
    clock[0] = 1006.0
    _feed(logic, index, [("b", 3.0, 1)])  # b touched again at 1006
    assert _keys_in_state(logic) == {"a", "b"}
    clock[0] = 1010.5  # a untouched for 10.5 s, b for 4.5 s
    out = logic.on_tick(clock[0])
    assert out is not None and out.expired == 1
    assert _keys_in_state(logic) == {"b"}
    # the expired key is gone from the snapshot too, and comes back empty
    restored = spec.build(ctx_for(backend), logic.snapshot())
    restored.now = lambda: clock[0]
    assert _keys_in_state(restored) == {"b"}
    clock[0] = 1017.0  # b untouched for 11 s: expires after the restore
    again = _feed(restored, index, [("a", 4.0, 2)])
    assert again.expired == 1
    assert _keys_in_state(restored) == {"a"}
    if name in ("stateful_map", "stateful_map_batches", "process"):
        assert again.items == [("a", 1)]  # a starts over
    assert (restored.on_tick(clock[0]) or None) is None  # nothing more to expire


@pytest.mark.parametrize("name", list(SPECS))
def test_an_expired_key_is_gone_before_a_batch_reads_it(backend, name):
    """No tick and no batch since a key's time ran out: the next batch, as the runtime
    hands it over, finds the key gone (Flink's NeverReturnExpired), not its stale state."""
    spec, index = SPECS[name]
    clock = [1000.0]
    logic = spec.build(ctx_for(backend))
    logic.now = lambda: clock[0]
    recs = [("a", 1.0, 0)]
    logic.process_input(index or 0, recs, np.array([1.0]))
    clock[0] = 1015.0  # a untouched for 15 s, and nothing ran meanwhile
    out = logic.process_input(index or 0, [("a", 2.0, 1)], np.array([2.0]))
    assert out.expired == 1
    assert _keys_in_state(logic) == {"a"}  # made again by the record
    if name in ("stateful_map", "stateful_map_batches", "process"):
        assert out.items == [("a", 1)]  # a starts over


def test_without_ttl_nothing_expires(backend):
    logic = StatefulMap(lambda s, r: (1, 1), KEY).build(ctx_for(backend))
    logic.now = lambda: 1e12
    logic.process([("a", 1.0)], None)
    assert logic.on_tick(0) is None and dict(logic.state.items()) == {"a": 1}


@pytest.mark.parametrize("spec", [StatefulMap(lambda s, r: (None, r), KEY, TTL),
                                  StatefulMapBatches(lambda s, rs: (None, rs), KEY, TTL)])
def test_a_dropped_stateful_map_key_is_not_counted_as_expired(backend, spec):
    logic = spec.build(ctx_for(backend))
    clock = [0.0]
    logic.now = lambda: clock[0]
    logic.process([("a", 1.0)], None)
    assert list(logic.state.items()) == []  # its ttl entry went with it
    clock[0] = 100.0
    assert logic.on_tick(0) is None


@pytest.mark.parametrize("bad", [0, -1, math.inf, "10", True])
def test_bad_ttl_is_an_error(bad):
    with pytest.raises(ValueError, match="ttl_s"):
        StatefulMap(lambda s, r: (s, r), KEY, bad)
