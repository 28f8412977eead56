"""A slow step behind a rebalance scales at default settings: the channel splits a batch whose
rest would cost a slow receiver more than ``CallPace.ENGAGE`` times ``stream.batch_target_s``
and deals the parts over the instances, in order per channel, with barriers and end of stream
behind every part. Other edges, and fast receivers, get whole batches."""

from __future__ import annotations

import os
import time

import pytest

import rayflow as rf
from rayflow.config import StreamOptions
from rayflow.core.messages import Barrier, EndOfStream
from rayflow.core.operators import StepContext
from rayflow.core.records import Batch
from rayflow.runtime.plan import OutEdge

# -- the receiver reports its own time ----------------------------------------------------


def test_push_returns_the_seconds_it_took_only_for_its_own_message():
    from rayflow.runtime.tasks import make_task

    def slow(r):
        time.sleep(0.01)
        return r

    f = rf.Dataflow("t")
    f.source("s", rf.MemorySource([1])).map("m", slow).sink("k", rf.CollectSink())
    task = make_task(f.step("m"), StepContext("m", 0, 1), StreamOptions())
    task.connect([], {}, [("s", 0)], {})
    took = task.push(Batch([1, 2], None, 0.0), ("s", 0), 0)
    assert isinstance(took, float) and took >= 0.02  # two records of at least 10 ms
    # a message that comes early waits; the call that handles it handles two: neither is
    # one message's time
    assert task.push(Batch([4], None, 0.0), ("s", 0), 2) is None
    assert task.push(Batch([3], None, 0.0), ("s", 0), 1) is None
    assert task.counters.records_in == 4


def test_push_leaves_out_the_time_it_waited_for_downstream_credit(receivers):
    from rayflow.runtime.tasks import make_task

    def work(r):
        time.sleep(0.01)
        return r

    f = rf.Dataflow("t")
    f.source("s", rf.MemorySource([1])).map("m", work).sink("k", rf.CollectSink())
    task = make_task(f.step("m"), StepContext("m", 0, 1), StreamOptions(channel_calls=1))
    down = receivers(1, _sleep_then(1.0))  # its own downstream takes 1 s a call
    task.connect([OutEdge("k", "forward", (0,))], {"k": down}, [("s", 0)], {})
    assert task.push(Batch([1, 2], None, 0.0), ("s", 0), 0) >= 0.02
    waited0 = task.emitter.waited_s()
    t0 = time.perf_counter()
    took = task.push(Batch([3, 4], None, 0.0), ("s", 0), 1)  # the window is full: waits
    elapsed = time.perf_counter() - t0
    waited = task.emitter.waited_s() - waited0
    assert waited > 0.1  # it did wait for the first call downstream
    assert took >= 0.02  # its own two records of at least 10 ms
    assert took + waited <= elapsed + 1e-9  # and not the wait


# -- the emitter, against receivers that report given durations ------------------------------


def _sleep_then(seconds):
    def cost(rows):
        time.sleep(seconds)
        return seconds

    return cost


@pytest.fixture(scope="module")
def _pool(ray_session):
    """Three started receivers that log what they get and report ``cost(rows)`` seconds a
    call, so that the pace the sender sees is exact; shared, since starting actors is slow."""
    import ray

    @ray.remote(num_cpus=0)
    class Receiver:
        def __init__(self):
            self.log, self.cost = [], None

        def reset(self, cost):
            self.log, self.cost = [], cost

        def push(self, msg, sender, seq, target=None):
            if isinstance(msg, Batch):
                self.log.append(list(msg.items))
                return self.cost(len(msg))
            self.log.append(msg)
            return None

        def got(self):
            return self.log

    return [Receiver.remote() for _ in range(3)]


@pytest.fixture
def receivers(_pool):
    """``receivers(n, cost)``: ``n`` of the receivers, their logs empty, ``cost`` theirs."""
    import ray

    def make(n, cost):
        ray.get([r.reset.remote(cost) for r in _pool[:n]])
        return _pool[:n]

    return make


