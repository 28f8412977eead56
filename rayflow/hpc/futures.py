"""``mpi4py.futures`` on rayflow: pools of MPI ranks that run Python calls, through the
standard :mod:`concurrent.futures` interface.

Inside ``rayflow mpirun`` a program's ``from mpi4py.futures import MPIPoolExecutor`` finds
this module; a script outside one can import it as ``rayflow.hpc.futures``. The three ways
mpi4py gives its executors workers all work:

- :class:`MPICommExecutor` ``(comm, root)``: the ranks of an existing communicator. The root
  gets an executor, every other rank serves its tasks inside the ``with`` statement (where
  it gets ``None``) until the root's executor shuts down.
- ``rayflow mpirun -n N -- python -m mpi4py.futures prog.py``: rank 0 runs the program and
  ranks 1 to N-1 are a pool shared by every :class:`MPIPoolExecutor` it creates, as
  ``mpiexec -n N python -m mpi4py.futures prog.py`` does.
- :class:`MPIPoolExecutor` ``(max_workers)`` anywhere else starts its workers: a gang of
  ``max_workers`` new Ray ranks (mpi4py spawns MPI processes). Without ``max_workers``, the
  ``MPI4PY_FUTURES_MAX_WORKERS`` environment variable, else one worker.

Calls and results travel pickled (``pickle``; what it cannot pickle, such as a lambda, by
``cloudpickle``). As in mpi4py, every worker first runs the main script as the module
``__worker__`` (its ``if __name__ == "__main__":`` block does not run there), so the
functions and globals of the script are those of the workers' own copy: an ``initializer``
that sets a global sets it for the tasks that run after it on that worker. A task's
exception is raised by its future's ``result()``, with the worker's traceback as its cause.

    >>> from rayflow.hpc.futures import MPIPoolExecutor
    >>> with MPIPoolExecutor(max_workers=2) as pool:          # doctest: +SKIP
    ...     print(list(pool.map(pow, [2, 3, 4], [5, 5, 5])))
    [32, 243, 1024]
"""

from __future__ import annotations

import atexit
import builtins
import collections
import functools
import itertools
import os
import pickle
import sys
import threading
import time
import traceback
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    BrokenExecutor,
    CancelledError,
    Executor,
    Future,
    InvalidStateError,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    TimeoutError,  # noqa: A004 - mpi4py.futures exports it under this name
    as_completed,
    wait,
)
from typing import Any

__all__ = ["ALL_COMPLETED", "FIRST_COMPLETED", "FIRST_EXCEPTION", "BrokenExecutor",
           "CancelledError", "Executor", "Future", "InvalidStateError", "MPICommExecutor",
           "MPIPoolExecutor", "ProcessPoolExecutor", "ThreadPoolExecutor", "TimeoutError",
           "as_completed", "get_comm_workers", "wait"]

# tags on the pool's own duplicate of its communicator (no user message can match them)
_TASK, _REPLY = 1, 2
_STOP = "stop"  # a worker's last message: the pool is done with it
_WAKE = "wake"  # the master's own message that ends its receiving thread
_MAX_WORKERS_ENV = "MPI4PY_FUTURES_MAX_WORKERS"


# ------------------------------------------------------------------ pickling
def _dumps(obj: Any) -> bytes:
    """``pickle`` (functions by reference, as mpi4py sends them), else ``cloudpickle`` for
    what pickle cannot name (a lambda, a function defined in a function)."""
    try:
        return pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        from ray import cloudpickle

        return cloudpickle.dumps(obj, protocol=5)


class _RemoteTraceback(Exception):
    """The worker's traceback of a task's exception (its ``__cause__``, as in
    :class:`concurrent.futures.ProcessPoolExecutor`)."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def _failure(exc: BaseException) -> bytes:
    """A worker's exception for the master: itself if it pickles, else a RuntimeError that
    names it; with its traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        return _dumps((exc, tb))
    except Exception:  # noqa: BLE001 - an exception that does not pickle
        return _dumps((RuntimeError(f"{type(exc).__name__}: {exc}"), tb))


