"""Run unmodified mpi4py programs as one gang-scheduled Ray stage (``rayflow mpirun``).

Usage: ``result = run_mpi("prog.py", 4, args=["--n", "100"])``

Every rank runs the program with ``from mpi4py import MPI`` resolving to
:mod:`rayflow.hpc.MPI` (a ``sys.modules`` shim installed in the rank for the run), with
``sys.argv`` set to the script and its arguments and ``__name__ == "__main__"``, and
``mpi4py.futures`` to :mod:`rayflow.hpc.futures` (with ``futures=True``, as ``python -m
mpi4py.futures``: rank 0 runs the program, the others serve its executors). The gang is
placed whole or not at all (:class:`~rayflow.hpc.gang.Gang`), so a run never starts with some
ranks missing.

A rank's stdout and stderr are captured and forwarded to the caller's streams while it runs
(every 0.2 s, in whole lines), each line prefixed with ``[rank]``. The run's exit status is the worst
rank's (the largest exit code). When a rank fails (an exception, ``sys.exit(k)`` with ``k``
non-zero, ``Comm.Abort``, or a lost rank process) the other ranks are stopped, as
``mpiexec`` does: a rank waiting on a message is woken, and one that does not stop in time is
killed. ``retries`` reruns the whole program after a failed attempt.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import sys
import threading
import traceback
import types
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from rayflow.errors import RayflowError

# How long the other ranks may take to stop after one failed, before they are killed.
_STOP_TIMEOUT_S = 10.0
_LOST = "the rank's process was lost"
# How often a rank sends what it printed to the caller while it runs.
_FORWARD_INTERVAL_S = 0.2


class MPIRunError(RayflowError):
    """An MPI program failed on some rank; ``result`` holds every rank's outcome."""

    def __init__(self, message: str, result: MPIRunResult):
        super().__init__(message)
        self.result = result


@dataclass
class RankResult:
    """One rank's outcome.

    Attributes:
        rank: the world rank.
        exit_code: 0 on success; the program's ``sys.exit`` code, ``Abort``'s code, 1 for an
            exception or a lost process; ``None`` when the rank was stopped after another
            rank failed.
        stdout, stderr: what the rank printed.
        error: the traceback (or a description) of the rank's failure, else ``None``.
        value: what a callable target returned on this rank (``None`` for a script).
    """

    rank: int
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    value: Any = None


@dataclass
class MPIRunResult:
    """A run's outcome: ``exit_code`` (the worst rank's), ``ranks`` and ``attempts``."""

    exit_code: int
    ranks: list[RankResult] = field(default_factory=list)
    attempts: int = 1

    @property
    def failed(self) -> list[RankResult]:
        """The ranks that failed (not those stopped because of them)."""
        return [r for r in self.ranks if r.exit_code]


@dataclass(frozen=True)
class _Program:
    """What every rank runs: a script (its path and source) or a picklable callable."""

    path: str | None
    source: str | None
    argv: tuple[str, ...]
    func: Callable[[], Any] | None = None
    futures: bool = False  # python -m mpi4py.futures: ranks 1.. are rank 0's pool


# ------------------------------------------------------------------ in the rank
def _shim() -> dict[str, types.ModuleType]:
    """The modules a rank's ``import mpi4py...`` finds: ``mpi4py``, ``mpi4py.MPI`` (rayflow's
    MPI), ``mpi4py.futures`` (:mod:`rayflow.hpc.futures`), ``mpi4py.util.dtlib`` (numpy
    dtypes of MPI datatypes) and ``mpi4py.util.pkl5``."""
    from rayflow.hpc import MPI, futures

    mod = types.ModuleType("mpi4py", "rayflow's stand-in for mpi4py inside an MPI rank")
    mod.MPI = MPI  # type: ignore[attr-defined]
    mod.futures = futures  # type: ignore[attr-defined]
    mod.__version__ = "3.1.0"  # type: ignore[attr-defined]
    mod.__path__ = []  # a package, so that "import mpi4py.MPI" works
    mod.rc = types.SimpleNamespace(initialize=True, finalize=True, threads=True,  # type: ignore[attr-defined]
                                   thread_level="multiple", recv_mprobe=False)
    util = types.ModuleType("mpi4py.util", "rayflow's stand-in for mpi4py.util")
    util.__path__ = []
    dtlib = types.ModuleType("mpi4py.util.dtlib", "numpy dtypes of MPI datatypes")
    dtlib.to_numpy_dtype = lambda datatype: datatype.dtype  # type: ignore[attr-defined]
    dtlib.from_numpy_dtype = lambda dtype: MPI._datatype_of(np.dtype(dtype))  # type: ignore[attr-defined]
    # pkl5 lifts the 32-bit count of MPI's C calls off pickled messages; rayflow sends a
    # pickle as one transport message, with no such count, so its communicator classes
    # are the communicators themselves
    pkl5 = types.ModuleType("mpi4py.util.pkl5", "pickled messages of any size")
    for name in ("Comm", "Intracomm", "Intercomm"):
        setattr(pkl5, name, type(name, (), {"__new__": lambda cls, comm: comm}))
    pkl5.Request, pkl5.Message, pkl5.Status = MPI.Request, MPI.Message, MPI.Status  # type: ignore[attr-defined]
    mod.util, util.dtlib, util.pkl5 = util, dtlib, pkl5  # type: ignore[attr-defined]
    return {"mpi4py": mod, "mpi4py.MPI": MPI, "mpi4py.futures": futures, "mpi4py.util": util,
            "mpi4py.util.dtlib": dtlib, "mpi4py.util.pkl5": pkl5}


