"""Rows of a matrix that do not split evenly: Scatterv hands each rank its rows, each rank
sums them, Gatherv brings the sums back; then a manager hands out tasks and workers send
results of lengths of their own, which the manager sizes with Probe (mpi4py idioms)."""
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n, m = int(sys.argv[1]), 4
rows = [n // size + (1 if r < n % size else 0) for r in range(size)]
counts = [k * m for k in rows]
displs = [sum(counts[:r]) for r in range(size)]
A = np.arange(n * m, dtype="d").reshape(n, m) if rank == 0 else None
local = np.empty((rows[rank], m))
comm.Scatterv([A, counts, displs, MPI.DOUBLE], local, root=0)
sums = np.empty(n) if rank == 0 else None
comm.Gatherv(local.sum(axis=1), [sums, rows, MPI.DOUBLE] if rank == 0 else None, root=0)
if rank == 0:
    print("row sums", " ".join(f"{s:g}" for s in sums))

TASK, RESULT, STOP = 1, 2, 3
if rank == 0:
    tasks, results, status = list(range(1, 2 * size)), {}, MPI.Status()
    active = 0
    for w in range(1, size):
        if tasks:
            comm.send(tasks.pop(), dest=w, tag=TASK)
            active += 1
    while active:
        comm.Probe(source=MPI.ANY_SOURCE, tag=RESULT, status=status)
        w = status.Get_source()
        buf = np.empty(status.Get_count(MPI.INT64_T), dtype="i8")
        comm.Recv(buf, source=w, tag=RESULT)
        results[int(buf[0])] = buf[1:].tolist()
        if tasks:
            comm.send(tasks.pop(), dest=w, tag=TASK)
        else:
            comm.send(None, dest=w, tag=STOP)
            active -= 1
    print("tasks", " ".join(f"{t}:{sum(v)}" for t, v in sorted(results.items())))
else:
    status = MPI.Status()
    while True:
        t = comm.recv(source=0, tag=MPI.ANY_TAG, status=status)
        if status.Get_tag() == STOP:
            break
        comm.Send(np.arange(t + 1, dtype="i8") + np.array([t] + [0] * t), dest=0, tag=RESULT)
