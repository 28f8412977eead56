"""Durable checkpoints: completed checkpoints and savepoints written under a directory (a
local or shared filesystem path, or any URL ``pyarrow.fs`` understands, e.g. ``s3://...``),
so that a job can be resumed by a new driver after ``ray job stop``, a driver crash or the
loss of the coordinator, as with ``flink run -s PATH``. No Ray.

Layout of one run of a job (``RUN = {state_dir}/checkpoints/{job}/{run_id}``)::

    RUN/chk-00000012/handles.pkl     every task's state handle (pickled)
    RUN/chk-00000012/manifest.json   job, plan, backend, guarantee, source positions; written
                                     last, so a directory without it is not a checkpoint
    RUN/positions/src-0.json         at-most-once positions, rewritten before each batch
    RUN/lease.json                   renewed every second while the run's coordinator lives

    >>> import tempfile
    >>> from rayflow.checkpoint import CompletedCheckpoint
    >>> store = CheckpointStore(tempfile.mkdtemp())
    >>> path = store.write(CompletedCheckpoint(3, {("src", 0): {0: 42}}, 1.0, 2.0),
    ...                    {"job": "demo", "state_backend": "memory"})
    >>> load_checkpoint(store.root).handles
    {('src', 0): {0: 42}}
    >>> load_checkpoint(path).meta["job"]
    'demo'
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import time
import uuid
from typing import Any

from rayflow.checkpoint import CompletedCheckpoint

MANIFEST = "manifest.json"
HANDLES = "handles.pkl"
LEASE = "lease.json"
LEASE_S = 1.0  # how often a live run renews its lease


def _fs(root: str):
    """(filesystem, path) for a local path or a URL."""
    from pyarrow import fs

    if "://" in root:
        return fs.FileSystem.from_uri(root)
    return fs.LocalFileSystem(), os.path.abspath(root)


def default_root(state_dir: str | None) -> str:
    return state_dir or os.path.join(tempfile.gettempdir(), "rayflow-state")


def run_root(state_dir: str | None, job: str, run_id: str) -> str:
    """Where the checkpoints of one run of ``job`` live."""
    return f"{default_root(state_dir).rstrip('/')}/checkpoints/{job}/{run_id}"


class CheckpointStore:
    """The durable checkpoints of one run. ``write`` keeps the newest ``retain`` ones."""

    def __init__(self, root: str, retain: int = 1):
        self.root = root
        self.retain = max(1, retain)
        self.fs, self.path = _fs(root)
        self.fs.create_dir(self.path, recursive=True)

    def _join(self, *parts: str) -> str:
        return "/".join([self.path.rstrip("/"), *parts])

    def _url(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def _replace(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` by rename: a reader sees the old file or the whole
        new one, never a part of it (an empty lease made a resume fail to read it)."""
        tmp = f"{path.rsplit('/', 1)[0]}/.{path.rsplit('/', 1)[-1]}.{uuid.uuid4().hex[:6]}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, path)

    def write(self, chk: CompletedCheckpoint, meta: dict) -> str:
        """Write ``chk`` durably; return its path. The manifest goes last and by rename."""
        name = f"chk-{chk.checkpoint_id:08d}"
        d = self._join(name)
        self.fs.create_dir(d, recursive=True)
        with self.fs.open_output_stream(f"{d}/{HANDLES}") as f:
            f.write(pickle.dumps(chk.handles, protocol=pickle.HIGHEST_PROTOCOL))
        manifest = {
            **meta,
            "checkpoint_id": chk.checkpoint_id,
            "started": chk.started,
            "completed": chk.finished,
            "savepoint": chk.savepoint,
            "final": chk.final,
            "finished_tasks": sorted([list(t) for t in chk.finished_tasks]),
            "drained_tasks": sorted([list(t) for t in chk.drained]),
            "tasks": sorted([list(t) for t in chk.handles]),
            "written": time.time(),
        }
        self._replace(f"{d}/{MANIFEST}", json.dumps(manifest, indent=1, default=repr).encode())
        chk.path = self._url(name)
        chk.meta = manifest
        self._prune(keep=name)
        return chk.path

    def _ids(self) -> list[tuple[int, str]]:
        from pyarrow import fs

        out = []
        for info in self.fs.get_file_info(fs.FileSelector(self.path, allow_not_found=True)):
            base = info.base_name
            if info.type == fs.FileType.Directory and base.startswith("chk-"):
                if self.fs.get_file_info(f"{info.path}/{MANIFEST}").type == fs.FileType.File:
                    out.append((int(base[4:]), base))
        return sorted(out)

    def _prune(self, keep: str) -> None:
        done = self._ids()
        for _, name in done[:-self.retain]:
            if name != keep:
                self.fs.delete_dir(self._join(name))

    def latest(self, newer_than: int | None = None) -> CompletedCheckpoint | None:
        """The newest checkpoint written here; with ``newer_than``, only one with a higher
        id (None otherwise, without reading it: a checkpoint can be large)."""
        ids = self._ids()
        if not ids or (newer_than is not None and ids[-1][0] <= newer_than):
            return None
        return load_checkpoint(self._url(ids[-1][1]))

    # -- at-most-once positions ----------------------------------------------------------
    def write_position(self, task: tuple[str, int], pos: Any) -> None:
        d = self._join("positions")
        self.fs.create_dir(d, recursive=True)
        self._replace(f"{d}/{task[0]}-{task[1]}.pkl", pickle.dumps(pos))

    def positions(self) -> dict[tuple[str, int], Any]:
        from pyarrow import fs

        out = {}
        sel = fs.FileSelector(self._join("positions"), allow_not_found=True)
        for info in self.fs.get_file_info(sel):
            if info.base_name.endswith(".pkl"):
                step, _, inst = info.base_name[:-4].rpartition("-")
                with self.fs.open_input_stream(info.path) as f:
                    out[(step, int(inst))] = pickle.loads(f.read())
        return out

    # -- the lease of a live run -------------------------------------------------------
    def renew_lease(self) -> None:
        """Called every second by a live run's coordinator: a resume waits until it stops."""
        self._replace(self._join(LEASE),
                      json.dumps({"t": time.time(), "n": time.monotonic_ns()}).encode())

    def remove(self) -> None:
        """Delete the run's checkpoints (after a job that finished)."""
        self.fs.delete_dir(self.path)