def _raise_from(blob: bytes) -> BaseException:
    exc, tb = pickle.loads(blob)
    exc.__cause__ = _RemoteTraceback(f'\n"""\n{tb}"""')
    return exc


# ------------------------------------------------------------------ in a worker
class _WorkerState:
    """What a worker process keeps between the messages of its pool: the main script's
    module, the communicator of the workers (``get_comm_workers``)."""

    comm_workers: Any = None
    main: tuple | None = None  # the main imported as __worker__ (see _main_spec)
    saved_main: list = []


_worker = _WorkerState()


def get_comm_workers() -> Any:
    """In a task: the intracommunicator of the pool's workers (``COMM_WORLD`` of spawned
    workers, the non-root ranks of an :class:`MPICommExecutor`). Elsewhere:
    ``MPI.COMM_NULL``."""
    from rayflow.hpc import MPI

    return _worker.comm_workers if _worker.comm_workers is not None else MPI.COMM_NULL


def _main_spec() -> tuple[str, str | None, str | None] | None:
    """What the workers import as the master's main: ``("module", name, None)`` for
    ``python -m name``, ``("script", path, source)`` for a script; None for an interactive
    session or ``python -c``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return ("module", spec.name, None)
    source = getattr(main, "__rayflow_source__", None)
    path = getattr(main, "__file__", None)
    if source is None and path and _in_ray(path):  # a Ray worker's own entry point
        return None
    if source is None and path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            source = f.read()
    return ("script", path, source) if path and source is not None else None


def _in_ray(path: str) -> bool:
    import ray

    return os.path.abspath(path).startswith(os.path.dirname(os.path.abspath(ray.__file__)))


def _import_main(spec: tuple | None) -> None:
    """Run the master's main here as ``__worker__`` (its ``if __name__ == "__main__":``
    block does not run) and make it ``__main__``, so that the master's functions, pickled
    by reference, are found; once per main."""
    if spec is None or spec == _worker.main:
        return
    kind, name, source = spec
    mod = types.ModuleType("__worker__")
    if not _worker.saved_main:
        _worker.saved_main = [sys.modules.get("__main__"), list(sys.path)]
    sys.modules["__worker__"] = sys.modules["__main__"] = mod
    _worker.main = spec
    if kind == "module":
        import runpy

        mod.__dict__.update(runpy.run_module(name, run_name="__worker__"))
        return
    mod.__file__ = name
    mod.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.path.insert(0, os.path.dirname(os.path.abspath(name)))
    exec(compile(source, name, "exec"), mod.__dict__)  # noqa: S102 - the user's script


def _restore_main() -> None:
    if _worker.saved_main:
        main, path = _worker.saved_main
        if main is not None:
            sys.modules["__main__"] = main
        sys.modules.pop("__worker__", None)
        sys.path[:] = path
    _worker.saved_main, _worker.main, _worker.comm_workers = [], None, None


def _handle(msg: tuple) -> tuple:
    """One message of the master: ``("init", main, initializer)`` or ``("task", call)``;
    the reply ``(kind, ok, pickled result or failure)`` (the master knows the call by the
    worker that replies: one call at a time each)."""
    if msg[0] == "init":
        _, main, init = msg
        try:
            _import_main(main)
            if init is not None:
                fn, args = pickle.loads(init)
                fn(*args)
        except BaseException as exc:  # noqa: BLE001 - sent to the master
            return ("init", False, _failure(exc))
        return ("init", True, b"")
    try:
        fn, args, kwargs = pickle.loads(msg[1])
        return ("task", True, _dumps(fn(*args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001 - the task's outcome
        return ("task", False, _failure(exc))


def _serve_unless_root(comm: Any, root: int) -> bool:
    """Collective over ``comm``: every rank but ``root`` serves the root's tasks until it
    says stop (their ``get_comm_workers()``: the ranks but the root); True at the root, at
    once."""
    is_root = comm.Get_rank() == root
    workers = comm.Split(1 if is_root else 0)
    if is_root:
        return True
    _worker.comm_workers = workers
    try:
        _serve(comm, root)
    finally:
        _restore_main()
    return False


def _serve(comm: Any, master: int) -> None:
    """A worker rank's loop: tasks from ``master`` on ``comm`` until it says stop."""
    while True:
        msg = comm.recv(source=master, tag=_TASK)
        if msg == _STOP:
            return
        comm.send(_handle(msg), dest=master, tag=_REPLY)


