"""mpi4py.futures on rayflow ranks: the executors' results beside those the same programs
wrote under MPICH's mpiexec with mpi4py (their files are checked in: futures_*_mpich_*/),
and what an executor does with failures, cancellations and options."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).parent / "mpi_programs"


@pytest.fixture(scope="module")
def gang(ray_session):
    from rayflow.hpc import Gang

    g = Gang(3, rank_num_cpus=0.25, gang_timeout_s=60).start()
    yield g
    g.shutdown()


def _run(gang, name, *args, futures=False, n=None):
    from rayflow.hpc import run_mpi

    out, err = io.StringIO(), io.StringIO()
    res = run_mpi(PROGRAMS / name, n or gang.size, args=[str(a) for a in args],
                  gang=gang if n is None else None, stdout=out, stderr=err, futures=futures,
                  rank_num_cpus=None if n is None else 0.25)
    assert res.exit_code == 0, err.getvalue()
    return out.getvalue().splitlines()


def test_shared_pool_gives_what_mpich_gives(gang, tmp_path):
    """`python -m mpi4py.futures`: rank 0 runs the program, ranks 1 and 2 are the pool of
    its two executors (one after the other, the second with an initializer)."""
    assert _run(gang, "futures_pool.py", tmp_path, futures=True) == []
    want = (PROGRAMS / "futures_pool_mpich_n3" / "results.txt").read_text()
    assert (tmp_path / "results.txt").read_text() == want


def test_comm_executor_gives_what_mpich_gives(gang, tmp_path):
    """MPICommExecutor: rank 0 (then rank 2) gets the executor, the others serve it and
    get None; a collective between the two executors still matches."""
    assert _run(gang, "futures_comm.py", tmp_path) == []
    for r in range(3):
        want = (PROGRAMS / "futures_comm_mpich_n3" / f"rank{r}.txt").read_text()
        assert (tmp_path / f"rank{r}.txt").read_text() == want


def test_spawned_workers_give_what_mpich_gives(ray_session, tmp_path):
    """One rank whose executors spawn two workers each (a gang of new Ray ranks; MPICH
    spawns processes): their COMM_WORLD is their own, of two."""
    assert _run(None, "futures_pool.py", tmp_path, 2, n=1) == []
    want = (PROGRAMS / "futures_pool_mpich_n1_spawn2" / "results.txt").read_text()
    assert (tmp_path / "results.txt").read_text() == want


def test_on_gloo_the_executor_says_it_cannot_receive(ray_session, tmp_path):
    """gloo cannot look for a message from any rank: the executor is broken at once, with
    the reason, and the run fails (it does not hang)."""
    pytest.importorskip("torch")
    from rayflow.hpc import Gang, run_mpi

    with Gang(3, backend="gloo", rank_num_cpus=0.25, gang_timeout_s=60) as g:
        out, err = io.StringIO(), io.StringIO()
        res = run_mpi(PROGRAMS / "futures_comm.py", 3, args=[str(tmp_path)], gang=g,
                      stdout=out, stderr=err, check=False)
    assert res.exit_code == 1
    assert "BrokenExecutor: the pool cannot receive its workers' replies" in err.getvalue()
    assert "ANY_SOURCE" in err.getvalue()


def test_shared_pool_needs_two_ranks(ray_session):
    from rayflow.hpc import run_mpi

    with pytest.raises(ValueError, match="at least 2 ranks"):
        run_mpi(PROGRAMS / "futures_pool.py", 1, futures=True)


# ------------------------------------------------------------------ from the driver
@pytest.fixture(scope="module")
def pool(ray_session):
    """Two workers spawned from the test process (this process's main is pytest's: the
    workers import it as __worker__, which runs nothing)."""
    from rayflow.hpc.futures import MPIPoolExecutor

    ex = MPIPoolExecutor(max_workers=2, rank_num_cpus=0.25).bootup()
    yield ex
    ex.shutdown()


def test_calls_and_their_exceptions(pool):
    import operator

    assert pool.num_workers == 2
    assert list(pool.map(operator.add, range(50), range(50), chunksize=7)) == [
        2 * i for i in range(50)]
    assert pool.submit(lambda a, b=1: a * b, 6, b=7).result() == 42  # (cloudpickle)
    assert sorted(pool.map(lambda x: -x, range(9), unordered=True)) == list(range(-8, 1))

    def fails(x):
        return {}[x]

    f = pool.submit(fails, "missing")
    with pytest.raises(KeyError, match="missing") as info:
        f.result(timeout=60)
    # the worker's traceback, as ProcessPoolExecutor gives it
    assert "in fails" in str(info.value.__cause__)
    lines = list(pool.map(len, ["ab", "abc"]))  # the pool goes on after a failure
    assert lines == [2, 3]


def test_an_exception_that_does_not_pickle(pool):
    def raise_unpicklable():
        import threading

        exc = ValueError("holds a lock")
        exc.lock = threading.Lock()  # (a lock does not pickle)
        raise exc

    with pytest.raises(RuntimeError, match="ValueError: holds a lock"):
        pool.submit(raise_unpicklable).result(timeout=60)


def test_map_timeout_and_cancel(ray_session):
    import concurrent.futures as cf
    import time

    from rayflow.hpc.futures import MPIPoolExecutor

    with MPIPoolExecutor(1, rank_num_cpus=0.25) as ex:
        ex.bootup()
        it = ex.map(time.sleep, [0.5, 0.5, 0.5], timeout=0.2)
        with pytest.raises(cf.TimeoutError):
            next(it)
        assert ex.submit(abs, -3).result(timeout=60) == 3  # the map's calls were cancelled
        first = ex.submit(time.sleep, 0.5)
        deadline = time.monotonic() + 30
        while not first.running() and time.monotonic() < deadline:
            time.sleep(0.01)
        queued = [ex.submit(abs, -i) for i in range(5)]
        ex.shutdown(wait=True, cancel_futures=True)
        assert first.result() is None  # running: not cancelled
        assert all(f.cancelled() or f.result() == i for i, f in enumerate(queued))
        assert any(f.cancelled() for f in queued)
        with pytest.raises(RuntimeError, match="after shutdown"):
            ex.submit(abs, 1)
        assert ex.num_workers == 0


def test_a_failing_initializer_breaks_the_pool(ray_session):
    from rayflow.hpc.futures import BrokenExecutor, MPIPoolExecutor

    def init(wait_s):
        import time

        time.sleep(wait_s)
        raise OSError("no data here")

    # a call queued while the initializer runs (it takes 1 s): its future breaks
    with MPIPoolExecutor(1, initializer=init, initargs=(1.0,), rank_num_cpus=0.25) as ex:
        f = ex.submit(abs, -1)
        with pytest.raises(BrokenExecutor, match="initializer failed: OSError"):
            f.result(timeout=60)
        with pytest.raises(BrokenExecutor):
            ex.submit(abs, -1)
    # a call after the initializers replied (bootup waits for them): submit raises
    with MPIPoolExecutor(1, initializer=init, initargs=(0.0,), rank_num_cpus=0.25) as ex:
        assert ex.bootup() is ex and ex.num_workers == 0
        with pytest.raises(BrokenExecutor, match="no data here"):
            ex.submit(abs, -1)


def test_a_worker_that_dies_breaks_the_pool(ray_session):
    """A spawned worker's process exits in a task: its future and the pool break, with
    the reason, instead of waiting for a reply that will never come."""
    from rayflow.hpc.futures import BrokenExecutor, MPIPoolExecutor

    def die():
        import os

        os._exit(3)

    with MPIPoolExecutor(2, rank_num_cpus=0.25) as ex:
        assert ex.submit(abs, -5).result(timeout=60) == 5
        f = ex.submit(die)
        with pytest.raises(BrokenExecutor, match="spawned worker's run ended"):
            f.result(timeout=60)
        with pytest.raises(BrokenExecutor):
            ex.submit(abs, 1)


def test_options_it_does_not_know_are_errors():
    from rayflow.hpc.futures import MPIPoolExecutor

    with pytest.raises(ValueError, match=r"options \['python_exe', 'wdir'\] are not supported"):
        MPIPoolExecutor(2, python_exe="python3", wdir="/tmp")
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        MPIPoolExecutor(0)
    with pytest.raises(TypeError, match="initializer must be a callable"):
        MPIPoolExecutor(1, initializer=3)
    ex = MPIPoolExecutor(1)
    with pytest.raises(ValueError, match="chunksize"):
        ex.map(abs, [1], chunksize=0)
    with pytest.raises(ValueError, match="buffersize must be None if unordered"):
        ex.map(abs, [1], buffersize=2, unordered=True)
    ex.shutdown()  # (never started: nothing to stop)


def test_an_executor_in_a_ray_task_imports_no_main(ray_session):
    """In a Ray task (outside rayflow mpirun) the process's main is Ray's worker entry
    point: the workers import nothing for it, and the calls run."""
    import ray

    @ray.remote(num_cpus=0)
    def farm():
        from rayflow.hpc.futures import MPIPoolExecutor, _main_spec

        with MPIPoolExecutor(1, rank_num_cpus=0.25) as ex:
            return _main_spec(), list(ex.map(abs, [-1, -2]))

    assert ray.get(farm.remote(), timeout=120) == (None, [1, 2])


def test_get_comm_workers_outside_a_worker_is_comm_null():
    from rayflow.hpc import MPI
    from rayflow.hpc.futures import get_comm_workers

    assert get_comm_workers() is MPI.COMM_NULL


@pytest.mark.slow
def test_rayflow_mpirun_with_python_m_mpi4py_futures(tmp_path):
    """The command line as mpiexec's: `rayflow mpirun -n 3 -- python -m mpi4py.futures`."""
    env = dict(os.environ, RAYFLOW_RAY__INCLUDE_DASHBOARD="false")
    base = [sys.executable, "-m", "rayflow", "mpirun", "-n", "3", "--rank-cpus", "0.25", "--",
            "python", "-m"]
    run = subprocess.run([*base, "mpi4py.futures", str(PROGRAMS / "futures_pool.py"),
                          str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    want = (PROGRAMS / "futures_pool_mpich_n3" / "results.txt").read_text()
    assert (tmp_path / "results.txt").read_text() == want
    other = subprocess.run([*base, "json.tool", "x.json"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert other.returncode == 2 and "only `-m mpi4py` and `-m mpi4py.futures`" in other.stderr
    # python -m mpi4py prog.py: mpi4py's runner, the program as it is
    comm_dir = tmp_path / "comm"
    comm_dir.mkdir()
    runner = subprocess.run([*base, "mpi4py", str(PROGRAMS / "futures_comm.py"),
                             str(comm_dir)], capture_output=True, text=True, env=env,
                            timeout=600)
    assert runner.returncode == 0, runner.stderr
    for r in range(3):
        want = (PROGRAMS / "futures_comm_mpich_n3" / f"rank{r}.txt").read_text()
        assert (comm_dir / f"rank{r}.txt").read_text() == want


@pytest.mark.slow
def test_an_executor_left_running_is_shut_down_at_exit(tmp_path):
    """A script that never shuts its executor down: its workers stop at exit, before Ray
    shuts down, and the script exits cleanly (mpi4py shuts its executors down at exit)."""
    script = tmp_path / "left.py"
    script.write_text(
        "from rayflow.hpc.futures import MPIPoolExecutor\n\n"
        "def sq(x):\n    return x * x\n\n"
        "if __name__ == '__main__':\n"
        "    ex = MPIPoolExecutor(2, rank_num_cpus=0.25)\n"
        "    print(sum(ex.map(sq, range(10))))\n")
    env = dict(os.environ, RAYFLOW_RAY__INCLUDE_DASHBOARD="false")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "285"
    assert "Traceback" not in run.stderr
