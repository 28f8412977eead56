"""Intercommunicator calls between two parents and the three ranks they spawn:
``mpiexec -n 2 python spawn_calls.py DIR``. The same script runs as both (the spawned ranks
have a parent). Each rank writes DIR/parent{r}.txt or DIR/child{r}.txt."""

import sys

import numpy as np
from mpi4py import MPI


def main(out):
    parent = MPI.Comm.Get_parent()
    world = MPI.COMM_WORLD
    if parent == MPI.COMM_NULL:
        role = "parent"
        errcodes = []
        inter = world.Spawn(sys.executable, args=[__file__, out], maxprocs=3, root=0,
                            errcodes=errcodes)
    else:
        role, inter, errcodes = "child", parent, None
    rank = inter.Get_rank()
    parents = role == "parent"
    lines = [f"rank {rank} size {inter.Get_size()} remote {inter.Get_remote_size()} "
             f"inter {inter.Is_inter()} intra {inter.Is_intra()} world {world.Get_size()}"]
    if errcodes is not None:
        lines.append(f"errcodes {errcodes}")

    def here(r):  # the root's own group passes ROOT (the root) or PROC_NULL (the others)
        return MPI.ROOT if rank == r else MPI.PROC_NULL

    # parent 0 -> children
    got = inter.bcast({"n": 7}, root=here(0)) if parents else inter.bcast(None, root=0)
    lines.append(f"bcast {got if not parents else None}")
    # children -> parent 0
    got = inter.gather(None, root=here(0)) if parents else inter.gather(rank * 10, root=0)
    lines.append(f"gather {got}")
    # child 0 -> parents
    if parents:
        got = inter.scatter(None, root=0)
    else:
        got = inter.scatter(["a", "b"] if rank == 0 else None, root=here(0))
    lines.append(f"scatter {got}")
    # parents -> child 2
    got = inter.reduce(None, root=here(2)) if not parents else inter.reduce(rank + 1, root=2)
    lines.append(f"reduce {got}")
    # parent 1 -> children, buffers
    buf = np.arange(4, dtype="d") * (10 if parents else 0)
    inter.Bcast(buf, root=here(1) if parents else 1)
    lines.append(f"Bcast {buf.tolist()}")
    # children -> parent 0, buffers
    res = np.zeros(3, dtype="i")
    if parents:
        inter.Reduce(None, res, op=MPI.MAX, root=here(0))
    else:
        inter.Reduce(np.array([rank, 5 - rank, 7], dtype="i"), None, op=MPI.MAX, root=0)
    lines.append(f"Reduce {res.tolist()}")
    lines.append(f"allgather {inter.allgather(('p' if parents else 'c') + str(rank))}")
    lines.append(f"allreduce {inter.allreduce(rank + 1)}")
    # point-to-point: parent r <-> child r; child 2 -> parent 0, received from any source
    if parents:
        inter.send(f"hello {rank}", dest=rank, tag=3)
        lines.append(f"reply {inter.recv(source=rank, tag=4)}")
        if rank == 0:
            st = MPI.Status()
            got = inter.recv(source=MPI.ANY_SOURCE, tag=5, status=st)
            lines.append(f"any {got} from {st.Get_source()} tag {st.Get_tag()}")
    else:
        if rank < 2:
            msg = inter.recv(source=rank, tag=3)
            inter.send(msg.upper(), dest=rank, tag=4)
        else:
            inter.send("last", dest=0, tag=5)
    inter.Barrier()
    merged = inter.Merge(high=not parents)
    lines.append(f"merged rank {merged.Get_rank()} size {merged.Get_size()} "
                 f"sum {merged.allreduce(merged.Get_rank() * 10 + rank)}")
    flipped = inter.Merge(high=parents)
    lines.append(f"flipped rank {flipped.Get_rank()} "
                 f"order {flipped.allgather(('p' if parents else 'c') + str(rank))}")
    inter.Disconnect()
    with open(f"{out}/{role}{rank}.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