# ------------------------------------------------------------------ links to the workers
class _CommLink:
    """Workers that are ranks of ``comm`` (a duplicate only the pool uses), each serving in
    :func:`_serve`; the master is rank ``comm.rank``."""

    def __init__(self, comm: Any, workers: list[int], shared: bool = False):
        self.comm, self.workers, self.shared = comm, workers, shared
        self.size = len(workers)

    def send(self, worker: int, msg: tuple) -> None:
        self.comm.send(msg, dest=self.workers[worker], tag=_TASK)

    def recv(self) -> tuple[int, Any] | None:
        """The next reply ``(worker, reply)``; None once :meth:`close` woke it."""
        from rayflow.hpc import MPI

        st = MPI.Status()
        reply = self.comm.recv(source=MPI.ANY_SOURCE, tag=_REPLY, status=st)
        if reply == _WAKE:
            return None
        return self.workers.index(st.Get_source()), reply

    def close(self, wake: bool = True) -> None:
        if not self.shared:  # a shared pool's workers wait for the next executor
            for w in self.workers:
                self.comm.send(_STOP, dest=w, tag=_TASK)
        if wake:
            self.comm.send(_WAKE, dest=self.comm.rank, tag=_REPLY)


def _spawned_worker(world: Any, group: str, size: int, rank: int) -> None:
    """A spawned worker's one run on its gang rank: ``world`` (the gang's communicator) is
    its ``COMM_WORLD`` and ``get_comm_workers()``; it joins the master's group of ``size``
    as ``rank`` and serves the master (rank 0) there until it says stop."""
    from rayflow.hpc import MPI
    from rayflow.hpc.backends.ray_backend import join_group
    from rayflow.hpc.comm import Communicator
    from rayflow.hpc.mpirun import _shim

    sys.modules.update(_shim())  # the worker's process is the pool's: kept
    MPI._bind(world)
    _worker.comm_workers = MPI.COMM_WORLD
    transport = join_group(size, rank, group)
    try:
        _serve(MPI.Intracomm(Communicator(transport, context=("futures",))), 0)
    finally:
        transport.close()
        _restore_main()


class _SpawnLink(_CommLink):
    """Workers spawned for one executor (:class:`~rayflow.hpc.spawn.Children`: a gang of
    new Ray ranks, each running :func:`_spawned_worker` in one long run). This process
    joins them as rank 0 of a group of their own (direct channels, as between the ranks
    of a gang), so a task costs a message each way, not a Ray call. A worker whose run
    ends before the pool closes (its process died) wakes the pool, which then breaks."""

    def __init__(self, n: int, options: dict):
        from rayflow.hpc import MPI
        from rayflow.hpc.backends.channels import Mailbox
        from rayflow.hpc.backends.ray_backend import join_group
        from rayflow.hpc.comm import Communicator
        from rayflow.hpc.spawn import Children

        self._children = Children(n, 1, _spawned_worker, **options)
        self._box = Mailbox()
        try:
            self._transport = join_group(n + 1, 0, self._children.group, mailbox=self._box)
        except BaseException:
            self._children.stop()
            raise
        self.lost: str | None = None
        super().__init__(MPI.Intracomm(Communicator(self._transport, context=("futures",))),
                         list(range(1, n + 1)))
        self._children.watch(self._box, self._transport.stage, self._ended)

    def _ended(self, worker: int, outcome: Any) -> str:
        """A worker's run ended before the pool closed: why, for the pool's futures."""
        why = (f"{type(outcome).__name__}: {outcome}".splitlines()[0]
               if isinstance(outcome, BaseException) else "it returned")
        self.lost = f"a spawned worker's run ended before the pool closed ({why})"
        return self.lost

    def close(self, wake: bool = True) -> None:
        self._children.done.set()
        if not self._box.aborted(self._transport.stage):
            super().close(wake)  # the workers stop; this process's receive wakes
            self._children.wait(timeout=10)
        self._transport.close()
        self._children.stop()


