"""Keyed state of a step instance behind a small typed key-value interface.

Three backends, identical in behaviour, different in speed and capacity:

- :class:`MemoryBackend` keeps state in a dict; a snapshot is the pickled dict, held by the
  checkpoint coordinator.
- :class:`FsBackend` keeps working state in a dict too and writes each snapshot to a file
  under a directory (shared storage on a cluster), like Flink's filesystem backend.
- :class:`RocksDBBackend` keeps state in RocksDB (rocksdict) on local disk, for state larger
  than memory; a snapshot is a RocksDB checkpoint (hard-linked files) under a directory.

    >>> state = MemoryBackend().open("wc", 0, "job")
    >>> state.put("w", 3); state.get("w")
    3
    >>> restored = MemoryBackend().open("wc", 0, "job", state.snapshot(1))
    >>> restored.get("w"), restored.get("missing", 0)
    (3, 0)
"""

from rayflow.state.backends import (
    FsBackend,
    KeyValueState,
    MemoryBackend,
    RocksDBBackend,
    StateBackend,
    backend_from_name,
)

__all__ = ["FsBackend", "KeyValueState", "MemoryBackend", "RocksDBBackend", "StateBackend",
           "backend_from_name"]
