"""Intercommunicators made with ``Create_intercomm``: the world split into its even and its
odd ranks, the two halves joined (leaders: rank 0 of each half, world ranks 0 and 1), as
in MPI's textbook example. ``mpiexec -n 5 python intercomm_create.py DIR``: each rank
writes DIR/even{r}.txt or DIR/odd{r}.txt (``r`` its rank in its half)."""

import sys

import numpy as np
from mpi4py import MPI


def main(out):
    world = MPI.COMM_WORLD
    color = world.Get_rank() % 2
    half = world.Split(color, world.Get_rank())
    inter = half.Create_intercomm(0, world, 1 - color, tag=12)
    rank, evens = inter.Get_rank(), color == 0
    lines = [f"rank {rank} size {inter.Get_size()} remote {inter.Get_remote_size()} "
             f"inter {inter.Is_inter()} intra {inter.Is_intra()}"]

    def here(r):  # the root's own group passes ROOT (the root) or PROC_NULL (the others)
        return MPI.ROOT if rank == r else MPI.PROC_NULL

    # even 0 -> odds
    got = inter.bcast({"n": 7}, root=here(0)) if evens else inter.bcast(None, root=0)
    lines.append(f"bcast {got}")
    # odds -> even 1
    got = inter.gather(None, root=here(1)) if evens else inter.gather(rank * 10, root=1)
    lines.append(f"gather {got}")
    # evens -> odd 1
    got = inter.reduce(rank + 1, root=1) if evens else inter.reduce(None, root=here(1))
    lines.append(f"reduce {got}")
    buf = np.arange(3, dtype="d") * (0 if evens else 5)
    inter.Bcast(buf, root=0 if evens else here(0))
    lines.append(f"Bcast {buf.tolist()}")
    lines.append(f"allgather {inter.allgather(('e' if evens else 'o') + str(rank))}")
    lines.append(f"allreduce {inter.allreduce(rank + 1)}")
    # point-to-point: even r <-> odd r; even 2 -> odd 0, received from any source
    if evens:
        if rank < inter.Get_remote_size():
            inter.send(f"hello {rank}", dest=rank, tag=3)
            lines.append(f"reply {inter.recv(source=rank, tag=4)}")
        else:
            inter.send("last", dest=0, tag=5)
    else:
        msg = inter.recv(source=rank, tag=3)
        inter.send(msg.upper(), dest=rank, tag=4)
        if rank == 0:
            st = MPI.Status()
            got = inter.recv(source=MPI.ANY_SOURCE, tag=5, status=st)
            lines.append(f"any {got} from {st.Get_source()} tag {st.Get_tag()}")
    inter.Barrier()
    # a second intercommunicator of the same groups: a message space of its own
    other = half.Create_intercomm(0, world, 1 - color, tag=13)
    if rank == 0:
        other.send(f"other from {'even' if evens else 'odd'}", dest=0, tag=3)
        inter.send(f"first from {'even' if evens else 'odd'}", dest=0, tag=3)
        lines.append(f"first {inter.recv(source=0, tag=3)} other {other.recv(source=0, tag=3)}")
    merged = inter.Merge(high=evens)  # the odds first
    lines.append(f"merged rank {merged.Get_rank()} size {merged.Get_size()} "
                 f"order {merged.allgather(('e' if evens else 'o') + str(rank))}")
    same = inter.Merge(high=True)  # both the same: the group of world rank 0 first
    lines.append(f"same rank {same.Get_rank()} "
                 f"order {same.allgather(('e' if evens else 'o') + str(rank))}")
    other.Free()
    inter.Free()
    with open(f"{out}/{'even' if evens else 'odd'}{rank}.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
