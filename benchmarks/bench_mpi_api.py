"""The same mpi4py program under ``rayflow mpirun`` and under ``mpiexec`` (mpi4py on MPICH).

    python benchmarks/bench_mpi_api.py [--rounds 2] [--ranks 1 --ranks 2 --ranks 4] [--quick]

The program (:func:`program`, this file run with ``--program``) is plain mpi4py: ``from
mpi4py import MPI``, then buffer ``Allreduce`` of 8 B, 1 KiB and 1 MiB, the lowercase
``allreduce`` of a float, ``Bcast`` of 1 KiB and 1 MiB, ``Barrier``, a ``Send``/``Recv``
ping-pong of 8 B and 1 MiB between ranks 0 and 1, and one-sided ``Put``, ``Get`` and
``Accumulate`` of 8 B and ``Put`` of 1 MiB from rank 0 into rank 1's window (each with its
``Flush``: complete at the target), and ``mpi4py.futures``: rank 0's ``MPICommExecutor``
maps ``abs`` over the other ranks (one call a message, then 100; the figure is the map's
time per call); on one rank, a program whose ``MPIPoolExecutor`` spawns two workers maps
``abs`` the same way. They run unmodified under both launchers
with the same repetitions; each rank times every repetition itself and rank 0 prints the
medians (microseconds) as one JSON line, after checking every result against the value
MPI defines. Launchers alternate in rounds (``rayflow mpirun -n N``, then ``mpiexec -n N``,
then again), and a figure is the median over the rounds. Writes
``benchmarks/results/mpi_api.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve()
KIB, MIB = 1024, 1024 * 1024
_MARK = "MPI-API-RESULT "
#: (name, payload bytes, repetitions), the same for both launchers
CASES = [("Allreduce", 8, 2000), ("Allreduce", KIB, 2000), ("Allreduce", MIB, 40),
         ("allreduce", 8, 2000), ("Bcast", KIB, 2000), ("Bcast", MIB, 40),
         ("Barrier", 0, 2000), ("pingpong", 8, 2000), ("pingpong", MIB, 40),
         # one-sided, rank 0 into rank 1's window under Lock_all, each followed by Flush;
         # rank 1 waits in the next Barrier meanwhile
         ("Put", 8, 2000), ("Get", 8, 2000), ("Accumulate", 8, 2000), ("Put", MIB, 40),
         # mpi4py.futures: rank 0's MPICommExecutor maps abs over the other ranks, one call
         # per message and 100 per message; the figure is the map's time per call
         ("MPICommExecutor.map chunksize=1", 0, 2000),
         ("MPICommExecutor.map chunksize=100", 0, 20000)]
#: the program on one rank (:func:`spawn_program`): an MPIPoolExecutor that spawns 2 workers
SPAWN_CASES = [("MPIPoolExecutor(2 spawned).map chunksize=1", 0, 2000),
               ("MPIPoolExecutor(2 spawned).map chunksize=100", 0, 20000)]


def program() -> None:
    """The mpi4py program both launchers run (nothing here knows which one it is under)."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    def timed(fn, reps: int) -> float:
        comm.Barrier()
        ts = []
        for _ in range(reps):
            t0 = MPI.Wtime()
            fn()
            ts.append(MPI.Wtime() - t0)
        return median(ts[len(ts) // 10:]) * 1e6  # the first tenth warms up

    def pingpong(send: np.ndarray, recv: np.ndarray) -> None:
        if rank == 0:
            comm.Send(send, dest=1, tag=7)
            comm.Recv(recv, source=1, tag=7)
        elif rank == 1:
            comm.Recv(recv, source=0, tag=7)
            comm.Send(recv, dest=0, tag=7)

    total = size * (size + 1) / 2
    out: dict[str, float] = {}
    win = MPI.Win.Allocate(MIB if rank == 1 else 0, disp_unit=8, comm=comm)
    if rank == 0 and size > 1:
        win.Lock_all()
    for name, nbytes, reps in CASES:
        n = max(1, nbytes // 8)
        send, recv = np.full(n, rank + 1.0), np.empty(n)
        key = f"{name} {nbytes}"
        if name == "Allreduce":
            out[key] = timed(lambda s=send, r=recv: comm.Allreduce(s, r, op=MPI.SUM), reps)
            assert np.array_equal(recv, np.full(n, total)), key
        elif name == "allreduce":
            got: list = [None]
            out[key] = timed(lambda g=got: g.__setitem__(0, comm.allreduce(rank + 1.0)), reps)
            assert got[0] == total, key
        elif name == "Bcast":
            out[key] = timed(lambda b=send: comm.Bcast(b, root=0), reps)
            assert np.array_equal(send, np.ones(n)), key  # root 0 sent its ones
        elif name == "Barrier":
            out[key] = timed(comm.Barrier, reps)
        elif name == "pingpong" and size > 1:
            out[key] = timed(lambda s=send, r=recv: pingpong(s, r), reps)
            if rank < 2:  # rank 0's ones went to rank 1 and back
                assert np.array_equal(recv, np.ones(n)), key
        elif name in ("Put", "Get", "Accumulate") and size > 1:
            call = {"Put": win.Put, "Get": win.Get, "Accumulate": win.Accumulate}[name]
            out[key] = timed(lambda s=send, c=call: (c(s, 1), win.Flush(1)) if rank == 0
                             else None, reps)
            if rank == 0:  # the puts of 1.0 left 1.0, each sum added 1.0
                want = 1.0 + reps if name == "Accumulate" else 1.0
                seen = np.empty(1)
                win.Get(seen, 1)
                win.Flush(1)
                assert seen[0] == want, (key, seen[0], want)
    if rank == 0 and size > 1:
        whole = np.empty(MIB // 8)
        win.Get(whole, 1)  # the last call put rank 0's ones over all of it
        assert np.array_equal(whole, np.ones(MIB // 8)), "Put 1 MiB"
        win.Unlock_all()
    comm.Barrier()
    win.Free()
    from mpi4py.futures import MPICommExecutor

    for name, nbytes, reps in CASES:
        if not name.startswith("MPICommExecutor") or size < 2:
            continue
        chunk = int(name.rsplit("=", 1)[1])
        with MPICommExecutor(comm, root=0) as ex:
            if ex is not None:
                list(ex.map(abs, range(-200, 0), chunksize=chunk))  # every worker is up
                t0 = MPI.Wtime()
                got = list(ex.map(abs, range(-reps, 0), chunksize=chunk))
                out[f"{name} {nbytes}"] = (MPI.Wtime() - t0) / reps * 1e6
                assert got == list(range(reps, 0, -1)), name
    if rank == 0:
        print(_MARK + json.dumps({"ranks": size, "us": out,
                                  "library": MPI.Get_library_version().split("\n")[0]}),
              flush=True)


def spawn_program() -> None:
    """On one rank: an ``MPIPoolExecutor`` that spawns two workers maps ``abs`` (the
    figure is the map's time per call, the workers started before it)."""
    from mpi4py import MPI
    from mpi4py.futures import MPIPoolExecutor

    out: dict[str, float] = {}
    with MPIPoolExecutor(max_workers=2) as ex:
        for name, nbytes, reps in SPAWN_CASES:
            chunk = int(name.rsplit("=", 1)[1])
            list(ex.map(abs, range(-200, 0), chunksize=chunk))  # every worker is up
            t0 = MPI.Wtime()
            got = list(ex.map(abs, range(-reps, 0), chunksize=chunk))
            out[f"{name} {nbytes}"] = (MPI.Wtime() - t0) / reps * 1e6
            assert got == list(range(reps, 0, -1)), name
    print(_MARK + json.dumps({"ranks": 1, "us": out,
                              "library": MPI.Get_library_version().split("\n")[0]}), flush=True)


# ------------------------------------------------------------------------------ driver
def _launch(launcher: str, ranks: int) -> dict:
    bindir = Path(sys.executable).parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    # one rank runs the spawning program, more the main one
    prog = "--spawn-program" if ranks == 1 else "--program"
    if launcher == "rayflow":
        cmd = [str(bindir / "rayflow"), "mpirun", "-n", str(ranks), "--", sys.executable,
               str(HERE), prog]
    else:
        cmd = [str(bindir / "mpiexec"), "-n", str(ranks), sys.executable, str(HERE), prog]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        at = line.find(_MARK)
        if at >= 0:  # rayflow prefixes each line with "[rank] "
            doc = json.loads(line[at + len(_MARK):])
            doc["wall_s"] = wall
            return doc
    raise RuntimeError(f"{' '.join(cmd[:4])} failed ({proc.returncode}): "
                       f"{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--program"]:
        program()
        return
    if argv[:1] == ["--spawn-program"]:
        spawn_program()
        return
    sys.path.insert(0, str(HERE.parent))
    import click
    from _common import machine_info, print_table, ratio, write_result

    @click.command()
    @click.option("--ranks", "ranks", multiple=True, type=int,
                  help="default: 1 (the spawning program), 2 and 4")
    @click.option("--rounds", default=2, show_default=True,
                  help="runs per launcher and rank count, alternating")
    @click.option("--quick", is_flag=True, help="one round of 1 and 2 ranks (writes nothing)")
    def cli(ranks: tuple[int, ...], rounds: int, quick: bool) -> None:
        if quick:
            ranks, rounds = (1, 2), 1
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise click.ClickException(
                "mpi4py is not installed: pip install -e '.[peers]'") from None
        print("machine:", machine_info(), flush=True)
        runs: dict[tuple[str, int], list[dict]] = {}
        for n in ranks or (1, 2, 4):
            for _ in range(rounds):
                for launcher in ("rayflow", "mpiexec"):
                    doc = _launch(launcher, n)
                    runs.setdefault((launcher, n), []).append(doc)
                    print(f"{launcher} -n {n}: {doc['wall_s']:.1f} s", flush=True)
        rows = []
        for (launcher, n), docs in runs.items():
            if launcher != "rayflow":
                continue
            peer = runs[("mpiexec", n)]
            for name, nbytes, reps in SPAWN_CASES if n == 1 else CASES:
                k = f"{name} {nbytes}"
                ours = median(d["us"][k] for d in docs)
                theirs = median(d["us"][k] for d in peer)
                rows.append({"ranks": n, "op": name, "bytes": nbytes, "reps": reps,
                             "rayflow_us": ours, "mpi4py_us": theirs,
                             "vs_mpi4py": ratio(ours, theirs),
                             "rayflow_runs_us": [d["us"][k] for d in docs],
                             "mpi4py_runs_us": [d["us"][k] for d in peer]})
        print_table("the same mpi4py program: median microseconds per call (rank 0)",
                    ["ranks", "op", "bytes", "rayflow mpirun", "mpiexec (MPICH)", "ratio"],
                    [[r["ranks"], r["op"], r["bytes"], r["rayflow_us"], r["mpi4py_us"],
                      r["vs_mpi4py"]] for r in rows])
        walls = {f"{la} -n {n}": [round(d["wall_s"], 2) for d in docs]
                 for (la, n), docs in runs.items()}
        if quick:
            print("machine:", machine_info())
            return
        lib = next(iter(runs[("mpiexec", (ranks or (1, 2, 4))[0])]))["library"]
        path = write_result("mpi_api", {"rounds": rounds, "rows": rows, "wall_s": walls,
                                        "mpi_library": lib,
                                        "program": "benchmarks/bench_mpi_api.py --program"})
        print(f"wrote {path}")

    cli(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
