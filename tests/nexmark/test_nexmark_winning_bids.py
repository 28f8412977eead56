"""q9's process function as pure logic (no Ray): the events of two source instances
interleaved in batches at random, one instance running ahead of the other by several
batches, with the watermark the slower one allows; the winners equal the plain-Python
reference every time. Bids that reach their key before their auction wait for it there."""

import random

import numpy as np
import pytest

from rayflow.core.operators import StepContext
from rayflow.nexmark import QUERIES, NexmarkConfig, NexmarkGenerator, max_delay_s
from rayflow.nexmark.generator import event_time_s
from rayflow.nexmark.queries import WinningBids, _auction_key
from rayflow.operators.process import Process

CONFIG = NexmarkConfig(seed=5, first_event_rate=40.0, out_of_order_group_size=32)


@pytest.fixture(scope="module")
def events():
    return NexmarkGenerator(CONFIG).rows(range(4000))


@pytest.mark.parametrize("seed", range(8))
def test_winners_whatever_the_interleaving_of_two_sources(events, seed):
    rng = random.Random(seed)
    size = rng.choice([50, 125, 250])
    parts = [[e for e in events[i::2] if e["kind"] != "person"] for i in range(2)]
    batches = [[p[j:j + size] for j in range(0, len(p), size)] for p in parts]
    logic = Process(WinningBids(), key_fn=_auction_key).build(StepContext("q9", 0, 1))
    delay, wm, pos, out = max_delay_s(CONFIG), [-np.inf, -np.inf], [0, 0], []
    while pos[0] < len(batches[0]) or pos[1] < len(batches[1]):
        i = rng.choice([k for k in (0, 1) if pos[k] < len(batches[k])])
        batch = batches[i][pos[i]]
        pos[i] += 1
        times = np.array([event_time_s(e) for e in batch])
        out += logic.process(batch, times).items
        wm[i] = max(wm[i], times.max() - delay) if pos[i] < len(batches[i]) else np.inf
        fired = logic.on_watermark(min(wm)) if min(wm) < np.inf else logic.on_end()
        out += fired.items if fired is not None else []
    assert sorted(out) == QUERIES["q9"].reference(events)
    # the state is empty at the end: every auction closed, no bid left waiting
    assert len(logic.state) == 0 or all(k == logic.WM for k in dict(logic.state.items()))
