"""A key function that returns what cannot be a key (a list) makes that record a dead
letter, with the reason, on every keyed operator and backend; the other records go on."""

import numpy as np
import pytest

from rayflow.core.operators import StepContext
from rayflow.operators.joins import IntervalJoin, WindowJoin
from rayflow.operators.lookup import EnrichCached, LookupJoin
from rayflow.operators.process import Process
from rayflow.operators.stateful import StatefulMap, StatefulMapBatches
from rayflow.operators.windows import (
    Count,
    CountWindow,
    EventTime,
    Reduce,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    Windowed,
)
from rayflow.state import backend_from_name

RECS = [{"k": [1, 2], "t": 1.0}, {"k": "ok", "t": 2.0}]
TIMES = np.array([1.0, 2.0])


def _key(r):
    return r["k"]


def _use_state(v, ctx):
    ctx.state.update(v)
    return [v]


ONE_INPUT = {
    "tumbling": Windowed(TumblingWindow(5.0), Count(), _key, EventTime()),
    "tumbling, no merge": Windowed(TumblingWindow(5.0), Reduce(lambda a, r: (a or 0) + 1),
                                   _key, EventTime()),
    "tumbling, ttl": Windowed(TumblingWindow(5.0), Count(), _key, EventTime(), ttl_s=60.0),
    "sliding": Windowed(SlidingWindow(6.0, 2.0), Count(), _key, EventTime()),
    "session": Windowed(SessionWindow(1.0), Count(), _key, EventTime()),
    "count": Windowed(CountWindow(2), Count(), _key),
    "process": Process(_use_state, _key),
    "process, ttl": Process(lambda v, ctx: [v], _key, ttl_s=60.0),
    "stateful_map": StatefulMap(lambda s, v: (s, v), _key),
    "stateful_map_batches": StatefulMapBatches(lambda s, vs: (s, vs), _key, None),
    "enrich_cached": EnrichCached(lambda k: 1, _key, 60.0),
}
TWO_INPUTS = {
    "window join": WindowJoin(TumblingWindow(5.0), "inner", _key, _key, EventTime()),
    "interval join": IntervalJoin(-1.0, 1.0, _key, _key),
    "lookup join": LookupJoin(_key, _key),
}


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
@pytest.mark.parametrize("name", sorted(ONE_INPUT) + sorted(TWO_INPUTS))
def test_a_list_for_a_key_is_a_dead_letter_and_the_rest_goes_on(tmp_path, kind, name):
    spec = ONE_INPUT.get(name) or TWO_INPUTS[name]
    logic = spec.build(StepContext("s", 0, 1, "t", backend_from_name(kind, str(tmp_path))))
    for index in (0, 1) if name in TWO_INPUTS else (0,):
        out = logic.process_input(index, list(RECS), TIMES)
        assert [d.record for d in out.dead] == [RECS[0]]
        assert "unhashable type: 'list'" in out.dead[0].reason
    logic.on_end()
    logic.snapshot()
