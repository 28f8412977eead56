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


def test_a_barrier_and_the_end_go_out_on_a_full_channel_at_once_in_order(ray_session):
    """An aligned barrier (and the end of stream) does not wait for a call of a full channel
    to finish: waiting there left the sender's other channels without batches (W3 at
    parallelism 8: gaps of 50-150 ms in every instance at every checkpoint). It still
    arrives after the batches sent before it."""
    import ray

    from rayflow.core.messages import Barrier, Watermark
    from rayflow.runtime.channel import Emitter

    @ray.remote(num_cpus=0)
    class Recorder:
        def __init__(self):
            self.seen = []

        def push(self, msg, sender, seq, target=None):
            self.seen.append((seq, type(msg).__name__))
            time.sleep(1.0)

        def got(self):
            return self.seen

    recv = Recorder.options(max_concurrency=1).remote()
    em = Emitter(("up", 0), [OutEdge("down", "forward", (0,))], {"down": [recv]},
                 max_bytes=1 << 30, max_calls=2)
    em.emit(Batch([1], None, time.time()))
    em.emit(Batch([2], None, time.time()))  # the channel's 2 calls are in use: it is full
    t0 = time.perf_counter()
    em.emit_barrier(Barrier(1))
    em.emit_control(Watermark(5.0))
    em.emit_eos()
    assert time.perf_counter() - t0 < 0.5  # a call takes 1 s
    em.drain()
    assert ray.get(recv.got.remote()) == [(0, "Batch"), (1, "Batch"), (2, "Barrier"),
                                          (3, "Watermark"), (4, "EndOfStream")]


def test_a_tick_waits_for_room_on_a_full_channel(ray_session):
    """An idle source sends ticks as time passes: those wait for a free call, so a stuck
    receiver cannot pile them up."""
    from rayflow.core.messages import Tick
    from rayflow.runtime.channel import Emitter

    recv = _receiver()  # 0.1 s a call
    em = Emitter(("up", 0), [OutEdge("down", "forward", (0,))], {"down": [recv]},
                 max_bytes=1 << 30, max_calls=2)
    em.emit(Batch([1], None, time.time()))
    em.emit(Batch([2], None, time.time()))
    chan = em.edges[0][1][0]
    for _ in range(5):
        em.emit_control(Tick(time.time()))
        assert len(chan.window) <= 2
    em.drain()
