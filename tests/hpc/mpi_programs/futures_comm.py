"""mpi4py.futures' MPICommExecutor, as `mpiexec -n N python futures_comm.py DIR` runs it:
rank 0 gets the executor, the others serve it and get None. Each rank writes
DIR/rank{r}.txt."""

import sys

from mpi4py import MPI
from mpi4py.futures import MPICommExecutor, get_comm_workers


def square(x):
    return x * x


def workers(_):
    comm = get_comm_workers()
    return comm.Get_size(), comm.Is_inter()


def main(out):
    world = MPI.COMM_WORLD
    lines = []
    with MPICommExecutor(world, root=0) as ex:
        if ex is not None:
            lines.append(f"num_workers {ex.num_workers}")
            lines.append(f"map {list(ex.map(square, range(20), chunksize=3))}")
            lines.append(f"workers {sorted(set(ex.map(workers, range(6))))}")
        else:
            lines.append("served: got None")
    lines.append(f"after sum {world.allreduce(world.Get_rank())}")
    with MPICommExecutor(world, root=world.Get_size() - 1) as ex:  # another root
        if ex is not None:
            lines.append(f"last root {[f.result() for f in [ex.submit(square, 7)]]}")
    with open(f"{out}/rank{world.Get_rank()}.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