def _run_program(program: _Program) -> Any:
    """Run the program in this rank: a callable's value, or a script as ``__main__`` (a
    module of its own, in ``sys.modules`` while it runs, as ``python prog.py`` makes it:
    ``pickle`` finds the script's functions and classes by name)."""
    if program.func is not None:
        sys.argv = ["<function>", *program.argv]
        return program.func()
    assert program.path is not None and program.source is not None
    sys.argv = [program.path, *program.argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program.path)))
    main = types.ModuleType("__main__")
    main.__file__ = program.path
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__rayflow_source__ = program.source  # type: ignore[attr-defined]  # (for workers)
    sys.modules["__main__"] = main
    exec(compile(program.source, program.path, "exec"), main.__dict__)  # noqa: S102
    return None


def _exit_code(exc: SystemExit, stderr: TextIO | _Forwarder) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=stderr)  # sys.exit("message"), as Python itself does
    return 1


class _Forwarder(io.TextIOBase):
    """A rank's stdout or stderr: kept whole for the result, and sent to the caller's sink
    in whole lines every :data:`_FORWARD_INTERVAL_S` (from a thread, so that a line printed
    before a long computation shows up during it)."""

    def __init__(self, rank: int, stream: str, sink: Any):
        self._rank, self._stream, self._sink = rank, stream, sink
        self._kept = io.StringIO()
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._last_ref: Any = None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._kept.write(text)
            if self._sink is not None:
                self._pending.append(text)
        return len(text)

    def send(self, final: bool = False) -> None:
        with self._lock:
            text = "".join(self._pending)
            cut = len(text) if final else text.rfind("\n") + 1
            if not cut:
                return
            self._pending = [text[cut:]] if text[cut:] else []
            self._last_ref = self._sink.put.remote(self._rank, self._stream, text[:cut])

    def close_and_wait(self) -> None:
        """Send the rest and wait until the sink has it (the caller then drains once more)."""
        if self._sink is None:
            return
        import ray

        self.send(final=True)
        if self._last_ref is not None:
            ray.get(self._last_ref)

    def getvalue(self) -> str:
        return self._kept.getvalue()


def _sink_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class _OutputSink:
        """Collects the ranks' output for the caller, which drains it while the run goes on."""

        def __init__(self) -> None:
            self._chunks: list[tuple[int, str, str]] = []

        def put(self, rank: int, stream: str, text: str) -> None:
            self._chunks.append((rank, stream, text))

        def drain(self) -> list[tuple[int, str, str]]:
            out, self._chunks = self._chunks, []
            return out

    return _OutputSink