# ------------------------------------------------------------------ the pool (master side)
class _Pool:
    """The master's side: a queue of calls, the idle workers, and a thread that hands each
    idle worker the next call and sets each future from its worker's reply."""

    def __init__(self, link: Any, main: tuple | None, initializer: bytes | None):
        self.link, self.size = link, link.size
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._replies: collections.deque = collections.deque()
        self._running: dict[int, Future] = {}
        self._idle: list[int] = []
        self._ready = threading.Event()
        self._inits = 0
        self._done = False
        self._wake = True  # whether the receiving thread waits for close() to wake it
        self.broken: str | None = None
        for w in range(self.size):
            link.send(w, ("init", main, initializer))
        self._receiver = threading.Thread(target=self._receive, daemon=True,
                                          name="rayflow-futures-recv")
        self._manager = threading.Thread(target=self._manage, daemon=True,
                                         name="rayflow-futures")
        self._receiver.start()
        self._manager.start()

    def wait(self) -> None:
        self._ready.wait()

    def push(self, future: Future, task: tuple) -> None:
        with self._cv:
            self._queue.append((future, task))
            self._cv.notify()

    def done(self) -> None:
        with self._cv:
            self._done = True
            self._cv.notify()

    def cancel(self) -> None:
        with self._cv:
            while self._queue:
                self._queue.popleft()[0].cancel()

    def join(self) -> None:
        self._manager.join()
        self._receiver.join()

    def _receive(self) -> None:
        while True:
            try:
                got = self.link.recv()
            except Exception as exc:  # noqa: BLE001 - e.g. a transport without ANY_SOURCE
                got = ("broken", getattr(self.link, "lost", None) or (
                    f"the pool cannot receive its workers' replies: "
                    f"{type(exc).__name__}: {exc}"))
            with self._cv:
                self._replies.append(got)
                self._cv.notify()
            if got is None or got[0] == "broken":
                return

    def _break(self, why: str) -> None:
        self.broken = why
        self._ready.set()
        while self._queue:
            future, _ = self._queue.popleft()
            if future.set_running_or_notify_cancel():
                future.set_exception(BrokenExecutor(why))

    def _finished(self) -> bool:
        """Shut down, nothing running, nothing queued (or broken), every worker's
        initializer replied (no reply of this pool is left for the next one)."""
        return (self._done and not self._running and (not self._queue or bool(self.broken))
                and self._inits == self.size)

    def _manage(self) -> None:
        running = self._running
        while True:
            with self._cv:
                while not (self._replies or (self._queue and self._idle)
                           or self._finished()):
                    self._cv.wait()
                replies, self._replies = self._replies, collections.deque()
                for got in replies:
                    if got is None:
                        continue
                    if got[0] == "broken":  # no reply will come: every call fails
                        self._break(got[1])
                        self._inits, self._wake = self.size, False
                        for future in running.values():
                            future.set_exception(BrokenExecutor(got[1]))
                        running.clear()
                        continue
                    worker, (kind, ok, blob) = got
                    if kind == "init":
                        self._inits += 1
                        if not ok:
                            try:
                                why = repr(_raise_from(blob))
                            except Exception as exc:  # noqa: BLE001 - as for a result
                                why = repr(exc)
                            self._break(f"a worker's initializer failed: {why}")
                        else:
                            self._idle.append(worker)
                        if self._inits == self.size:
                            self._ready.set()
                        continue
                    future = running.pop(worker)
                    if not self.broken:
                        self._idle.append(worker)
                    try:
                        if ok:
                            future.set_result(pickle.loads(blob))
                        else:
                            future.set_exception(_raise_from(blob))
                    except Exception as exc:  # noqa: BLE001 - e.g. a class the master lacks
                        future.set_exception(exc)
                if self.broken:
                    self._break(self.broken)
                sends = []
                while self._queue and self._idle and not self.broken:
                    future, (fn, args, kwargs) = self._queue.popleft()
                    if not future.set_running_or_notify_cancel():
                        continue
                    try:
                        call = _dumps((fn, args, kwargs))
                    except Exception as exc:  # noqa: BLE001 - the call does not pickle
                        future.set_exception(exc)
                        continue
                    worker = self._idle.pop()
                    running[worker] = future
                    sends.append((worker, ("task", call)))
                finished = self._finished()
            for worker, msg in sends:  # (outside the lock: a send may wait on its peer)
                self.link.send(worker, msg)
            if finished:
                self.link.close(wake=self._wake)
                return


