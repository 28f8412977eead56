"""All three state backends behave identically: same reads, same snapshots, same restores."""

import pytest

from rayflow.state import FsBackend, MemoryBackend, RocksDBBackend, backend_from_name


@pytest.fixture(params=["memory", "filesystem", "rocksdb"])
def backend(request, tmp_path):
    if request.param == "rocksdb":
        pytest.importorskip("rocksdict")
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


def test_backend_names_and_errors(tmp_path):
    assert isinstance(backend_from_name("memory"), MemoryBackend)
    assert isinstance(backend_from_name("fs", str(tmp_path)), FsBackend)
    assert isinstance(backend_from_name("rocksdb"), RocksDBBackend)
    with pytest.raises(ValueError, match="needs a directory"):
        backend_from_name("filesystem")
    with pytest.raises(ValueError, match="unknown state backend 'x'"):
        backend_from_name("x")
