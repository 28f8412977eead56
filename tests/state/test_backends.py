"""All three state backends behave identically: same reads, same snapshots, same restores."""

import pytest

from rayflow.state import FsBackend, MemoryBackend, RocksDBBackend, backend_from_name


@pytest.fixture(params=["memory", "filesystem", "rocksdb", "rocksdb-no-bloom",
                        "rocksdb-no-cache", "rocksdb-small-cache"])
def backend(request, tmp_path):
    if request.param.startswith("rocksdb"):
        pytest.importorskip("rocksdict")
    where = str(tmp_path / request.param)
    if request.param == "rocksdb-no-bloom":
        return RocksDBBackend(where, bloom_bits=0)
    if request.param == "rocksdb-no-cache":
        return RocksDBBackend(where, cache_entries=0)
    if request.param == "rocksdb-small-cache":  # smaller than most batches: it fills and empties
        return RocksDBBackend(where, cache_entries=7)
    return backend_from_name(request.param, str(tmp_path / request.param))


def test_put_get_delete_items(backend):
    s = backend.open("step", 0, "job")
    s.put("a", 1)
    s.put("b", {"n": [1, 2]})
    s.put(("t", 3), 2.5)
    assert s.get("a") == 1 and s.get("b") == {"n": [1, 2]} and s.get(("t", 3)) == 2.5
    assert s.get("zz", 7) == 7
    s.delete("a")
    assert s.get("a") is None
    assert dict(s.items()) == {"b": {"n": [1, 2]}, ("t", 3): 2.5}
    assert len(s) == 2
    s.close()


def test_snapshots_are_isolated_from_later_writes(backend):
    s = backend.open("step", 1, "job")
    for i in range(100):
        s.put(f"k{i}", i)
    h1 = s.snapshot(1)
    s.put("k0", -1)
    s.delete("k1")
    h2 = s.snapshot(2)
    r1 = backend.open("step", 1, "job", h1)
    r2 = backend.open("step", 1, "job", h2)
    assert r1.get("k0") == 0 and r1.get("k1") == 1 and len(r1) == 100
    assert r2.get("k0") == -1 and r2.get("k1") is None and len(r2) == 99
    for st in (s, r1, r2):
        st.close()


def test_snapshots_restore_shared_cyclic_and_deep_values(backend):
    """Snapshots pickle without pickle's memo (faster): a value shared by two keys comes
    back equal, as a copy each; a value that refers to itself takes the memo after all and
    comes back as the same cycle; deeply nested values come back whole."""
    s = backend.open("step", 2, "job")
    shared = ["x", 1]
    cyclic: list = ["c"]
    cyclic.append(cyclic)
    deep: list = []
    inner = deep
    for _ in range(120):
        inner.append([])
        inner = inner[0]
    s.put("a", (shared, "s"))
    s.put("b", {"also": shared})
    s.put("deep", deep)
    h1 = s.snapshot(1)
    s.put("cycle", cyclic)
    s.put("a", (shared, "t"))  # a delta (memory), with the cycle in it
    h2 = s.snapshot(2)
    r1 = backend.open("step", 2, "job", h1)
    r2 = backend.open("step", 2, "job", h2)
    assert r1.get("a") == (["x", 1], "s") and r1.get("b") == {"also": ["x", 1]}
    assert r1.get("deep") == deep and r1.get("cycle") is None
    got = r2.get("cycle")
    assert got[0] == "c" and got[1] is got
    assert r2.get("a") == (["x", 1], "t") and r2.get("deep") == deep
    for st in (s, r1, r2):
        st.close()