# ------------------------------------------------------------------ the executors
class _Shared:
    """The pool of ``python -m mpi4py.futures``: world ranks 1..N-1, shared by the master's
    executors one after another."""

    comm: Any = None
    busy = False


_shared = _Shared()
_live: weakref.WeakSet = weakref.WeakSet()  # the executors with a pool not yet shut down


def _shutdown_all() -> None:
    """Shut down every executor still running (at the end of a program or the process,
    as mpi4py does at exit): their calls finish, their workers stop."""
    for ex in list(_live):
        ex.shutdown(wait=True)


_at_exit: list[bool] = []


def _shut_down_at_exit() -> None:
    """Register :func:`_shutdown_all` at exit once, when the first pool started (after
    Ray's own exit handler, so it runs before Ray shuts down)."""
    if not _at_exit:
        _at_exit.append(True)
        atexit.register(_shutdown_all)


class MPIPoolExecutor(Executor):
    """A pool of MPI worker ranks behind :class:`concurrent.futures.Executor` (mpi4py's).

    Args:
        max_workers: spawned workers (when the executor starts its own); ignored when a
            pool of ``python -m mpi4py.futures`` or an :class:`MPICommExecutor` gives them.
        initializer, initargs: ``initializer(*initargs)`` runs once on each worker before
            its first task; if it raises, the executor is broken (``BrokenExecutor``).
        **kwargs: mpi4py's spawn settings that mean something for Ray ranks:
            ``main`` (False: workers do not import the main script), ``backend`` and
            ``rank_num_cpus`` (of the spawned gang). mpi4py's ``python_exe``,
            ``python_args``, ``mpi_info``, ``path``, ``wdir``, ``env``, ``globals`` and
            ``use_pkl5`` are refused with a ``ValueError`` rather than ignored.
    """

    _SPAWN_OPTIONS = ("backend", "rank_num_cpus", "gang_timeout_s")

    def __init__(self, max_workers: int | None = None, initializer: Callable | None = None,
                 initargs: tuple = (), **kwargs: Any):
        if max_workers is not None:
            max_workers = int(max_workers)
            if max_workers <= 0:
                raise ValueError("max_workers must be greater than 0")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        self._comm: tuple[Any, int] | None = kwargs.pop("_comm", None)
        unknown = sorted(set(kwargs) - {"main", *self._SPAWN_OPTIONS})
        if unknown:
            raise ValueError(f"MPIPoolExecutor: options {unknown} are not supported by "
                             f"rayflow (known: main, {', '.join(self._SPAWN_OPTIONS)})")
        self._max_workers_arg = max_workers
        self._initializer = (initializer, tuple(initargs)) if initializer else None
        self._options = kwargs
        self._shutdown = False
        self._lock = threading.Lock()
        self._pool: _Pool | None = None

    def _link(self) -> Any:
        if self._comm is not None:
            comm, root = self._comm
            return _CommLink(comm, [r for r in range(comm.Get_size()) if r != root])
        if _shared.comm is not None:
            if _shared.busy:
                raise RuntimeError("the pool of python -m mpi4py.futures serves one "
                                   "executor at a time; shut the other one down first")
            _shared.busy = True
            comm = _shared.comm
            return _CommLink(comm, list(range(1, comm.Get_size())), shared=True)
        if _worker.main is not None:
            raise RuntimeError("a worker of an MPIPoolExecutor tried to start workers: put "
                               "the main script's executor under "
                               "`if __name__ == \"__main__\":`")
        n = self._max_workers_arg or int(os.environ.get(_MAX_WORKERS_ENV, "1"))
        return _SpawnLink(n, {k: self._options[k] for k in self._SPAWN_OPTIONS
                              if k in self._options})

    def _bootstrap(self) -> _Pool:
        if self._pool is None:
            # the ranks of an MPICommExecutor run the main script themselves
            main = (_main_spec() if self._options.get("main", True) and self._comm is None
                    else None)
            init = _dumps(self._initializer) if self._initializer else None
            self._pool = _Pool(self._link(), main, init)
            _live.add(self)
            _shut_down_at_exit()
        return self._pool

    @property
    def num_workers(self) -> int:
        """The number of workers (0 once shut down or broken)."""
        with self._lock:
            if self._shutdown:
                return 0
            pool = self._bootstrap()
        pool.wait()
        return 0 if pool.broken else pool.size

    _max_workers = num_workers

    def bootup(self, wait: bool = True) -> MPIPoolExecutor:
        """Start the workers now (by default, at the first submission)."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot bootup after shutdown")
            pool = self._bootstrap()
        if wait:
            pool.wait()
        return self

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit after shutdown")
            pool = self._bootstrap()
            if pool.broken:
                raise BrokenExecutor(pool.broken)
            future: Future = Future()
            pool.push(future, (fn, args, kwargs))
            return future

    def map(self, fn: Callable, *iterables: Iterable, timeout: float | None = None,
            chunksize: int = 1, buffersize: int | None = None,
            unordered: bool = False) -> Iterator:
        """``map(fn, *iterables)`` on the workers: ``chunksize`` calls per message,
        ``unordered`` results as they complete, at most ``buffersize`` calls queued."""
        return self.starmap(fn, zip(*iterables), timeout, chunksize, buffersize, unordered)

    def starmap(self, fn: Callable, iterable: Iterable, timeout: float | None = None,
                chunksize: int = 1, buffersize: int | None = None,
                unordered: bool = False) -> Iterator:
        """``itertools.starmap(fn, iterable)`` on the workers (see :meth:`map`)."""
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if buffersize is not None:
            if isinstance(buffersize, bool) or not isinstance(buffersize, int):
                raise TypeError("buffersize must be an integer or None")
            if buffersize < 1:
                raise ValueError("buffersize must be None or > 0")
            if unordered:
                raise ValueError("buffersize must be None if unordered")
        if chunksize == 1:
            return _starmap(self, fn, iter(iterable), timeout, buffersize, unordered)
        chunks = _starmap(self, functools.partial(_apply_chunk, fn),
                          _chunks(iterable, chunksize), timeout, buffersize, unordered)
        return (r for chunk in chunks for r in chunk)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            pool = self._pool
            if not self._shutdown:
                self._shutdown = True
                if pool is not None:
                    pool.done()
            if cancel_futures and pool is not None:
                pool.cancel()
        if wait and pool is not None:
            pool.join()
            _live.discard(self)
            if isinstance(pool.link, _CommLink) and pool.link.shared:
                _shared.busy = False


def _apply_chunk(fn: Callable, chunk: tuple) -> list:
    return list(itertools.starmap(fn, chunk))


def _chunks(iterable: Iterable, size: int) -> Iterator[tuple]:
    it = iter(iterable)
    while chunk := tuple(itertools.islice(it, size)):
        yield (chunk,)


def _starmap(executor: MPIPoolExecutor, fn: Callable, args_iter: Iterator,
             timeout: float | None, buffersize: int | None, unordered: bool) -> Iterator:
    """The results of ``fn(*args)`` for each of ``args_iter``, in order (or as completed),
    every call submitted up front (at most ``buffersize`` ahead of the results)."""
    end = None if timeout is None else time.monotonic() + timeout
    if buffersize is not None:
        fs = collections.deque(executor.submit(fn, *a)
                               for a in itertools.islice(args_iter, buffersize))
    else:
        fs = collections.deque(executor.submit(fn, *a) for a in args_iter)
    ref = weakref.ref(executor)
    del executor

    def left() -> float | None:
        return None if end is None else end - time.monotonic()

    def results() -> Iterator:
        try:
            if unordered:
                for f in as_completed(list(fs), left()):
                    fs.remove(f)
                    yield f.result()
            else:
                while fs:
                    value = fs.popleft().result(left())
                    if buffersize is not None and (ex := ref()) is not None:
                        more = next(args_iter, None)
                        if more is not None:
                            fs.append(ex.submit(fn, *more))
                    yield value
        finally:
            for f in fs:
                f.cancel()

    return results()


class MPICommExecutor:
    """Split ``comm`` into a master (``root``) and workers (the other ranks): ``with``
    gives the master an :class:`MPIPoolExecutor` and every worker ``None``, after serving
    the master's tasks until its executor shut down (mpi4py's)::

        with MPICommExecutor(MPI.COMM_WORLD, root=0) as executor:
            if executor is not None:
                print(list(executor.map(abs, [-1, -2])))

    Collective: every rank of ``comm`` enters it. ``**kwargs`` are the executor's.
    """

    def __init__(self, comm: Any = None, root: int = 0, **kwargs: Any):
        from rayflow.hpc import MPI

        if comm is None:
            comm = MPI.COMM_WORLD
        if comm.Is_inter():
            raise ValueError("expecting an intracommunicator")
        if root < 0 or root >= comm.Get_size():
            raise ValueError("expecting root in range(comm.size)")
        if _shared.comm is not None:  # under python -m mpi4py.futures: the shared pool
            comm, root = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank()
        self._comm, self._root, self._options = comm, root, kwargs
        self._executor: MPIPoolExecutor | None = None
        self._entered = False

    def __enter__(self) -> MPIPoolExecutor | None:
        if self._entered:
            raise RuntimeError("__enter__")
        self._entered = True
        if _shared.comm is not None:
            self._executor = MPIPoolExecutor(**self._options)
            return self._executor
        comm, root = self._comm.Dup(), self._root
        if _serve_unless_root(comm, root):
            self._executor = MPIPoolExecutor(_comm=(comm, root), **self._options)
        return self._executor

    def __exit__(self, *exc: Any) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


# ------------------------------------------------------------------ python -m mpi4py.futures
def run_shared_pool(world: Any, main: Callable[[], Any]) -> Any:
    """A rank of ``python -m mpi4py.futures``: rank 0 runs ``main()`` with the other
    ranks as its executors' shared pool; the others serve it until ``main`` returns (or
    raises)."""
    comm = world.Dup()
    if not _serve_unless_root(comm, 0):
        return None
    _shared.comm, _shared.busy = comm, False
    try:
        return main()
    finally:
        _shutdown_all()
        _shared.comm = None
        for w in range(1, comm.Get_size()):
            comm.send(_STOP, dest=w, tag=_TASK)
