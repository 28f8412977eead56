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
    from rayflow.hpc.comm import Communicator

    ctx = ("inter", group)
    base = Communicator(transport, [*remote, transport.rank], ctx)
    joint = Communicator(transport, None, (ctx, "joint"))
    return MPI.Intercomm(base, local_rank, local_size, joint, low_first)


def spawn(comm: Any, command: str, args: Any, maxprocs: int, root: int,
          errcodes: list | None) -> Any:
    """``comm.Spawn(...)``: collective over ``comm``; see the module doc."""
    import ray

    from rayflow.hpc.backends.channels import Mailbox
    from rayflow.hpc.backends.ray_backend import create_rendezvous, join_group
    from rayflow.hpc.gang import Gang, spawned_rank_cpus
    from rayflow.hpc.mpirun import _program

    if isinstance(maxprocs, bool) or not isinstance(maxprocs, int) or maxprocs < 1:
        raise ValueError(f"Spawn: maxprocs must be a positive int, got {maxprocs!r}")
    parents, me = comm.Get_size(), comm.Get_rank()
    started: dict[str, Any] = {}
    if me == root:
        try:
            path, argv = _script(command, args)
            program = _program(path, argv)
            gang = Gang(maxprocs, rank_num_cpus=spawned_rank_cpus(maxprocs)).start()
            group = f"rf-spawn-{uuid.uuid4().hex[:10]}"
            rdv = create_rendezvous(group, parents + maxprocs)
            sink = getattr(_context, "sink", None)
            runs = [a.run.options(num_returns=2).remote(
                group, 0, 1, _child, (group, parents + maxprocs, parents + i, parents,
                                      program, sink), None)[1]
                for i, a in enumerate(gang.actors)]
            started = {"gang": gang, "rdv": rdv, "runs": runs, "echo": sink is None}
            verdict: tuple = (group, None)
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
        if started:
            ray.wait(started["runs"], num_returns=len(started["runs"]))
            _end(started)
        transport.close()

    inter._closers.append(close)
    if started:
        _open.append(started)
        threading.Thread(target=_watch, args=(started, box, transport.stage), daemon=True,
                         name="rayflow-spawn-watch").start()
    if errcodes is not None:
        errcodes[:] = [0] * maxprocs
    return inter


def _watch(started: dict, box: Any, stage: str) -> None:
    """At the spawning root: a spawned rank that fails before the parents disconnected
    wakes the root from any wait on a message (it then fails, naming the rank), instead of
    leaving it waiting for a message that will not come."""
    import ray

    pending = list(started["runs"])
    while pending and started in _open:
        ended, pending = ray.wait(pending, num_returns=1, timeout=0.5)
        for ref in ended:
            i = started["runs"].index(ref)
            try:
                code = ray.get(ref)["exit_code"]
                why = f"spawned rank {i} exited with code {code}" if code else None
            except Exception as exc:  # noqa: BLE001 - a lost child process
                why = f"spawned rank {i} was lost: {type(exc).__name__}"
            if why and started in _open:
                _failures.append(why)
                box.abort(stage)
                return


def _end(started: dict) -> None:
    """Stop a spawned gang (its runs ended) and report a child that failed."""
    import ray

    if started in _open:
        _open.remove(started)
    failed = []
    for i, ref in enumerate(started["runs"]):
        try:
            res = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - a lost child process
            failed.append(f"spawned rank {i} was lost: {type(exc).__name__}")
            continue
        if started["echo"]:  # no sink took its output as it ran: it goes out now
            for text, stream in ((res["stdout"], sys.stdout), (res["stderr"], sys.stderr)):
                for line in text.splitlines():
                    print(f"[spawned {i}] {line}", file=stream)
        why = f"spawned rank {i} exited with code {res['exit_code']}"
        if res["exit_code"] and why not in _failures:  # (else the parent said it already)
            failed.append(why)
    started["gang"].shutdown()
    ray.kill(started["rdv"], no_restart=True)
    if failed:
        print("rayflow: " + "; ".join(failed), file=sys.stderr)


def end_all(kill: bool = False) -> None:
    """At the end of a program: wait for the children it spawned and never disconnected
    from (``mpiexec`` waits for spawned processes too), then stop their gangs; with
    ``kill`` (the program failed, and they may wait for it) stop them at once."""
    import ray

    for started in list(_open):
        if kill:
            _open.remove(started)
            started["gang"].shutdown()
            ray.kill(started["rdv"], no_restart=True)
            continue
        ray.wait(started["runs"], num_returns=len(started["runs"]))
        _end(started)


__all__ = ["end_all", "spawn"]