def _emitter(kind, handles, target_s=0.1):
    from rayflow.runtime.channel import Emitter

    edge = OutEdge("down", kind, tuple(range(len(handles))))
    return Emitter(("up", 0), [edge], {"down": handles}, max_bytes=1 << 30, max_calls=16,
                   batch_target_s=target_s)


def _batches(recv):
    import ray

    return [[m for m in log if isinstance(m, list)] for log in ray.get([r.got.remote()
                                                                     for r in recv])]


def _by_offset(batches):
    """The sizes of all parts, in the order of their records."""
    return [len(m) for m in sorted((m for b in batches for m in b), key=lambda m: m[0])]


def test_a_rebalance_deals_parts_at_the_receivers_pace_in_order(receivers):
    import ray

    recv = receivers(3, lambda rows: rows / 1024)  # 1/1024 s a record: exact in floats
    em = _emitter("rebalance", recv, target_s=0.125)  # 128 records a part, once measured
    for lo in (0, 1536):  # the first call of each is warm-up, the second shows the pace
        em.emit(Batch(list(range(lo, lo + 1536)), None, 0.0))
        em.drain()
    logs = ray.get([r.got.remote() for r in recv])
    # unmeasured, each channel got parts of FIRST_ROWS, in turn
    assert logs == [[list(range(k, k + 512)), list(range(k + 1536, k + 2048))]
                    for k in (0, 512, 1024)]
    # measured: the batch would cost a receiver 1.625 s, more than ENGAGE x 0.125 s = 1.25 s
    # (1280 records), so it goes in parts at the pace to its very end: 128 records, each
    # channel's fourth part (a probe) twice that, and a rest of at most one and a half parts
    # as one. (The rest used to go whole once it cost less than 1.25 s: 1280 records to one
    # instance, a second of work for it alone at the end of a stream.)
    em.emit(Batch(list(range(3072, 3072 + 1664)), None, 0.0))
    em.drain()
    third = [b[2:] for b in _batches(recv)]
    sizes = _by_offset(third)
    # (the rest is one and a half of its own part: of a probe's, 384, when the channel whose
    # turn it is next probes, as it depends on which calls finished first)
    assert sum(sizes) == 1664 and max(sizes[:-1]) <= 256 and sizes[-1] <= 384
    assert len(sizes) >= 10
    last = max((m for b in third for m in b), key=lambda m: m[0])
    for b in third:  # each channel's parts follow its pace, the batch's rest aside
        assert [len(m) for m in b if m is not last] == \
            _paced_sizes(len(b))[:len(b) - (last in b)]
    # 1281 records cost just more than 1.25 s: parts as well, none larger than a probe
    # but the rest (at most one and a half probes)
    em.emit(Batch(list(range(4736, 4736 + 1281)), None, 0.0))
    em.emit_control(Barrier(1))
    em.emit_eos()
    em.drain()
    batches = _batches(recv)
    fourth = [b[2 + len(t):] for b, t in zip(batches, third)]
    sizes = _by_offset(fourth)
    assert sum(sizes) == 1281 and max(sizes[:-1]) <= 256 and sizes[-1] <= 384
    assert len(sizes) >= 5
    got = sorted(r for b in batches for m in b for r in m)
    assert got == list(range(4736 + 1281))  # every record once
    for b in batches:  # consecutive records a part, in order within each channel
        flat = [r for m in b for r in m]
        assert flat == sorted(flat) and all(m == list(range(m[0], m[-1] + 1)) for m in b)
    for log in ray.get([r.got.remote() for r in recv]):
        # the barrier and the end of stream follow every batch of the channel
        assert log[-2:] == [Barrier(1), EndOfStream("up", 0)]
        assert all(isinstance(m, list) for m in log[:-2])