def load_checkpoint(path: str) -> CompletedCheckpoint:
    """The checkpoint at ``path``: a ``chk-N`` directory, or a run directory (its newest).

    Raises:
        FileNotFoundError: nothing resumable is there.
    """
    from pyarrow import fs

    filesystem, p = _fs(path)
    if filesystem.get_file_info(f"{p}/{MANIFEST}").type != fs.FileType.File:
        store = CheckpointStore.__new__(CheckpointStore)
        store.root, store.fs, store.path, store.retain = path, filesystem, p, 1
        ids = store._ids() if filesystem.get_file_info(p).type == fs.FileType.Directory else []
        if not ids:
            raise FileNotFoundError(
                f"{path}: no completed checkpoint here (expected a chk-N directory with "
                f"{MANIFEST}, or a directory holding them)")
        return load_checkpoint(f"{path.rstrip('/')}/{ids[-1][1]}")
    with filesystem.open_input_stream(f"{p}/{MANIFEST}") as f:
        meta = json.loads(f.read())
    with filesystem.open_input_stream(f"{p}/{HANDLES}") as f:
        handles = pickle.loads(f.read())
    return CompletedCheckpoint(
        meta["checkpoint_id"], handles, meta["started"], meta["completed"],
        frozenset(tuple(t) for t in meta.get("finished_tasks", [])),
        savepoint=meta.get("savepoint", False), path=path, meta=meta,
        drained=frozenset(tuple(t) for t in meta.get("drained_tasks", [])))


def _read_lease(filesystem, run: str) -> str | None:
    from pyarrow import fs

    path = f"{run}/{LEASE}"
    if filesystem.get_file_info(path).type != fs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as f:
        return f.read().decode()


def wait_until_released(path: str, timeout_s: float = 30.0) -> None:
    """Return once no live run owns the checkpoints at ``path`` (a ``chk-N`` or run
    directory): its lease is older than a few renewals, or stops changing. A run whose
    driver just died may still have a coordinator and sinks alive for a moment, which
    could complete (and commit) one more checkpoint than a resume that started at once
    would see.

    Raises:
        RuntimeError: the run is still alive after ``timeout_s``.
    """
    from pyarrow import fs

    filesystem, p = _fs(path)
    if filesystem.get_file_info(f"{p}/{MANIFEST}").type == fs.FileType.File:
        run = p.rsplit("/", 1)[0]
    else:
        run = p
    last = _read_lease(filesystem, run)
    if last is None or time.time() - json.loads(last)["t"] > 10 * LEASE_S:
        return
    deadline = time.monotonic() + timeout_s
    still = 0.0
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _read_lease(filesystem, run)
        still = still + 0.5 if now == last else 0.0
        if still >= 3 * LEASE_S:
            return
        last = now
    raise RuntimeError(f"{path}: the run that owns these checkpoints is still running (its "
                       f"coordinator renews {run}/{LEASE}); stop it before resuming from it")