def test_dump_state_falls_back_to_the_memo_for_a_cycle_only():
    import io
    import pickle

    from rayflow.state.backends import dump_state, dumps_state

    value = {"k": [("row", i) for i in range(50)], "s": "same"}
    assert pickle.loads(dumps_state(value)) == value
    shared = ("a" * 100,)
    # without the memo, a shared object is written once per reference
    assert len(dumps_state([shared] * 10)) > len(pickle.dumps([shared] * 10, protocol=5))
    cycle: list = [1]
    cycle.append(cycle)
    f = io.BytesIO(b"head")
    f.seek(4)
    dump_state({"c": cycle}, f)  # the failed fast attempt is cut off, the rest stays
    assert f.getvalue()[:4] == b"head"
    back = pickle.loads(f.getvalue()[4:])
    assert back["c"][1] is back["c"]


def test_backend_names_and_errors(tmp_path):
    assert isinstance(backend_from_name("memory"), MemoryBackend)
    assert isinstance(backend_from_name("fs", str(tmp_path)), FsBackend)
    assert isinstance(backend_from_name("rocksdb"), RocksDBBackend)
    with pytest.raises(ValueError, match="needs a directory"):
        backend_from_name("filesystem")
    with pytest.raises(ValueError, match="unknown state backend 'x'"):
        backend_from_name("x")


def test_rocksdb_options_are_checked(tmp_path):
    pytest.importorskip("rocksdict")
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="cache_entries must be an int >= 0"):
            RocksDBBackend(str(tmp_path), cache_entries=bad)
    with pytest.raises(ValueError, match="bloom_bits must be an int >= 0"):
        RocksDBBackend(str(tmp_path), bloom_bits=-2)


def test_rocksdb_cache_stays_bounded_and_writes_reach_rocksdb_at_a_snapshot(tmp_path):
    """The cache keeps at most ``cache_entries`` entries: writes to cached keys reach the
    database at a snapshot, keys beyond a full cache and deletes go to it at once (a popped
    key leaves the cache), and a snapshot empties a full cache so that it fills again."""
    pytest.importorskip("rocksdict")
    import pickle

    def in_db(st):  # (the pickled keys: a snapshot also keeps its sequence of partials)
        return {pickle.loads(k): v for k, v in st.db.items() if k[:1] == b"\x80"}

    be = RocksDBBackend(str(tmp_path), cache_entries=100)
    s = be.open("step", 0, "job")
    for i in range(100):
        s.put(i, i)
    assert in_db(s) == {} and s.get(7) == 7  # all cached, none written yet
    for i in range(100, 1000):
        s.put(i, i)
        assert s.get(i - 50) == i - 50
        assert len(s._cache) <= 100
    s.put_many({i: -i for i in range(50)})
    s.delete(999)
    assert s.pop_many([5, 998, 5]) == [-5, 998, None]
    assert in_db(s) == {i: i for i in range(100, 998)}  # the cached keys: not yet
    assert len(s._cache) == 99  # a popped key leaves the cache
    h = s.snapshot(1)
    want = {i: (-i if i < 50 else i) for i in range(998) if i != 5}
    assert in_db(s) == want and len(s._cache) == 99  # (not full: kept)
    s.put_many([(2000, "x"), (2001, "y")])  # one more fits; the next goes to RocksDB
    assert len(s._cache) == 100 and 2000 not in in_db(s) and in_db(s)[2001] == "y"
    s.snapshot(2)
    assert in_db(s)[2000] == "x" and len(s._cache) == 0  # full: emptied, to fill again
    r = be.open("step", 0, "job", h)
    assert dict(r.items()) == want
    assert r.get_many([5, 6, 2000]) == [None, -6, None]
    for st in (s, r):
        st.close()