def test_a_batch_worth_spreading_over_the_instances_goes_in_parts(receivers):
    """A batch goes whole only when it costs no more than ENGAGE targets over the instances:
    with two receivers at 0.125 s a target, 1000 records (0.98 s, under ENGAGE targets but
    over half of them) go in parts to both; 600 (0.59 s) go whole to one. (The last batch
    of a bounded stream at 1 ms a record used to go whole: half a second of work for one
    instance while the other idled.)"""
    import ray

    recv = receivers(2, lambda rows: rows / 1024)
    em = _emitter("rebalance", recv, target_s=0.125)
    for lo in (0, 1024):  # warm-up, then the pace (each channel: 512 + 512)
        em.emit(Batch(list(range(lo, lo + 1024)), None, 0.0))
        em.drain()
    em.emit(Batch(list(range(2048, 3048)), None, 0.0))
    em.drain()
    spread = [[m for m in log[2:] if isinstance(m, list)]
              for log in ray.get([r.got.remote() for r in recv])]
    counts = [sum(len(m) for m in b) for b in spread]
    assert sum(counts) == 1000 and min(counts) >= 1000 // 2 - 2 * 128
    # parts of 128, a probe twice that, the rest at most one and a half of a probe
    assert sum(len(b) for b in spread) >= 4 and max(len(m) for b in spread for m in b) <= 384
    em.emit(Batch(list(range(3048, 3648)), None, 0.0))
    em.drain()
    last = [[m for m in log if isinstance(m, list) and m[0] >= 3048]
            for log in ray.get([r.got.remote() for r in recv])]
    assert sorted(len(b) for b in last) == [0, 1] and [len(m) for b in last for m in b] == [600]


def test_a_receiver_with_a_fixed_cost_a_call_gets_whole_batches(receivers):
    recv = receivers(2, lambda rows: 0.2)  # 0.2 s a call, whatever its size
    em = _emitter("rebalance", recv)
    for lo in (0, 1024):  # a warm-up call each, then 512 records in 0.2 s
        em.emit(Batch(list(range(lo, lo + 1024)), None, 0.0))
        em.drain()
    # looks like 0.39 ms a record: the batch costs more than 1 s, so it goes in parts of 256
    # (a probe twice that) until two sizes at the same cost show a fixed cost; then the rest
    # goes whole, and so does every later batch: splitting cannot help
    em.emit(Batch(list(range(2048, 5048)), None, 0.0))
    em.drain()
    em.emit(Batch(list(range(5048, 10048)), None, 0.0))
    em.drain()
    batches = _batches(recv)
    sizes = _by_offset(batches)
    assert sizes[:4] == [512] * 4 and sizes[-1] == 5000
    assert sum(sizes[4:-1]) == 3000 and set(sizes[4:-2]) <= {256, 512}
    # a fixed cost, measured: no cost per record worth a part (a fit's rounding may leave
    # a few 1e-35 s a record), so every batch goes whole
    assert [em._rows_for(c, 10 ** 6) for c in em.edges[0][1]] == [None, None]
    assert sorted(r for b in batches for m in b for r in m) == list(range(10048))


def _paced_sizes(k):
    """The sizes of a measured channel's first ``k`` parts: 128, every fourth twice that."""
    return [256 if i % 4 == 3 else 128 for i in range(k)]


def test_slow_start_a_further_part_waits_for_the_channels_calls_until_measured(receivers):
    recv = receivers(2, lambda rows: rows / 1024)
    em = _emitter("rebalance", recv, target_s=0.125)
    em.emit(Batch(list(range(4000)), None, 0.0))  # nothing measured
    em.drain()
    batches = _batches(recv)
    assert sorted(r for b in batches for m in b for r in m) == list(range(4000))
    rest = max((m for b in batches for m in b), key=lambda m: m[0])
    assert len(rest) <= 384 and rest[-1] == 3999  # the last part: at most 1.5 probes
    # each channel: a first part of FIRST_ROWS, a second one after the first call (warm-up)
    # finished, and parts at the pace once the second call showed it; without the wait, a
    # channel would get parts of 512 until its calls came back
    for b in batches:
        sizes = [len(m) for m in b if m is not rest]
        assert sizes == ([512, 512] + _paced_sizes(len(sizes)))[:len(sizes)]
    assert sum(len(b) >= 3 for b in batches) >= 1
    # a receiver that reports no time is not waited for: parts of FIRST_ROWS all along
    blind = receivers(2, lambda rows: None)
    em = _emitter("rebalance", blind, target_s=0.125)
    em.emit(Batch(list(range(2000)), None, 0.0))
    em.drain()
    assert _by_offset(_batches(blind)) == [512, 512, 512, 464]
    assert [c.pace.blind for c in em.edges[0][1]] == [True, True]


