"""``Comm.Spawn``: new ranks started from a running MPI program, as a gang of new Ray rank
actors, joined to their parents by an intercommunicator.

The root of the spawning communicator starts a :class:`~rayflow.hpc.Gang` of ``maxprocs``
ranks and, on each, one long run of the child script (its ``COMM_WORLD`` the children's own,
``Comm.Get_parent()`` the intercommunicator). Parents and children then meet in a group of
their own (parents first, then children), with direct channels between every pair, as a
gang's ranks have: a message between a parent and a child is a message on a channel, not a
Ray call. The children's output goes where their parents' goes (``rayflow mpirun`` prefixes
it ``[spawned i]``). ``Disconnect`` (or the end of the parents' program) waits for the
children to end, then stops their gang.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from typing import Any

_open: list[Any] = []  # the spawned gangs not yet disconnected, in this process
_failures: list[str] = []  # spawned ranks that failed before their parents disconnected
_context = threading.local()  # the output sink of the program running in this rank


class Children:
    """A gang of ``n`` new Ray rank actors, each in one long run of ``fn(world, group,
    parents + n, parents + i, *args)`` (``world`` the gang's own communicator), and the
    rendezvous of the group that they and ``parents`` other processes (its ranks 0 to
    ``parents - 1``, by :func:`~rayflow.hpc.backends.ray_backend.join_group`) meet in.
    Spawned by a rank, each asks for that rank's CPUs (see
    :func:`~rayflow.hpc.gang.spawned_rank_cpus`) unless ``rank_num_cpus`` says."""

    def __init__(self, n: int, parents: int, fn: Any, args: tuple = (),
                 rank_num_cpus: float | None = None, **gang_options: Any):
        import ray

        from rayflow.hpc.backends.ray_backend import create_rendezvous
        from rayflow.hpc.gang import Gang, spawned_rank_cpus

        cpus = rank_num_cpus if rank_num_cpus is not None else spawned_rank_cpus(n)
        self.gang = Gang(n, rank_num_cpus=cpus, **gang_options).start()
        self.group = f"rf-spawn-{uuid.uuid4().hex[:10]}"
        self.size = parents + n
        self._rdv = create_rendezvous(self.group, self.size)
        self.runs = [actor.run.options(num_returns=2).remote(
            self.group, 0, 1, fn, (self.group, self.size, parents + i, *args), None)[1]
            for i, actor in enumerate(self.gang.actors)]
        self.done = threading.Event()  # set once the parents are done with them
        self.failure: str | None = None
        self.echo = False  # print their output when they end (no sink took it)
        self._ray = ray

    def watch(self, box: Any, stage: str, failed: Any) -> None:
        """In a thread: when a run ends while the parents still need it and
        ``failed(i, outcome)`` (the run's value, or the exception that ended it) gives a
        reason, abort ``stage`` of ``box`` (a parent's receive then raises) and keep the
        reason in :attr:`failure`."""

        def loop() -> None:
            pending = list(self.runs)
            while pending and not self.done.is_set():
                ended, pending = self._ray.wait(pending, num_returns=1, timeout=0.5)
                for ref in ended:
                    try:
                        outcome: Any = self._ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - a lost process
                        outcome = exc
                    why = failed(self.runs.index(ref), outcome)
                    if why and not self.done.is_set():
                        self.failure = why
                        box.abort(stage)
                        return

        threading.Thread(target=loop, daemon=True, name="rayflow-spawn-watch").start()

    def wait(self, timeout: float | None = None) -> None:
        """Until every run ended (or ``timeout`` s)."""
        if self._ray.is_initialized():
            self._ray.wait(self.runs, num_returns=len(self.runs), timeout=timeout)

    def stop(self) -> None:
        """Kill the gang and the rendezvous (nothing to do once Ray is gone)."""
        self.done.set()
        if self._ray.is_initialized():
            self.gang.shutdown()
            self._ray.kill(self._rdv, no_restart=True)


def _script(command: str, args: Any) -> tuple[str, list[str]]:
    """The script to run and its arguments, from ``Spawn``'s command and args: the command
    must be a Python interpreter and the first argument a script (relative paths from the
    current directory, else from the spawning script's)."""
    args = [str(a) for a in (args or [])]
    name = os.path.basename(str(command))
    if not name.startswith("python") or not args or args[0].startswith("-"):
        raise NotImplementedError(
            f"Spawn({command!r}, args={args!r}): rayflow's MPI spawns Python scripts: "
            f"Spawn(sys.executable, args=['prog.py', ...])")
    path = args[0]
    if not os.path.isabs(path) and not os.path.isfile(path):
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        if main:
            candidate = os.path.join(os.path.dirname(os.path.abspath(main)), path)
            if os.path.isfile(candidate):
                path = candidate
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Spawn: script {args[0]!r} not found")
    return path, args[1:]


def _child(world: Any, group: str, size: int, joint_rank: int, parents: int,
           program: Any, sink: Any) -> dict:
    """A spawned rank's one run: join the parents' group, then run the script."""
    from rayflow.hpc import MPI
    from rayflow.hpc.backends.ray_backend import join_group
    from rayflow.hpc.mpirun import _rank_main

    transport = join_group(size, joint_rank, group)
    try:
        MPI._parent[0] = _intercomm(transport, group, list(range(parents)), world.rank,
                                    world.size, low_first=False)
        return _rank_main(world, program, sink, label=f"spawned {world.rank}")
    finally:
        MPI._parent[0] = None
        transport.close()


def _intercomm(transport: Any, group: str, remote: list[int], local_rank: int,
               local_size: int, low_first: bool) -> Any:
    from rayflow.hpc import MPI

    return MPI.Intercomm.between(transport, remote, local_rank, local_size, ("inter", group),
                                 low_first=low_first)


def spawn(comm: Any, command: str, args: Any, maxprocs: int, root: int,
          errcodes: list | None) -> Any:
    """``comm.Spawn(...)``: collective over ``comm``; see the module doc."""
    from rayflow.hpc.backends.channels import Mailbox
    from rayflow.hpc.backends.ray_backend import join_group
    from rayflow.hpc.mpirun import _program

    if isinstance(maxprocs, bool) or not isinstance(maxprocs, int) or maxprocs < 1:
        raise ValueError(f"Spawn: maxprocs must be a positive int, got {maxprocs!r}")
    parents, me = comm.Get_size(), comm.Get_rank()
    children: Children | None = None
    if me == root:
        try:
            path, argv = _script(command, args)
            sink = getattr(_context, "sink", None)
            children = Children(maxprocs, parents, _child,
                                (parents, _program(path, argv), sink))
            children.echo = sink is None
            _open.append(children)  # (stopped at the program's end if a join fails)
            verdict: tuple = (children.group, None)
        except Exception as exc:  # noqa: BLE001 - raised on every parent below
            verdict = (None, exc)
        verdict = comm.bcast(verdict, root)
    else:
        verdict = comm.bcast(None, root)
    group, error = verdict
    if error is not None:
        raise error
    box = Mailbox()
    transport = join_group(parents + maxprocs, me, group, mailbox=box)
    inter = _intercomm(transport, group, list(range(parents, parents + maxprocs)), me,
                       parents, low_first=True)

    def close() -> None:
        if children is not None:
            children.wait()
            _end(children)
        transport.close()

    inter._closers.append(close)
    if children is not None:
        children.watch(box, transport.stage, _failed)
    if errcodes is not None:
        errcodes[:] = [0] * maxprocs
    return inter


def _why(i: int, outcome: Any) -> str | None:
    """Why spawned rank ``i``'s run (its result, or what ended it) failed; None if not."""
    if isinstance(outcome, BaseException):
        return f"spawned rank {i} was lost: {type(outcome).__name__}"
    if outcome["exit_code"]:
        return f"spawned rank {i} exited with code {outcome['exit_code']}"
    return None


def _failed(i: int, outcome: Any) -> str | None:
    """:func:`_why`, kept for the program's failure (a parent was waiting)."""
    why = _why(i, outcome)
    if why:
        _failures.append(why)
    return why


def _end(children: Children) -> None:
    """Stop a spawned gang (its runs ended); print what the children printed where no
    sink took it as they ran, and name a child that failed (unless a parent did)."""
    import ray

    if children in _open:
        _open.remove(children)
    failed = []
    for i, ref in enumerate(children.runs):
        try:
            res: Any = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - a lost child process
            res = exc
        if children.echo and isinstance(res, dict):
            for text, stream in ((res["stdout"], sys.stdout), (res["stderr"], sys.stderr)):
                for line in text.splitlines():
                    print(f"[spawned {i}] {line}", file=stream)
        why = _why(i, res)
        if why and why not in _failures:  # (else the parent said it already)
            failed.append(why)
    children.stop()
    if failed:
        print("rayflow: " + "; ".join(failed), file=sys.stderr)


def end_all(kill: bool = False) -> None:
    """At the end of a program: wait for the children it spawned and never disconnected
    from (``mpiexec`` waits for spawned processes too), then stop their gangs; with
    ``kill`` (the program failed, and they may wait for it) stop them at once."""
    for children in list(_open):
        if kill:
            _open.remove(children)
            children.stop()
            continue
        children.wait()
        _end(children)


__all__ = ["Children", "end_all", "spawn"]