def test_rocksdb_keys_born_and_gone_between_snapshots_cost_no_delete(tmp_path):
    """A key read as absent, written and popped (or deleted) before any snapshot writes it
    out never reaches RocksDB, not even as a tombstone; one written out at a snapshot is
    deleted in RocksDB when popped, and stays deleted after a restore."""
    pytest.importorskip("rocksdict")

    def deletes(st):
        return st.db.property_int_value("rocksdb.num-deletes-active-mem-table")

    s = RocksDBBackend(str(tmp_path), cache_entries=100).open("step", 0, "job")
    born = [("__w", k, (0.0, 1.0)) for k in range(10)]
    assert s.get_many(born) == [None] * 10  # absent: the window opens
    s.put_many({k: 1 for k in born})
    assert s.get(("__w", 10, (0.0, 1.0))) is None
    s.put(("__w", 10, (0.0, 1.0)), 2)
    s.delete(("__w", 10, (0.0, 1.0)))
    assert s.pop_many(born) == [1] * 10  # the window fires before any snapshot
    s.write_out()
    assert deletes(s) == 0 and dict(s.items()) == {}
    # written out at a snapshot, then fired: deleted in RocksDB
    assert s.get_many(born) == [None] * 10
    s.put_many({k: 3 for k in born})
    s.snapshot(1)
    assert s.pop_many(born[:4]) == [3] * 4
    s.delete(born[4])
    s.write_out()
    assert deletes(s) == 5  # (the snapshot flushed the memtable: counted since)
    h = s.snapshot(2)
    r = RocksDBBackend(str(tmp_path), cache_entries=100).open("step", 0, "job", h)
    assert dict(r.items()) == {k: 3 for k in born[5:]}
    for st in (s, r):
        st.close()


@pytest.mark.parametrize("seed", range(6))
def test_every_snapshot_restores_the_state_it_was_taken_of(backend, seed):
    """Random puts and pops (one by one and in batches), deletes and snapshots, restores from
    any earlier snapshot (the memory backend's are incremental: deltas on deltas, full ones
    when the chain grows) and writes after a restore: each snapshot restores exactly the plain
    dict of its moment, and a batched read sees what a read key by key sees."""
    import random

    rnd = random.Random(seed)
    s = backend.open("step", 2, f"job{seed}")
    model: dict = {}
    taken: list = []  # (handle, the dict it must restore)
    for cid in range(1, 60):
        for _ in range(rnd.choice([0, 1, 5, 40])):
            k = rnd.randrange(300)
            if rnd.random() < 0.15:
                s.delete(k)
                model.pop(k, None)
            elif rnd.random() < 0.12:
                assert s.pop(k) == model.pop(k, None)
            else:
                v = (cid, rnd.random()) if rnd.random() < 0.5 else [cid] * rnd.randrange(4)
                s.put(k, v)
                model[k] = v
        if rnd.random() < 0.5:
            pairs = [(rnd.randrange(300), (cid, i)) for i in range(rnd.choice([0, 1, 30]))]
            as_dict = rnd.random() < 0.5  # a batch given as a dict (the window step's)
            s.put_many(dict(pairs) if as_dict else pairs)
            model.update(pairs)
        if rnd.random() < 0.3:  # a batch of pops (a window firing), absent keys among them
            gone = [rnd.randrange(300) for _ in range(rnd.choice([0, 1, 15]))]
            gone = list(dict.fromkeys(gone))
            assert s.pop_many(gone) == [model.pop(k, None) for k in gone]
        probe = [rnd.randrange(300) for _ in range(20)]
        assert s.get_many(probe) == [model.get(k) for k in probe]
        taken.append((s.snapshot(cid), dict(model)))
        if rnd.random() < 0.1:  # a failure: go on from an earlier snapshot
            handle, state = taken[rnd.randrange(len(taken))]
            s.close()
            s = backend.open("step", 2, f"job{seed}", handle)
            model = dict(state)
    for handle, state in taken:
        r = backend.open("step", 2, f"job{seed}", handle)
        assert dict(r.items()) == state
        r.close()
    s.close()


def test_memory_snapshots_write_only_what_changed():
    from rayflow.metrics import handle_bytes

    s = MemoryBackend().open("step", 0, "job")
    for i in range(10_000):
        s.put(i, f"{i:050d}")
    full = s.snapshot(1)
    s.put(7, "y")
    delta = s.snapshot(2)
    assert handle_bytes(full) > 500_000 and handle_bytes(delta) < 100
    assert MemoryBackend().open("step", 0, "job", delta).get(7) == "y"
    # a chain never grows past max_depth: then a full snapshot starts a new one
    handles = []
    for cid in range(3, 40):
        s.put(cid, cid)
        handles.append(s.snapshot(cid))
    assert max(getattr(h, "depth", 0) for h in handles) == s.max_depth
    assert sum(isinstance(h, bytes) for h in handles) >= 2