def _rank_main(comm: Any, program: _Program, sink: Any = None, label: Any = None) -> dict:
    """Run ``program`` in this rank with ``mpi4py`` bound to ``comm``; never raises. Its
    output lines go to ``sink`` prefixed with ``label`` (default: the rank)."""
    from rayflow.hpc import MPI, spawn
    from rayflow.hpc.backends.channels import StageAborted

    MPI._bind(comm)
    label = comm.rank if label is None else label
    out = _Forwarder(label, "stdout", sink)
    err = _Forwarder(label, "stderr", sink)
    spawn._context.sink = sink  # (ranks this program spawns print there too)
    stop = threading.Event()

    def pump() -> None:
        while not stop.wait(_FORWARD_INTERVAL_S):
            out.send()
            err.send()

    pumper = threading.Thread(target=pump, name="rayflow-mpi-output", daemon=True)
    if sink is not None:
        pumper.start()
    shim = _shim()
    saved_modules = {k: sys.modules.get(k) for k in shim}
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_modules["__main__"] = sys.modules.get("__main__")
    sys.modules.update(shim)
    result: dict[str, Any] = {"rank": comm.rank, "exit_code": 0, "error": None, "value": None}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if program.futures:
                    from rayflow.hpc.futures import run_shared_pool

                    result["value"] = run_shared_pool(MPI.COMM_WORLD,
                                                      lambda: _run_program(program))
                else:
                    result["value"] = _run_program(program)
            except MPI.Aborted as exc:
                result["exit_code"] = exc.errorcode
                result["error"] = f"MPI_Abort called with error code {exc.errorcode}"
            except SystemExit as exc:
                result["exit_code"] = _exit_code(exc, err)
            except StageAborted:
                if spawn._failures:  # woken because a rank it spawned failed
                    result["exit_code"] = 1
                    result["error"] = "; ".join(spawn._failures)
                    err.write(f"rayflow: {result['error']}\n")
                else:
                    result["exit_code"] = None  # stopped because another rank failed
            except BaseException as exc:  # noqa: BLE001 - reported as this rank's failure
                # from the program's frames on: this module's own frames say nothing
                frames = exc.__traceback__
                while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
                    frames = frames.tb_next
                tb = "".join(traceback.format_exception(type(exc), exc, frames))
                err.write(tb)
                result["exit_code"], result["error"] = 1, tb
            finally:
                from rayflow.hpc.futures import _shutdown_all

                _shutdown_all()  # the executors the program left running (mpi4py: at exit)
                # the ranks it spawned and did not disconnect from: waited for, or stopped
                # if the program failed (they may wait for it)
                spawn.end_all(kill=result["exit_code"] != 0)
                spawn._failures.clear()
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        stop.set()
        if pumper.is_alive():
            pumper.join()
        out.close_and_wait()
        err.close_and_wait()
        sys.argv = saved_argv
        sys.path[:] = saved_path
        for k, v in saved_modules.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        MPI._bind(None)
    result["stdout"], result["stderr"] = out.getvalue(), err.getvalue()
    return result


# ------------------------------------------------------------------ in the driver
def _program(target: str | os.PathLike | Callable[[], Any], args: Sequence[str],
             futures: bool = False) -> _Program:
    if callable(target):
        return _Program(None, None, tuple(args), target, futures)
    path = os.fspath(target)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"MPI program {path!r} not found")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    compile(source, path, "exec")  # a syntax error fails here, once, not in every rank
    return _Program(path, source, tuple(str(a) for a in args), None, futures)


def _attempt(g: Any, program: _Program, attempt: int, echo: tuple[TextIO, TextIO] | None
             ) -> list[RankResult]:
    import ray

    from rayflow.hpc.stage import _stop_survivors

    stage = uuid.uuid4().hex[:12]
    sink = _sink_class().remote() if echo is not None else None

    def forward() -> None:
        if sink is not None and echo is not None:
            _echo_chunks(ray.get(sink.drain.remote()), *echo)
    calls = [list(a.run.options(num_returns=2).remote(stage, attempt, 1, _rank_main,
                                                      (program, sink), None))
             for a in g.actors]
    outs: list[RankResult | None] = [None] * g.size
    pending = {c[1]: r for r, c in enumerate(calls)}
    failed = False
    while pending and not failed:
        ready, _ = ray.wait(list(pending), num_returns=1, fetch_local=False,
                            timeout=_FORWARD_INTERVAL_S)
        forward()
        for ref in ready:
            r = pending.pop(ref)
            outs[r] = res = _collect(r, calls[r])
            failed = failed or bool(res.exit_code)
    dead: set[int] = set()
    if failed and pending:
        # as mpiexec: the others are stopped (woken if waiting on a message, else killed)
        dead = _stop_survivors(g, stage, calls, timeout_s=_STOP_TIMEOUT_S)
        for r in pending.values():
            if r in dead:
                outs[r] = RankResult(r, None, error="killed: it did not stop after another "
                                                    "rank failed")
            else:
                outs[r] = _collect(r, calls[r])
    dead |= {r for r, o in enumerate(outs) if o is not None and o.error is not None
             and o.error.startswith(_LOST)}
    if dead:
        if g.backend == "ray":
            g.repair(dead)  # only the lost or stuck ranks are replaced
        else:
            g.shutdown()  # a gloo rank blocked in a receive cannot be woken: a new gang
    forward()
    if sink is not None:
        ray.kill(sink)
    return [o for o in outs if o is not None]