@pytest.mark.parametrize("kind,n,target_s", [("forward", 1, 0.125), ("rebalance", 1, 0.125),
                                             ("broadcast", 2, 0.125), ("rebalance", 2, 0.0)])
def test_other_edges_and_off_send_whole_batches(receivers, kind, n, target_s):
    recv = receivers(n, lambda rows: rows / 1024)  # a slow receiver
    em = _emitter(kind, recv, target_s=target_s)
    for lo, hi in ((0, 1000), (1000, 2000), (2000, 5000)):  # measured after two calls
        em.emit(Batch(list(range(lo, hi)), None, 0.0))
        em.drain()
    batches = _batches(recv)
    if kind == "broadcast":
        assert batches == [[list(range(0, 1000)), list(range(1000, 2000)),
                            list(range(2000, 5000))]] * 2
    else:
        assert _by_offset(batches) == [1000, 1000, 3000]
        assert sorted(r for b in batches for m in b for r in m) == list(range(5000))


# -- a job: W3's shape, source -> rebalance -> slow map ---------------------------------------


def _tagged_sleep(r):
    time.sleep(0.001)
    return (os.getpid(), r)


def _sleep_flow(name, n, parallelism, **source_options):
    f = rf.Dataflow(name)
    (f.source("src", rf.MemorySource(list(range(n))), **source_options)
      .rebalance()
      .map("sleep", _tagged_sleep, parallelism=parallelism)
      .sink("out", rf.CollectSink()))
    return f


def _by_instance(out):
    got: dict = {}
    for pid, r in out:
        got.setdefault(pid, []).append(r)
    return got


def test_a_slow_step_spreads_over_its_instances_at_default_settings(ray_session):
    out = rf.run(_sleep_flow("w3-spread", 2000, 3)).collect("out")
    got = _by_instance(out)
    # one source batch of 2000 records would have gone to one instance; each instance gets
    # a first part of 512 (the receivers' pace is not known yet), one more the rest
    assert len(got) == 3
    assert sorted(v[:512] for v in got.values()) == [list(range(k, k + 512))
                                                     for k in (0, 512, 1024)]
    assert sorted(len(v) for v in got.values()) == [512, 512, 976]
    assert sorted(r for _, r in out) == list(range(2000))  # every record once
    assert all(v == sorted(v) for v in got.values())  # in order within each instance


@pytest.mark.parametrize("where", ["job", "step"])
def test_batch_target_0_sends_source_batches_whole(ray_session, where):
    if where == "job":
        job = rf.run(_sleep_flow(f"w3-off-{where}", 300, 2), stream={"batch_target_s": 0})
    else:
        job = rf.run(_sleep_flow(f"w3-off-{where}", 300, 2, batch_target_s=0))
    got = _by_instance(job.collect("out"))
    assert list(got.values()) == [list(range(300))]  # one batch, one instance


def test_a_sinks_backpressure_is_the_time_its_writes_waited_for_commits():
    """A sink sends nothing on, so its backpressure is its writer's wait for commits (the
    exactly-once sink's ``waited_s``), not its empty emitter's zero."""
    from rayflow.runtime.tasks import make_task

    f = rf.Dataflow("t")
    f.source("s", rf.MemorySource([1])).sink("k", rf.DiscardSink())
    task = make_task(f.step("k"), StepContext("k", 0, 1), StreamOptions())
    task.connect([], {}, [("s", 0)], {})
    task.writer.waited_s = 1.5  # as a writer that waited 1.5 s for running commits
    assert task.status()["counters"]["backpressure_s"] == 1.5