def test_memory_snapshot_is_full_once_most_keys_changed():
    """Past half of the state's keys changed since the last checkpoint, the changes are not
    tracked and the next snapshot is a full one, which restores exactly; then deltas again."""
    s = MemoryBackend().open("step", 0, "job")
    s.put_many({i: i for i in range(1_000)})
    s.snapshot(1)
    s.put_many({i: -i for i in range(400)})  # 400 of 1,000: a delta
    delta = s.snapshot(2)
    assert not isinstance(delta, bytes) and delta.depth == 1
    s.pop_many(list(range(400, 750)))  # 350 gone and 100 new: 450 changed, 750 keys
    s.put_many([(i, "n") for i in range(2_000, 2_100)])
    full = s.snapshot(3)
    assert isinstance(full, bytes)
    want = {**{i: -i for i in range(400)}, **{i: i for i in range(750, 1_000)},
            **{i: "n" for i in range(2_000, 2_100)}}
    assert dict(MemoryBackend().open("step", 0, "job", full).items()) == want
    s.put(5, "x")  # tracked again after the full snapshot
    again = s.snapshot(4)
    assert not isinstance(again, bytes) and again.depth == 1
    assert dict(MemoryBackend().open("step", 0, "job", again).items()) == {**want, 5: "x"}


def test_the_checkpoint_settings_choose_the_backend_and_its_cache(tmp_path):
    pytest.importorskip("rocksdict")
    from rayflow.config import CheckpointOptions, ConfigError, load_config
    from rayflow.runtime.launcher import backend_of

    assert backend_of(CheckpointOptions(state_backend="rocksdb")) == RocksDBBackend(
        None, cache_entries=65_536)
    got = backend_of(CheckpointOptions(state_backend="rocksdb", state_dir=str(tmp_path),
                                       rocksdb_cache_entries=0))
    assert got == RocksDBBackend(str(tmp_path), cache_entries=0)
    assert backend_of(CheckpointOptions()) == MemoryBackend()
    assert load_config(checkpoint={"rocksdb_cache_entries": 5}).checkpoint \
        .rocksdb_cache_entries == 5
    with pytest.raises(ConfigError, match="rocksdb_cache_entries"):
        load_config(checkpoint={"rocksdb_cache_entries": -1})


_PARTIAL_STATES = [("rocksdb", cache, chunk) for cache in (0, 3, 1000) for chunk in (2, 4096)] \
    + [("memory", 0, 0), ("filesystem", 0, 0)]


