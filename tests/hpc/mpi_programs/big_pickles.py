"""An mpi4py program that sends pickled objects through ``mpi4py.util.pkl5`` (which lifts
MPI's 2 GiB limit on a pickle), as programs moving large objects do: a ring of dicts holding
arrays, and a bcast and an allgather of them."""
import numpy as np
from mpi4py import MPI
from mpi4py.util import pkl5

comm = pkl5.Intracomm(MPI.COMM_WORLD)
rank, size = comm.Get_rank(), comm.Get_size()
mine = {"rank": rank, "data": np.arange(100_000, dtype="f8") * rank}
req = comm.isend(mine, dest=(rank + 1) % size, tag=3)
got = comm.recv(source=(rank - 1) % size, tag=3)
req.wait()
assert got["rank"] == (rank - 1) % size and got["data"][-1] == 99_999.0 * got["rank"]
root = comm.bcast(mine if rank == 0 else None, root=0)
assert root["rank"] == 0 and not root["data"].any()
every = comm.allgather(mine["data"][1])
assert every == [float(r) for r in range(size)]
if rank == 0:
    print("pkl5 ok", size)
