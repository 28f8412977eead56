"""Comm.Spawn and intercommunicators: mpi4py's dynamic-process tutorial and a program of
intercommunicator calls, beside what they gave under MPICH's mpiexec (spawn_calls_mpich_n2/
holds its files); a spawn from a plain script; and what a failing spawned rank does."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

PROGRAMS = Path(__file__).parent / "mpi_programs"


def _run(name, n, *args, check=True):
    from rayflow.hpc import run_mpi

    out, err = io.StringIO(), io.StringIO()
    res = run_mpi(PROGRAMS / name if "/" not in str(name) else name, n,
                  args=[str(a) for a in args], rank_num_cpus=0.25, stdout=out, stderr=err,
                  check=False)
    if check:
        assert res.exit_code == 0, err.getvalue()
    return res, out.getvalue().splitlines(), err.getvalue()


def test_the_tutorials_pi_with_five_spawned_ranks(ray_session):
    """Unmodified: the master spawns `spawn_cpi.py` (a relative path: found beside the
    master), broadcasts N, and reduces the children's parts: MPICH printed the same."""
    _, lines, _ = _run("spawn_master.py", 1)
    assert lines == ["[0] 3.1416009869231245"]


def test_intercommunicator_calls_give_what_mpich_gives(ray_session, tmp_path):
    """Two parents spawn three ranks; both sides' bcast, gather, scatter, reduce, Bcast,
    Reduce, allgather, allreduce, point-to-point (ANY_SOURCE too), Barrier and Merge (both
    orders), each rank's results beside MPICH's."""
    _run("spawn_calls.py", 2, tmp_path)
    _same_as_mpich(tmp_path, "spawn_calls_mpich_n2",
                   ["child0.txt", "child1.txt", "child2.txt", "parent0.txt", "parent1.txt"])


def _same_as_mpich(out, golden_dir: str, names: list[str]) -> None:
    """The files a run wrote to ``out`` are those MPICH's run wrote (``golden_dir``)."""
    golden = PROGRAMS / golden_dir
    assert sorted(p.name for p in golden.iterdir()) == names
    for name in names:
        assert (out / name).read_text() == (golden / name).read_text(), name


def test_create_intercomm_gives_what_mpich_gives(ray_session, tmp_path):
    """The world split into evens and odds, joined by ``Create_intercomm`` (leaders found
    through COMM_WORLD): rooted collectives both ways, Bcast, allgather, allreduce,
    point-to-point (ANY_SOURCE too), Barrier, a second intercommunicator of the same groups
    with a message space of its own, and Merge (either group first; with both passing the
    same ``high``, the group of world rank 0 first, as MPICH orders it), each rank's
    results beside MPICH's."""
    _run("intercomm_create.py", 5, tmp_path)
    _same_as_mpich(tmp_path, "intercomm_create_mpich_n5",
                   ["even0.txt", "even1.txt", "even2.txt", "odd0.txt", "odd1.txt"])


def _overlapping_groups() -> str:
    """{0, 1} and {1, 2} (world rank 1 in both), led by world ranks 0 and 2."""
    from rayflow.hpc import MPI

    world = MPI.COMM_WORLD
    if world.Get_rank() == 1:
        return "not called"
    mine = world.Create_group(world.Get_group().Incl([0, 1] if world.Get_rank() == 0
                                                     else [1, 2]))
    try:
        mine.Create_intercomm(mine.Get_rank(), world, 2 - world.Get_rank(), tag=1)
    except ValueError as exc:
        return str(exc)
    return "no error"


def _no_peer_comm() -> str:
    """Evens and odds, both groups' leaders given no peer communicator."""
    from rayflow.hpc import MPI

    world = MPI.COMM_WORLD
    half = world.Split(world.Get_rank() % 2, world.Get_rank())
    try:
        half.Create_intercomm(0, None, 1 - world.Get_rank() % 2)
    except TypeError as exc:
        return str(exc)
    return "no error"