@pytest.mark.parametrize("kind,cache_entries,scan_chunk", _PARTIAL_STATES)
@pytest.mark.parametrize("seed", range(4))
def test_partials_merge_in_order_through_snapshots_and_rescales(tmp_path, monkeypatch, kind,
                                                                cache_entries, seed,
                                                                scan_chunk):
    """Partials added to namespaces (keys that are each other's prefix as text, tuples,
    numbers; on RocksDB a cache that holds none, some or all of them, and scans that read
    them a few at a time, so that a chunk ends inside a key's partials, at a namespace's
    end and past it, or all at once, and writes split into entries of two keys) come back
    from ``take_partials`` as one value per key, merged in the order they were added (list
    concatenation, which order changes), as a plain dict of lists says; ``read_partials``
    returns the same and leaves them; ``drop_partials`` removes one key's; a dict state's
    namespace changed in place (``live_partials``) keeps the change; a snapshot (on memory
    an incremental one, on top of the restored one) restores them, and ``items``/``put``
    carry them to another state (a rescale). A namespace taken is gone, from RocksDB too."""
    import operator
    import pickle
    import random

    from rayflow.state import backends

    rng = random.Random(seed)
    keys = ["a", "ab", "abc", ("t", 1), ("t", 10), 1, 10, 1.5, b"a"]
    spaces = [(0.0, 1.0), (1.0, 2.0), ("w", 3)]
    if kind == "rocksdb":
        pytest.importorskip("rocksdict")
        monkeypatch.setattr(backends, "_SCAN_CHUNK", scan_chunk)
        if scan_chunk == 2:  # and a write of more than two keys split into several entries
            monkeypatch.setattr(backends, "_BLOB_KEYS", 2)
        be = RocksDBBackend(str(tmp_path), cache_entries=cache_entries)
    else:
        be = backend_from_name(kind, str(tmp_path))
    s = be.open("step", 0, "job")
    s.put("plain", 42)  # an ordinary entry beside the partials
    model: dict = {}
    n = 0

    def check_take(st, ns):
        want = {k: v for (space, k), v in model.items() if space == ns}
        got = st.take_partials(ns, operator.add)
        assert len(got) == len({k for k, _ in got})  # each key once
        assert dict(got) == want
        for k in want:
            del model[(ns, k)]
        assert st.take_partials(ns, operator.add) == []

    for step in range(60):
        op = rng.random()
        if op < 0.7:
            ns = rng.choice(spaces)
            pairs = {}
            for k in rng.sample(keys, rng.randint(1, len(keys))):
                n += 1
                pairs[k] = [n]
                model[(ns, k)] = model.get((ns, k), []) + [n]
            live = s.live_partials(ns) if op < 0.35 else None
            if live is None:
                s.add_partials(ns, pairs, operator.add)
            else:  # a dict state's own namespace, changed in place (its value lists too)
                assert kind != "rocksdb"
                for k, v in pairs.items():
                    if k in live:
                        live[k] += v
                    else:
                        live[k] = v
        elif op < 0.76:
            ns = rng.choice(spaces)
            got = s.read_partials(ns, operator.add)
            assert len(got) == len({k for k, _ in got})
            assert dict(got) == {k: v for (space, k), v in model.items() if space == ns}
            # (its values may be the state's own: a caller merges them into fresh ones)
            assert s.read_partials(ns, operator.add) == got
        elif op < 0.8:
            check_take(s, rng.choice(spaces))
        elif op < 0.87:
            ns, k = rng.choice(spaces), rng.choice(keys)
            s.drop_partials(ns, k)
            model.pop((ns, k), None)
        elif op < 0.94:  # restore from a snapshot: the same partials
            h = s.snapshot(step)
            s.close()
            s = be.open("step", 0, "job", h)
        else:  # a rescale: every entry through items() into a fresh state
            fresh = be.open("step", 1, "job")
            for k, v in s.items():
                fresh.put(k, v)
            s.close()
            s = fresh
    assert s.get("plain") == 42
    for ns in spaces:
        check_take(s, ns)
    assert model == {}
    if kind == "rocksdb":
        s.flush()
        # no partial left in RocksDB (beside the entry and the sequence a snapshot keeps)
        assert set(s.db.keys()) <= {pickle.dumps("plain"), b"\x01seq"}
    else:  # nor an empty namespace in the dict
        assert dict(s.items()) == {"plain": 42} and len(s) == 1
    s.close()


