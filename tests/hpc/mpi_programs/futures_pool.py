"""mpi4py.futures' MPIPoolExecutor. As `mpiexec -n N python -m mpi4py.futures futures_pool.py
DIR`, rank 0 runs this script and the other ranks are the workers; as `mpiexec -n 1 python
futures_pool.py DIR W`, each executor spawns W workers. Rank 0 writes DIR/results.txt."""

import operator
import sys
from concurrent.futures import as_completed, wait

from mpi4py import MPI
from mpi4py.futures import MPIPoolExecutor, get_comm_workers

FACTOR = 1  # set on each worker by the initializer


def init(factor):
    global FACTOR
    FACTOR = factor


def scaled(x):
    return x * FACTOR


def fails(x):
    if x == 3:
        raise ValueError(f"bad input {x}")
    return x


def whoami(_):
    comm = get_comm_workers()
    return (__name__, comm.Get_size(), MPI.COMM_WORLD.Get_size())


def main(out, max_workers=None):
    lines = []
    with MPIPoolExecutor(max_workers) as ex:
        lines.append(f"num_workers {ex.num_workers}")
        lines.append(f"submit {ex.submit(pow, 2, 10).result()}")
        lines.append(f"map {list(ex.map(operator.mul, range(10), range(10, 20)))}")
        lines.append(f"map chunks {list(ex.map(abs, range(-25, 0), chunksize=4))}")
        lines.append(f"unordered {sorted(ex.map(abs, range(-9, 0), unordered=True))}")
        lines.append(f"starmap {list(ex.starmap(divmod, [(7, 2), (9, 4), (100, 7)]))}")
        lines.append(f"buffersize {list(ex.map(scaled, range(12), buffersize=3))}")
        fs = [ex.submit(fails, i) for i in range(5)]
        done, _ = wait(fs)
        for i, f in enumerate(fs):
            exc = f.exception()
            lines.append(f"fails {i} {f.result() if exc is None else repr(exc)}")
        got = sorted(f.result() for f in as_completed([ex.submit(scaled, i) for i in range(6)]))
        lines.append(f"as_completed {got}")
        lines.append(f"whoami {sorted(set(ex.map(whoami, range(4))))}")
    with MPIPoolExecutor(max_workers, initializer=init, initargs=(10,)) as ex:
        lines.append(f"initializer {list(ex.map(scaled, range(8)))}")
    ex.shutdown()
    try:
        ex.submit(abs, 1)
    except RuntimeError as exc:
        lines.append(f"after shutdown {exc}")
    with open(f"{out}/results.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:]))
