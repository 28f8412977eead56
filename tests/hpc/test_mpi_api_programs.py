"""Unmodified mpi4py programs (compute pi, a ring, a matvec with Allgather, uneven rows with
Scatterv/Gatherv and a manager that sizes results with Probe, the one-sided and MPI-IO
tutorials, and the calls whose results MPICH gave) run by ``run_mpi`` on a shared gang (each backend) and by ``rayflow mpirun`` in a
subprocess; outputs against numpy, or against MPICH's."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

PROGRAMS = Path(__file__).parent / "mpi_programs"


def cpi_reference(n: int) -> float:
    h = 1.0 / n
    return h * sum(4.0 / (1.0 + (h * (i + 0.5)) ** 2) for i in range(n))


def matvec_reference(n_local: int, size: int) -> np.ndarray:
    n = n_local * size
    a = np.random.default_rng(7).standard_normal((n, n))
    x = np.random.default_rng(8).standard_normal(n)
    return a @ x


@pytest.fixture(scope="module", params=["ray", "gloo"])
def gang(ray_session, request):
    from rayflow.hpc import Gang

    if request.param == "gloo":
        pytest.importorskip("torch")
    g = Gang(3, backend=request.param, rank_num_cpus=0.5, gang_timeout_s=60).start()
    yield g
    g.shutdown()


def _run(gang, name, *args):
    from rayflow.hpc import run_mpi

    out, err = io.StringIO(), io.StringIO()
    res = run_mpi(PROGRAMS / name, gang.size, args=list(args), gang=gang, stdout=out, stderr=err)
    assert res.exit_code == 0, err.getvalue()
    return out.getvalue().splitlines()


def test_compute_pi(gang):
    lines = _run(gang, "cpi.py", "1000")
    assert len(lines) == 1 and lines[0].startswith("[0] pi ")
    pi = float(lines[0].split()[-1])
    # summed per rank then reduced: the order differs from the serial sum, by a few ulps
    assert pi == pytest.approx(cpi_reference(1000), rel=1e-14)
    assert abs(pi - math.pi) < 1e-6


def test_ring(gang):
    lines = _run(gang, "ring.py")
    assert "[0] token 103" in lines  # 100 + 1 + 2
    for r in range(3):
        assert f"[{r}] got from {(r - 1) % 3}" in lines
    # each rank's lines in the order printed (the ranks' lines interleave as they come)
    assert [ln for ln in lines if ln.startswith("[0]")] == ["[0] token 103", "[0] got from 2"]


def test_matvec_with_allgather(gang, tmp_path):
    out = tmp_path / "y.npy"
    assert _run(gang, "matvec.py", "5", str(out)) == ["[0] saved"]
    np.testing.assert_allclose(np.load(out), matvec_reference(5, 3), rtol=1e-12)


def test_calls_give_what_mpich_gives(gang, tmp_path):
    """Vector, prefix, non-blocking and group calls and probes, each rank's results beside
    those the same program wrote under MPICH's mpiexec (its files, calls_mpich_n3/): the
    same lines, to the bit (a -0.0 from a product stays -0.0)."""
    nopoll = gang.backend == "gloo"  # (no iprobe, no probe from ANY_SOURCE)
    assert _run(gang, "calls.py", str(tmp_path), *(["nopoll"] if nopoll else [])) == []
    for r in range(3):
        want = (PROGRAMS / "calls_mpich_n3" / f"rank{r}.txt").read_text().splitlines()
        if nopoll:
            want = [ln for ln in want if not ln.startswith("iprobe_none")]
        assert (tmp_path / f"rank{r}.txt").read_text().splitlines() == want


def test_one_sided_calls_give_what_mpich_gives(gang, tmp_path):
    """Windows made by Create, Allocate and Allocate_shared; fences, post-start-complete-wait
    and locks; puts, gets, accumulates, fetch-and-op and compare-and-swap: each rank's
    results beside those the same program wrote under MPICH's mpiexec (rma_mpich_n3/)."""
    assert _run(gang, "rma.py", str(tmp_path)) == []
    for r in range(3):
        want = (PROGRAMS / "rma_mpich_n3" / f"rank{r}.txt").read_text().splitlines()
        assert (tmp_path / f"rank{r}.txt").read_text().splitlines() == want


