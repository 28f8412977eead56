"""y = A x with A distributed by rows and x gathered with Allgather (mpi4py's tutorial)."""
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n_local = int(sys.argv[1])
n = n_local * size
A = np.random.default_rng(7).standard_normal((n, n))  # every rank builds the same matrix
x = np.random.default_rng(8).standard_normal(n)
A_local = A[rank * n_local:(rank + 1) * n_local]
x_local = x[rank * n_local:(rank + 1) * n_local].copy()
x_all = np.empty(n, dtype="d")
comm.Allgather([x_local, MPI.DOUBLE], [x_all, MPI.DOUBLE])
y_local = A_local @ x_all
y = np.empty(n, dtype="d")
comm.Gather(y_local, y, root=0)
if rank == 0:
    np.save(sys.argv[2], y)
    print("saved")
