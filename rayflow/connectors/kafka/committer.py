"""The transactions of an exactly-once Kafka sink instance, run in a process of its own.

A commit writes every record of its epochs with a header that names it (see
:mod:`rayflow.connectors.kafka.transactional`). In the sink's process those client calls
hold Python's GIL, so a commit took its time from the operators chained with the sink
(measured on the 2-core VM, word count at parallelism 1: 0.4 s of a 2.4 s run, about
1.6 microseconds a record). Here they run beside it, on another core.

The parent hands over an epoch as its checkpoint holds it (a few numpy arrays, see
:class:`~rayflow.connectors.kafka.transactional.PackedEpoch`), written to a socket from
where they lie (pickle protocol 5, out of band): no record pickled, no copy made first.
The child owns the transactional producer: it fences the instance's predecessor when it
starts, and it takes the commit turn when commits are serialized (the turn is a file
lock, so it is the child's while it runs a transaction).

If the parent dies, so does the child, at once, mid-transaction too: a thread reads the
socket all the time, and its end of file exits the process. A restored instance then finds
on the topic what that transaction had written, as it would after the death of a sink
whose client ran in its own process.

The child loads this file and the client adapters (``clients.py``) by their paths, not the
rayflow package: neither imports anything of rayflow at the top, so the child starts with
numpy, filelock and the Kafka client only (0.19 s and 43 MB against 0.45 s and 55 MB on the
2-core VM). Keep them that way.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pickle
import queue
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

#: The header that names each record of an exactly-once sink: ``writer:epoch:seq``.
EPOCH_HEADER = "rayflow.epoch"

#: How long a commit waits for its turn when commits are serialized.
SERIAL_COMMIT_TIMEOUT_S = 120.0

#: How long the parent waits for the child to close its producer (it flushes nothing:
#: every transaction it ran was committed or failed already).
CLOSE_TIMEOUT_S = 10.0


def commit_lock(bootstrap: str):
    """The lock that serializes the commits to ``bootstrap`` of every sink instance on this
    machine (a file lock: the OS drops it when its holder dies, however it dies)."""
    from filelock import FileLock

    name = hashlib.blake2b(bootstrap.encode(), digest_size=8).hexdigest()
    return FileLock(os.path.join(tempfile.gettempdir(), f"rayflow-commits-{name}.lock"),
                    timeout=SERIAL_COMMIT_TIMEOUT_S)


def _split(packed: tuple | list) -> list:
    """The list a checkpoint packed (``transactional._join``: one numpy array of the
    records joined, and one of their lengths), or a blob and lengths of the earlier
    format (bytes and an ``array``); a list as it is."""
    import numpy as np

    if isinstance(packed, list):
        return packed
    blob, lengths = packed
    data = blob.tobytes() if isinstance(blob, np.ndarray) else blob
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    return [data[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def run_transaction(producer, topic: str, writer: str, epochs: list, skip: set[bytes],
                    before_commit: Callable[[], None] | None = None) -> int:
    """Write ``epochs`` (``[(epoch, batches)]``, each batch ``(values, keys)`` packed as a
    checkpoint packs them, or as lists) in one transaction of ``producer``, each record
    with the header ``writer:epoch:seq`` (seq counts the epoch's records), but those whose
    tag is in ``skip``: the records of ours that a restore found on the topic. Returns how
    many were written. The commit process runs it; ``before_commit()``, if given, once
    every record has reached the broker."""
    producer.begin()
    sent = 0
    for cid, batches in epochs:
        seq = 0
        # the tags ``writer:epoch:seq``, made by one bytes format per record
        tag = (f"{writer}:{cid}:".encode() + b"%d").__mod__
        for packed_values, packed_keys in batches:
            values = _split(packed_values)
            keys = None if packed_keys is None else _split(packed_keys)
            n = len(values)
            tags = list(map(tag, range(seq, seq + n)))
            if skip:
                keep = [i for i, t in enumerate(tags) if t not in skip]
                values = [values[i] for i in keep]
                keys = [keys[i] for i in keep] if keys else None
                tags = [tags[i] for i in keep]
            seq += n
            if values:
                producer.send_many(topic, values, keys, (EPOCH_HEADER, tags))
                sent += len(values)
    if before_commit is not None:
        producer.flush()
        before_commit()
    producer.commit()  # flushes first
    return sent


class CommitProcessDied(ConnectionError):
    """The commit process ended while the sink still needed it (killed, out of memory)."""


class CommitFailed(RuntimeError):
    """A transaction failed in the commit process (its error, as text)."""


class CommitProcess:
    """The parent's end: a transactional producer in a child process.

    Args:
        client: ``confluent`` or ``kafka-python``.
        bootstrap, options, transactional_id: the producer's.
        serial: take the commit turn (:func:`commit_lock`) for ``init_transactions`` and
            for each transaction.
    """

    def __init__(self, client: str, bootstrap: str, options: dict, transactional_id: str,
                 serial: bool):
        mine, theirs = socket.socketpair()
        # the child finds the Kafka client where this process does (a job's environment)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, __file__, str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.conn = Connection(mine.detach())
        self.transactional_id = transactional_id
        self._lock = threading.Lock()  # one request at a time
        self._ready = False
        self._config: dict = {}
        # the child builds its producer and fences the predecessor while the job starts
        self.conn.send(("init", client, bootstrap, options, transactional_id, serial))

    def _reply(self) -> Any:
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError) as exc:
            code = self.proc.poll()
            raise CommitProcessDied(
                f"the commit process of transactional id {self.transactional_id!r} ended "
                f"(exit code {code})") from exc
        if status == "error":
            raise CommitFailed(payload)
        return payload

    def ready(self) -> None:
        """Wait until the child's producer is up and its predecessor fenced."""
        with self._lock:
            if not self._ready:
                self._config = self._reply()
                self._ready = True

    @property
    def config(self) -> dict:
        """What the child's producer was built with (its client's option names)."""
        self.ready()
        return self._config

    def transaction(self, topic: str, writer: str, epochs: list, skip: set[bytes],
                    before_commit: Callable[[], None] | None = None) -> int:
        """Write ``epochs`` (``[(epoch, batches)]``, batches as an epoch packs them) in one
        transaction, each record tagged ``writer:epoch:seq``, but those whose tag is in
        ``skip``; return how many were written. ``before_commit`` (tests: a sink that dies
        there) is called here once every record has reached the broker, before the
        transaction commits."""
        self.ready()
        # the epochs' arrays go out of band: written to the socket from where they are,
        # not copied into a pickle first (pickle protocol 5)
        buffers: list = []
        head = pickle.dumps((topic, writer, epochs, skip), protocol=5,
                            buffer_callback=buffers.append)
        with self._lock:
            try:
                self.conn.send(("txn", len(buffers), before_commit is not None))
                self.conn.send_bytes(head)
                for buf in buffers:
                    self.conn.send_bytes(buf.raw())
                if before_commit is not None:
                    self._reply()  # flushed
                    before_commit()
                    self.conn.send(("commit",))
            except OSError as exc:
                raise CommitProcessDied(f"the commit process of transactional id "
                                        f"{self.transactional_id!r} is gone") from exc
            return self._reply()

    def close(self) -> None:
        """End the child (its producer closed); kill it if it does not end in time."""
        # not in the middle of another thread's request: its parts would mix with ours
        if self._lock.acquire(timeout=CLOSE_TIMEOUT_S):
            try:
                with contextlib.suppress(OSError):
                    self.conn.send(("close",))
            finally:
                self._lock.release()
        try:
            self.proc.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()

    def kill(self) -> None:
        """End the child now, whatever it is doing (tests: a commit process that dies)."""
        self.proc.kill()
        self.proc.wait()


#: The child's program: this file, loaded by its path (argv[1]), serves the socket (argv[2]).
_CHILD = ("import importlib.util, sys; "
          "spec = importlib.util.spec_from_file_location('_rayflow_committer', sys.argv[1]); "
          "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
          "module.main()")


def _load_beside(name: str):
    """A module of this directory, loaded by its path (the child: no rayflow package)."""
    spec = importlib.util.spec_from_file_location(
        f"_rayflow_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         f"{name}.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _producer(client: str, bootstrap: str, options: dict, transactional_id: str):
    clients = _load_beside("clients")
    cls = clients._ConfluentProducer if client == "confluent" else clients._KPProducer
    return cls(bootstrap, options, transactional_id)


def _serve(conn: Connection) -> None:
    _, client, bootstrap, options, txn_id, serial = conn.recv()
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
                if msg[0] == "txn":  # its pickle, then its arrays' buffers
                    head = conn.recv_bytes()
                    buffers = [conn.recv_bytes() for _ in range(msg[1])]
                    msg = ("txn", msg[2], *pickle.loads(head, buffers=buffers))
                inbox.put(msg)
            except (EOFError, OSError):
                os._exit(0)  # the parent is gone: stop now, mid-transaction too

    threading.Thread(target=read, daemon=True).start()
    turn = commit_lock(bootstrap) if serial else contextlib.nullcontext()
    try:
        import numpy  # noqa: F401 - now, not at the first transaction (_split needs it)

        producer = _producer(client, bootstrap, options, txn_id)
        with turn:
            producer.init_transactions()  # fences an older producer of this instance
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ok", producer.config))
    while True:
        msg = inbox.get()
        if msg[0] == "close":
            with contextlib.suppress(Exception):
                producer.close()
            return
        _, hold, topic, writer, epochs, skip = msg

        def flushed() -> None:  # the parent's before_commit runs now
            conn.send(("ok", None))
            if inbox.get() != ("commit",):
                raise RuntimeError("the sink sent something else than the commit it held")

        try:
            with turn:
                n = run_transaction(producer, topic, writer, epochs, skip,
                                    flushed if hold else None)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        conn.send(("ok", n))


def main() -> None:
    """The child's entry point (see ``_CHILD``): ``argv[2]`` is its end of the socket."""
    _serve(Connection(int(sys.argv[2])))