def test_a_program_on_mpi4pys_pkl5_runs_unmodified(gang):
    assert _run(gang, "big_pickles.py") == ["[0] pkl5 ok 3"]


@pytest.mark.parametrize("program", ["rma_window.py", "rma_target.py"])
def test_mpi4pys_one_sided_tutorial_runs_unmodified(gang, program):
    """The tutorial's two RMA programs (their asserts check what the gets read): rank 0
    owns the window and leaves its program while the others still lock and read it, which
    the server thread of its process serves."""
    assert _run(gang, program) == []


def test_topologies_give_what_mpich_gives(gang, tmp_path):
    """Graphs, distributed graphs (repeated and self edges, weights) and their neighbor
    collectives: each rank's results beside MPICH's (topo_mpich_n3/)."""
    assert _run(gang, "topo.py", str(tmp_path)) == []
    for r in range(3):
        want = (PROGRAMS / "topo_mpich_n3" / f"rank{r}.txt").read_text().splitlines()
        assert (tmp_path / f"rank{r}.txt").read_text().splitlines() == want


def test_mpi_io_calls_give_what_mpich_gives(gang, tmp_path):
    """Opening modes and their errors, explicit offsets, the file pointer, vector and
    subarray views, sizes and the other forms: each rank's results (what it read back
    included) beside those the same program wrote under MPICH (io_mpich_n3/)."""
    assert _run(gang, "io.py", str(tmp_path)) == []
    for r in range(3):
        want = (PROGRAMS / "io_mpich_n3" / f"rank{r}.txt").read_text().splitlines()
        assert (tmp_path / f"rank{r}.txt").read_text().splitlines() == want


def test_mpi4pys_io_tutorial_writes_mpichs_files(gang, tmp_path):
    """The tutorial's collective I/O programs, contiguous and through a vector view: the
    files they write are MPICH's, byte for byte."""
    for program in ("io_contig.py", "io_noncontig.py"):
        assert _run(gang, program, str(tmp_path)) == []
    for name in ("datafile.contig", "datafile.noncontig"):
        want = (PROGRAMS / "io_tutorial_mpich_n3" / name).read_bytes()
        assert (tmp_path / name).read_bytes() == want


def rows_reference(n: int, size: int) -> list[str]:
    sums = np.arange(n * 4, dtype="d").reshape(n, 4).sum(axis=1)
    tasks = range(1, 2 * size) if size > 1 else ()
    return ["[0] row sums " + " ".join(f"{s:g}" for s in sums),
            "[0] tasks " + " ".join(f"{t}:{t * (t + 1) // 2}" for t in tasks)]


def test_uneven_rows_with_scatterv_gatherv_and_a_probing_manager(gang):
    if gang.backend == "gloo":  # its manager probes ANY_SOURCE, which gloo cannot
        from rayflow.hpc import MPIRunError

        with pytest.raises(MPIRunError, match="ANY_SOURCE, Request.Test and iprobe need"):
            _run(gang, "rows.py", "7")
        return
    assert _run(gang, "rows.py", "7") == rows_reference(7, gang.size)


@pytest.mark.parametrize("size", [1, 5])
@pytest.mark.slow_with(gang="gloo", size=5)  # ray-5 and gloo-1 stay in the suite
def test_the_programs_on_one_and_five_ranks(gang, size, tmp_path):
    """The programs again on a world of one rank and of five (a new gang of the module
    gang's backend): every rank count from 1 to 5 runs them on both backends."""
    from rayflow.hpc import Gang

    with Gang(size, backend=gang.backend, rank_num_cpus=0.25, gang_timeout_s=60) as g:
        pi = _run(g, "cpi.py", "1000")
        assert float(pi[0].split()[-1]) == pytest.approx(cpi_reference(1000), rel=1e-14)
        assert f"[0] token {100 + sum(range(size))}" in _run(g, "ring.py")
        out = tmp_path / "y.npy"
        assert _run(g, "matvec.py", "3", str(out)) == ["[0] saved"]
        np.testing.assert_allclose(np.load(out), matvec_reference(3, size), rtol=1e-12)
        for program in ("rma", "io", "topo") if size > 1 else ("rma", "io"):
            d = tmp_path / program
            d.mkdir()
            assert _run(g, f"{program}.py", str(d)) == []
            for r in range(size):  # MPICH's files of the same program on as many ranks
                want = PROGRAMS / f"{program}_mpich_n{size}" / f"rank{r}.txt"
                assert (d / f"rank{r}.txt").read_text() == want.read_text()
        if size == 1 or gang.backend != "gloo":  # (its manager probes ANY_SOURCE)
            assert _run(g, "rows.py", "7") == rows_reference(7, size)


