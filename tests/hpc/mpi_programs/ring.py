"""Pass a token around a ring of ranks; each rank adds its number (mpi4py style)."""
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
left, right = (rank - 1) % size, (rank + 1) % size
token = np.zeros(1, dtype="i8")
if rank == 0:
    token[0] = 100
    comm.Send([token, MPI.INT64_T], dest=right, tag=11)
    comm.Recv([token, MPI.INT64_T], source=left, tag=11)
    print(f"token {int(token[0])}")
else:
    comm.Recv([token, MPI.INT64_T], source=left, tag=11)
    token += rank
    comm.Send([token, MPI.INT64_T], dest=right, tag=11)
# and an object around the ring with sendrecv
got = comm.sendrecv(f"from {rank}", dest=right, source=left)
print(f"got {got}")
