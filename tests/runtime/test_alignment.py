"""Barrier alignment, without Ray: every snapshot is a consistent cut of the inputs, also when
a checkpoint was aborted after only some sources had injected its barrier."""

from __future__ import annotations

import random
from collections import deque

import pytest

from rayflow.core.messages import Barrier
from rayflow.runtime.alignment import Aligned, BarrierAligner

END = "end"


class MiniTask:
    """What the task host does with the aligner's actions: hold blocked inputs, replay them."""

    def __init__(self, inputs):
        self.align = BarrierAligner(inputs)
        self.held: deque = deque()
        self.processed: list = []
        self.snapshots: dict[int, list] = {}
        self.abandoned: list[int] = []

    def push(self, msg, sender):
        if self.align.is_blocked(sender):
            self.held.append((msg, sender))
        else:
            self.handle(msg, sender)

    def handle(self, msg, sender):
        if isinstance(msg, Barrier):
            self.act(self.align.on_barrier(msg, sender))
        elif msg == END:
            self.act(self.align.on_end(sender))
        else:
            self.processed.append(msg)

    def act(self, actions):
        for a in actions:
            if isinstance(a, Aligned):
                assert a.barrier.checkpoint_id not in self.snapshots
                self.snapshots[a.barrier.checkpoint_id] = list(self.processed)
            else:
                self.abandoned.append(a.checkpoint_id)
            held, self.held = self.held, deque()
            for msg, s in held:
                if self.align.is_blocked(s):
                    self.held.append((msg, s))
                else:
                    self.handle(msg, s)


def test_a_barrier_that_one_source_skipped_does_not_mix_two_cuts():
    # checkpoint 1 was aborted after source A injected it and before source B did
    a, b = ("s", 0), ("s", 1)
    t = MiniTask([a, b])
    for msg, s in [("a1", a), (Barrier(1), a), ("a2", a), ("b1", b), (Barrier(2), b),
                   ("b2", b), (Barrier(2), a), ("a3", a), (END, a), (END, b)]:
        t.push(msg, s)
    assert t.abandoned == [1]
    assert set(t.snapshots) == {2}
    assert sorted(t.snapshots[2]) == ["a1", "a2", "b1"]  # a2 lies before A's barrier 2
    assert sorted(t.processed) == ["a1", "a2", "a3", "b1", "b2"]


def test_a_stale_barrier_is_ignored_and_does_not_block():
    a, b = ("s", 0), ("s", 1)
    t = MiniTask([a, b])
    for msg, s in [(Barrier(2), a), (Barrier(2), b), (Barrier(1), b), ("b1", b)]:
        t.push(msg, s)
    assert set(t.snapshots) == {2} and t.processed == ["b1"]
    assert not t.align.is_blocked(b)


def test_an_ended_input_is_not_waited_for():
    a, b = ("s", 0), ("s", 1)
    t = MiniTask([a, b])
    t.push(Barrier(1), a)
    t.push("a1", a)
    assert t.snapshots == {}
    t.push(END, b)
    assert t.snapshots == {1: []} and t.processed == ["a1"]


def _streams(rng, n_inputs, n_checkpoints):
    """Per input: data and barriers in order; each checkpoint reaches a random subset of the
    sources (aborted ones), the last always all of them; then the end."""
    streams = {("u", i): [] for i in range(n_inputs)}
    reach = {c: (set(streams) if c == n_checkpoints or rng.random() < 0.6 else
                 {s for s in streams if rng.random() < 0.5}) for c in range(1, n_checkpoints + 1)}
    for s, out in streams.items():
        k = 0
        for c in range(1, n_checkpoints + 1):
            for _ in range(rng.randrange(4)):
                out.append(f"{s[1]}:{k}")
                k += 1
            if s in reach[c]:
                out.append(Barrier(c))
        out.extend(f"{s[1]}:{k + j}" for j in range(rng.randrange(3)))
        out.append(END)
    return streams


@pytest.mark.parametrize("seed", range(200))
def test_every_snapshot_is_a_consistent_cut(seed):
    rng = random.Random(seed)
    streams = _streams(rng, rng.randint(1, 4), rng.randint(1, 5))
    t = MiniTask(streams)
    cursors = {s: 0 for s in streams}
    while any(cursors[s] < len(streams[s]) for s in streams):
        s = rng.choice([s for s in streams if cursors[s] < len(streams[s])])
        t.push(streams[s][cursors[s]], s)
        cursors[s] += 1
    every = [m for s in streams for m in streams[s] if isinstance(m, str) and m != END]
    assert sorted(t.processed) == sorted(every)  # nothing lost, nothing twice
    assert not t.held
    for cid, seen in t.snapshots.items():
        expect = []
        for msgs in streams.values():
            if Barrier(cid) in msgs:
                upto = msgs.index(Barrier(cid))
            else:  # an input without this barrier must have ended before the snapshot
                upto = len(msgs)
            expect += [m for m in msgs[:upto] if isinstance(m, str) and m != END]
        assert sorted(seen) == sorted(expect), f"checkpoint {cid} is not a cut"
    last = max(c for s in streams for c in [m.checkpoint_id for m in streams[s]
                                                 if isinstance(m, Barrier)] or [0])
    if last:
        assert last in t.snapshots  # the checkpoint every source injected always aligns
    assert all(isinstance(c, int) for c in t.abandoned)