def _mpirun(n, *argv, check=True):
    env = dict(os.environ, RAYFLOW_RAY__INCLUDE_DASHBOARD="false")
    cmd = [sys.executable, "-m", "rayflow", "mpirun", "-n", str(n), "--rank-cpus", "0.25",
           "--", "python", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_programs_through_rayflow_mpirun(tmp_path):
    """One `rayflow mpirun` per program (each starts its own local Ray)."""
    cpi = _mpirun(4, str(PROGRAMS / "cpi.py"), "2000")
    assert cpi.returncode == 0, cpi.stderr
    pi = [ln for ln in cpi.stdout.splitlines() if ln.startswith("[0] pi ")]
    assert float(pi[0].split()[-1]) == pytest.approx(cpi_reference(2000), rel=1e-14)
    ring = _mpirun(2, str(PROGRAMS / "ring.py"))
    assert ring.returncode == 0, ring.stderr
    assert "[0] token 101" in ring.stdout.splitlines()
    y = tmp_path / "y.npy"
    mv = _mpirun(2, str(PROGRAMS / "matvec.py"), "4", str(y))
    assert mv.returncode == 0, mv.stderr
    np.testing.assert_allclose(np.load(y), matvec_reference(4, 2), rtol=1e-12)


@pytest.mark.slow
def test_rayflow_mpirun_reports_the_failed_rank(tmp_path):
    prog = tmp_path / "fail.py"
    prog.write_text("from mpi4py import MPI\n"
                    "c = MPI.COMM_WORLD\n"
                    "if c.rank == 1:\n    raise SystemExit(5)\n"
                    "c.recv(source=1)\n")
    res = _mpirun(2, str(prog))
    assert res.returncode == 5
    assert "rank 1 exited with code 5" in res.stderr


def _guide_block(lang: str) -> str:
    import re

    text = (Path(__file__).parents[2] / "docs" / "hpc.md").read_text()
    section = text.split("## mpi4py programs", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1)


def test_guide_python_example_runs(ray_session):
    exec(compile(_guide_block("python"), "docs/hpc.md", "exec"), {})  # its assert checks it


@pytest.mark.slow
def test_guide_shell_example_runs():
    env = dict(os.environ, RAYFLOW_RAY__INCLUDE_DASHBOARD="false")
    res = subprocess.run(["bash", "-c", "set -e\n" + _guide_block("bash")], capture_output=True,
                         text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "[0] pi 3.1415926536" in res.stdout.splitlines()


@pytest.mark.parametrize("argv, message", [
    (["-n", "2", "--", "python"], "no program"),
    (["-n", "2", "--bogus", "python", "x.py"], "unknown option '--bogus'"),
    (["-n", "2", "--", "python", "-m", "mod"], "unknown option '-m'"),
    (["-n", "0", "--", "python", "x.py"], "0 is not in the range x>=1"),
])
def test_mpirun_rejects_bad_command_lines(argv, message):
    from click.testing import CliRunner

    from rayflow.cli import main

    res = CliRunner().invoke(main, ["mpirun", *argv])
    assert res.exit_code == 2 and message in res.output, res.output


def test_mpirun_names_a_missing_program(tmp_path):
    from click.testing import CliRunner

    from rayflow.cli import main

    missing = str(tmp_path / "nope.py")
    res = CliRunner().invoke(main, ["mpirun", "-n", "2", "--", "python", missing])
    assert res.exit_code == 1 and f"error: MPI program {missing!r} not found" in res.output