@pytest.mark.parametrize("cache_entries", [0, 2])
def test_rocksdb_partials_of_a_long_window_are_folded_and_stay_bounded(tmp_path, monkeypatch,
                                                                        cache_entries):
    """A namespace that keeps getting partials (a long window, its keys in every batch) is
    folded once it holds ``FOLD_AT`` of them and twice what its last fold left: RocksDB
    never holds more than ``FOLD_AT`` partials or two per key of it, and the values are
    what they would be unfolded, in order."""
    pytest.importorskip("rocksdict")
    import operator

    from rayflow.state import backends

    monkeypatch.setattr(backends, "FOLD_AT", 20)
    s = RocksDBBackend(str(tmp_path), cache_entries=cache_entries).open("step", 0, "job")
    ns, keys, want = ("w", 0), [f"k{i}" for i in range(6)], {}
    most = 0
    for b in range(200):
        pairs = {k: [b] for k in keys[b % 3:]}  # 4 to 6 keys a batch
        for k, v in pairs.items():
            want[k] = want.get(k, []) + v
        s.add_partials(ns, pairs, operator.add)
        if b % 7 == 0:
            s.write_out()  # (a snapshot's write-out: the cached partials too)
        on_disk = sum(1 for k in s.db.keys() if k[:1] == b"\x00")
        most = max(most, on_disk)
    assert most <= max(20, 2 * len(keys)) + len(keys)  # (+ the batch that triggers a fold)
    assert dict(s.take_partials(ns, operator.add)) == want
    s.close()


def test_rocksdb_partials_keep_their_order_when_a_restore_runs_on_a_clock_behind(tmp_path,
                                                                                 monkeypatch):
    """A restore or a rescale on a machine whose clock is an hour behind: the partials it
    adds still come after the restored ones (the snapshot keeps its sequence, a partial put
    back moves it on)."""
    pytest.importorskip("rocksdict")
    import operator
    import time as real_time

    from rayflow.state import backends

    be = RocksDBBackend(str(tmp_path), cache_entries=0)
    s = be.open("step", 0, "job")
    s.add_partials("w", {"k": [1]}, operator.add)
    h = s.snapshot(1)
    behind = real_time.time_ns() - 3600 * 10**9
    monkeypatch.setattr(backends.time, "time_ns", lambda: behind)
    restored = be.open("step", 0, "job", h)
    restored.add_partials("w", {"k": [2]}, operator.add)
    assert restored.take_partials("w", operator.add) == [("k", [1, 2])]
    rescaled = be.open("step", 1, "job")  # a rescale: the old entries put back
    for k, v in s.items():
        rescaled.put(k, v)
    rescaled.add_partials("w", {"k": [3]}, operator.add)
    assert rescaled.take_partials("w", operator.add) == [("k", [1, 3])]
    for st in (s, restored, rescaled):
        st.close()


def test_rocksdb_partials_of_an_entry_per_key_snapshot_are_read_in_order(tmp_path):
    """A snapshot of the version that wrote an entry per key and partial (``ns | key |
    seq``) restores as it was: each key's partials in the order written, those added after
    the restore after them, and a dropped key gone."""
    pytest.importorskip("rocksdict")
    import operator
    import pickle

    from rayflow.state import backends

    be = RocksDBBackend(str(tmp_path), cache_entries=0)
    old = be.open("step", 0, "job")
    old.put("plain", 42)
    seq = 10**18
    for ns in ("w", ("w", 2)):
        for k, v in (("a", [1]), ("ab", [2]), ("a", [3]), (("t", 1), [4]), ("ab", [5])):
            seq += 1
            old.db[backends._ns_prefix(ns) + pickle.dumps(k) + seq.to_bytes(8, "big")] = v
    old.db[backends._SEQ_KEY] = seq
    h = old.snapshot(1)
    old.close()
    s = be.open("step", 0, "job", h)
    assert s.get("plain") == 42
    s.add_partials("w", {"a": [6]}, operator.add)
    s.drop_partials(("w", 2), "ab")
    want = {"a": [1, 3, 6], "ab": [2, 5], ("t", 1): [4]}
    assert dict(s.read_partials("w", operator.add)) == want
    rescaled = be.open("step", 1, "job")  # and through items() into another state
    for k, v in s.items():
        rescaled.put(k, v)
    for st in (s, rescaled):
        assert dict(st.take_partials("w", operator.add)) == want
        assert dict(st.take_partials(("w", 2), operator.add)) == {"a": [1, 3], ("t", 1): [4]}
        st.close()
