"""A rule-based property test of the state backends: Hypothesis runs random sequences of
every state call (reads and writes one by one and in batches, pops, deletes, snapshots,
restores from any earlier snapshot) against a plain dict, on each backend; RocksDB with a
cache of 0, 1, 2 and 5 entries, so that the cache fills, spills straight to RocksDB, reads
in batches or key by key, and empties after snapshots. Every read must return what the
dict holds, and every snapshot must restore the dict of its moment."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rayflow.state import FsBackend, MemoryBackend, RocksDBBackend

KEYS = st.one_of(st.integers(0, 6), st.sampled_from(["a", "b", ("w", 1, (0.0, 1.0))]))
VALUES = st.one_of(st.integers(-3, 3), st.tuples(st.integers(0, 3), st.text(max_size=2)),
                   st.lists(st.integers(0, 3), max_size=3))
BACKENDS = ["memory", "filesystem", "rocksdb-0", "rocksdb-1", "rocksdb-2", "rocksdb-5"]


class StateMachine(RuleBasedStateMachine):
    """One backend's state against a dict."""

    backend_name = "memory"

    @initialize()
    def open(self):
        self.dir = tempfile.TemporaryDirectory()
        name = self.backend_name
        if name == "memory":
            self.backend = MemoryBackend()
        elif name == "filesystem":
            self.backend = FsBackend(self.dir.name)
        else:
            self.backend = RocksDBBackend(self.dir.name, cache_entries=int(name.split("-")[1]))
        self.state = self.backend.open("step", 0, "job")
        self.model: dict = {}
        self.snapshots: list = []  # (handle, the dict it must restore)
        self.ids = 0

    def teardown(self):
        if hasattr(self, "state"):
            self.state.close()
            self.dir.cleanup()

    @rule(key=KEYS)
    def get(self, key):
        assert self.state.get(key) == self.model.get(key)

    @rule(key=KEYS, value=VALUES)
    def put(self, key, value):
        self.state.put(key, value)
        self.model[key] = value

    @rule(key=KEYS)
    def delete(self, key):
        self.state.delete(key)
        self.model.pop(key, None)

    @rule(key=KEYS)
    def pop(self, key):
        assert self.state.pop(key) == self.model.pop(key, None)

    @rule(keys=st.lists(KEYS, max_size=8))
    def get_many(self, keys):
        assert self.state.get_many(keys) == [self.model.get(k) for k in keys]

    @rule(pairs=st.lists(st.tuples(KEYS, VALUES), max_size=8), as_dict=st.booleans())
    def put_many(self, pairs, as_dict):
        self.state.put_many(dict(pairs) if as_dict else pairs)
        self.model.update(pairs)

    @rule(keys=st.lists(KEYS, max_size=8))
    def pop_many(self, keys):
        want = []
        for k in keys:  # a key popped twice is gone the second time
            want.append(self.model.pop(k, None))
        assert self.state.pop_many(keys) == want

    @rule()
    def snapshot(self):
        self.ids += 1
        self.snapshots.append((self.state.snapshot(self.ids), dict(self.model)))

    @precondition(lambda self: self.snapshots)
    @rule(which=st.integers(0, 100))
    def restore(self, which):
        """A failure: go on from an earlier snapshot, in a new state."""
        handle, model = self.snapshots[which % len(self.snapshots)]
        self.state.close()
        self.state = self.backend.open("step", 0, "job", handle)
        self.model = dict(model)

    @invariant()
    def same_items(self):
        if hasattr(self, "state"):
            assert dict(self.state.items()) == self.model
            assert len(self.state) == len(self.model)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_every_backend_behaves_as_a_dict(backend_name):
    if backend_name.startswith("rocksdb"):
        pytest.importorskip("rocksdict")
    machine = type(f"Machine_{backend_name.replace('-', '_')}", (StateMachine,),
                   {"backend_name": backend_name})
    machine.TestCase.settings = settings(
        max_examples=25, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow])
    machine.TestCase().runTest()
