"""A channel to a slow receiver keeps fewer batches in flight (buffer debloating), so a
barrier sent behind them waits about ``channel_target_s``, not ``channel_calls`` batches."""

from __future__ import annotations

import time

import pytest

from rayflow.core.records import Batch
from rayflow.runtime.plan import OutEdge


def _receiver():
    import ray

    @ray.remote(num_cpus=0)
    class SlowReceiver:
        def push(self, msg, sender, seq, target=None):
            time.sleep(0.1)

    return SlowReceiver.remote()


@pytest.mark.parametrize("target_s, most", [(0.25, 2), (0.0, 16)])
def test_the_window_shrinks_to_the_target(ray_session, target_s, most):
    from rayflow.runtime.channel import Emitter

    recv = _receiver()
    edge = OutEdge("down", "forward", (0,))
    em = Emitter(("up", 0), [edge], {"down": [recv]}, max_bytes=1 << 30, max_calls=16,
                 target_s=target_s)
    chan = em.edges[0][1][0]
    seen = []
    for i in range(24):
        em.emit(Batch([i], None, time.time()))
        seen.append(len(chan.window))
    em.drain()
    # after the first full window, the receiver's 0.1 s per call is known: 0.25 s of work
    # is 2 calls (never fewer than 2); without a target the window stays at 16
    assert max(seen[18:]) == most
    assert seen[:16] == list(range(1, 17))