def _collect(rank: int, refs: list) -> RankResult:
    import ray
    from ray.exceptions import RayActorError

    try:
        ray.get(refs[0])
        got = ray.get(refs[1])
    except RayActorError as exc:
        return RankResult(rank, 1, error=f"{_LOST}: {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - e.g. aborted while it waited
        name = type(exc).__name__
        if "StageAborted" in name or "StageAborted" in str(exc):
            return RankResult(rank, None)
        return RankResult(rank, 1, error=f"{name}: {exc}")
    return RankResult(rank, got["exit_code"], got["stdout"], got["stderr"], got["error"],
                      got["value"])


def _echo_chunks(chunks: list[tuple[int, str, str]], stdout: TextIO, stderr: TextIO) -> None:
    for rank, name, text in chunks:
        stream = stdout if name == "stdout" else stderr
        for line in text.splitlines():
            stream.write(f"[{rank}] {line}\n")
    stdout.flush()
    stderr.flush()


def run_mpi(
    target: str | os.PathLike | Callable[[], Any],
    n: int,
    *,
    args: Sequence[str] = (),
    backend: str | None = None,
    retries: int = 0,
    gang: Any = None,
    rank_num_cpus: float | None = None,
    gang_timeout_s: float | None = None,
    echo: bool = True,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    check: bool = True,
    futures: bool = False,
) -> MPIRunResult:
    """Run an mpi4py program on a gang of ``n`` ranks on Ray.

    Args:
        target: a script path (run as ``__main__`` in every rank) or a picklable callable
            taking no arguments (it reads ``MPI.COMM_WORLD`` like a script).
        n: the number of ranks.
        args: the script's arguments (``sys.argv[1:]`` in every rank).
        backend: ``"ray"`` (default) or ``"gloo"``; ``ANY_SOURCE`` needs ``"ray"``.
        retries: how many times to rerun the whole program after a failed attempt.
        gang: a started :class:`~rayflow.hpc.Gang` of ``n`` ranks to run on (kept started);
            by default one is started for the run and shut down after it.
        rank_num_cpus, gang_timeout_s: settings of the gang started for the run.
        echo: write every rank's output, prefixed ``[rank]``, to ``stdout``/``stderr``
            (default: this process's).
        check: raise :class:`MPIRunError` when the last attempt failed.
        futures: run as ``python -m mpi4py.futures`` does: rank 0 runs the program, the
            other ranks are the workers of its ``MPIPoolExecutor`` (needs ``n >= 2``).

    Returns:
        The :class:`MPIRunResult` of the last attempt.

    Raises:
        GangSchedulingError: the gang could not be placed whole.
        MPIRunError: a rank failed (with ``check``); the message names the rank, its exit
            code and its traceback.
    """
    from rayflow.hpc.gang import Gang

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"run_mpi needs a positive number of ranks, got {n!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be a non-negative int, got {retries!r}")
    if futures and n < 2:
        raise ValueError("run_mpi(futures=True) needs at least 2 ranks: rank 0 runs the "
                         "program, the others are its workers")
    program = _program(target, args, futures)
    if gang is not None and gang.size != n:
        raise ValueError(f"the gang has {gang.size} ranks, the run asks for {n}")
    g = gang or Gang(n, backend=backend, rank_num_cpus=rank_num_cpus,
                     gang_timeout_s=gang_timeout_s)
    result = MPIRunResult(0)
    try:
        for attempt in range(retries + 1):
            if not g.started:
                g.start()
            ranks = _attempt(g, program, attempt,
                             (stdout or sys.stdout, stderr or sys.stderr) if echo else None)
            codes = [r.exit_code for r in ranks if r.exit_code]
            result = MPIRunResult(max(codes, default=0), ranks, attempt + 1)
            if not result.exit_code:
                break
    finally:
        if gang is None:
            g.shutdown()
    if check and result.exit_code:
        raise MPIRunError(_failure_message(result, retries), result)
    return result


def _failure_message(result: MPIRunResult, retries: int) -> str:
    first = result.failed[0]
    tries = f" (attempt {result.attempts} of {retries + 1})" if retries else ""
    lines = [f"MPI program failed{tries}: rank {first.rank} exited with code {first.exit_code}"]
    others = [f"rank {r.rank}: {r.exit_code}" for r in result.failed[1:]]
    if others:
        lines[0] += f"; also {', '.join(others)}"
    if first.error:
        lines.append(first.error.rstrip())
    return "\n".join(lines)
