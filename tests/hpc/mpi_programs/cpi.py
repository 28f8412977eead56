"""Compute pi by the midpoint rule (mpi4py's demo/compute-pi, collective version)."""
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n = comm.bcast(int(sys.argv[1]) if rank == 0 else None, root=0)
h = 1.0 / n
s = sum(4.0 / (1.0 + (h * (i + 0.5)) ** 2) for i in range(rank, n, size))
pi = comm.reduce(s * h, op=MPI.SUM, root=0)
if rank == 0:
    print(f"pi {pi!r}")