def test_what_create_intercomm_refuses(ray_session):
    """Groups that share a process: the leaders find it, naming the shared world ranks.
    A peer communicator that is none: the leaders' error is raised on every rank of their
    groups (none waits for the others)."""
    from rayflow.hpc import run_mpi

    got = [r.value for r in run_mpi(_overlapping_groups, 3, rank_num_cpus=0.25).ranks]
    shared = "Create_intercomm: the two groups share processes (world ranks [1])"
    assert got == [shared, "not called", shared]
    got = [r.value for r in run_mpi(_no_peer_comm, 4, rank_num_cpus=0.25).ranks]
    assert got == ["Create_intercomm: peer_comm must be an MPI.Comm, got None"] * 4


def test_a_spawned_rank_that_fails_fails_the_run(ray_session, tmp_path):
    """A child raises while its parent waits in Reduce for its part: the parent is woken,
    and the run fails naming the child, with the child's traceback."""
    (tmp_path / "child.py").write_text(
        "from mpi4py import MPI\nimport numpy\n"
        "comm = MPI.Comm.Get_parent()\n"
        "if comm.Get_rank() == 1:\n    raise ValueError('child 1 fails')\n"
        "comm.Reduce(numpy.ones(1), None, op=MPI.SUM, root=0)\n")
    (tmp_path / "master.py").write_text(
        "import sys\nfrom mpi4py import MPI\nimport numpy\n"
        "comm = MPI.COMM_SELF.Spawn(sys.executable, args=['child.py'], maxprocs=2)\n"
        "x = numpy.zeros(1)\n"
        "comm.Reduce(None, x, op=MPI.SUM, root=MPI.ROOT)\n"
        "print('never')\n")
    res, lines, err = _run(tmp_path / "master.py", 1, check=False)
    assert res.exit_code == 1 and "never" not in "\n".join(lines)
    assert "spawned rank 1 exited with code 1" in res.ranks[0].error
    assert "[spawned 1] ValueError: child 1 fails" in err


def test_spawn_from_a_plain_process(ray_session, tmp_path):
    """Outside a rank (this test's process: a world of one), COMM_SELF.Spawn starts the
    children all the same; what they print comes out when they end."""
    from rayflow.hpc import MPI

    child = tmp_path / "child.py"
    child.write_text(
        "from mpi4py import MPI\nimport numpy\n"
        "comm = MPI.Comm.Get_parent()\n"
        "x = numpy.full(3, comm.Get_rank() + 1.0)\n"
        "comm.Reduce(x, None, op=MPI.SUM, root=0)\n"
        "print('child', comm.Get_rank(), 'of', MPI.COMM_WORLD.Get_size())\n"
        "comm.Disconnect()\n")
    inter = MPI.COMM_SELF.Spawn("python3", args=[str(child)], maxprocs=3)
    assert (inter.Get_size(), inter.Get_remote_size(), inter.Is_inter()) == (1, 3, True)
    total = np.zeros(3)
    inter.Reduce(None, total, op=MPI.SUM, root=MPI.ROOT)
    assert total.tolist() == [6.0, 6.0, 6.0]
    inter.Disconnect()
    with pytest.raises(MPI.Exception, match="freed"):
        inter.Get_remote_size()


def test_what_spawn_refuses(ray_session, tmp_path):
    from rayflow.hpc import MPI

    with pytest.raises(NotImplementedError, match="spawns Python scripts"):
        MPI.COMM_SELF.Spawn("/bin/hostname", maxprocs=1)
    with pytest.raises(FileNotFoundError, match="no_such.py"):
        MPI.COMM_SELF.Spawn("python", args=[str(tmp_path / "no_such.py")])
    with pytest.raises(ValueError, match="maxprocs"):
        MPI.COMM_SELF.Spawn("python", args=["x.py"], maxprocs=0)
    assert MPI.Comm.Get_parent() == MPI.COMM_NULL
