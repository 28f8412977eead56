"""mpi4py's one-sided communication: windows made by Create, Allocate and Allocate_shared;
fences, post-start-complete-wait and locks; Put, Get, Accumulate, Get_accumulate,
Fetch_and_op, Compare_and_swap and the request forms. Each rank's results go to
DIR/rank<r>.txt: `mpiexec -n N python rma.py DIR` (MPICH 5.0, mpi4py 4.1) wrote the files in
rma_mpich_n<N>/ for 1, 3 and 5 ranks, which the tests compare with this program's under
rayflow.

    python rma.py DIR

What depends on the order in which ranks reach a target (which rank a lock lets in first)
is shown in a form that does not: sorted, or counted."""
import sys

import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
r, p = c.Get_rank(), c.Get_size()
right, left = (r + 1) % p, (r - 1) % p
out = []


def show(name, v):
    out.append(f"{name}: {v}")


# Create over an array of the program's, with fences: a put to the right, a sum into every
# rank's last item, then a get from the left in the next epoch
a = np.full(p + 2, -1.0)
win = MPI.Win.Create(a, disp_unit=a.itemsize, comm=c)
show("create_attrs", (win.Get_attr(MPI.WIN_SIZE), win.Get_attr(MPI.WIN_DISP_UNIT),
                      win.Get_attr(MPI.WIN_CREATE_FLAVOR) == MPI.WIN_FLAVOR_CREATE))
try:
    win.Put(np.ones(1), right)
except MPI.Exception as exc:
    show("put_without_epoch", exc.Get_error_class() == MPI.ERR_RMA_SYNC)
win.Fence()
win.Put(np.array([10.0 * r]), right, target=r)
for t in range(p):
    win.Accumulate(np.array([r + 1.0]), t, target=p + 1, op=MPI.SUM)
win.Fence()
show("fence_local", a.tolist())
got = np.zeros(p + 2)
win.Get(got, left)
win.Fence()
show("fence_get_left", got.tolist())
# MAX, REPLACE and the request forms
win.Accumulate(np.array([float(r)]), 0, target=p, op=MPI.MAX)
win.Fence()
win.Rput(np.array([100.0 + r]), right, target=[r, 1, MPI.DOUBLE]).Wait()
rq = win.Raccumulate(np.array([1.0]), left, target=p + 1, op=MPI.SUM)
MPI.Request.Waitall([rq])
win.Fence()
rg = np.zeros(2)
win.Rget(rg, 0, target=(p, 2, MPI.DOUBLE)).Wait()
win.Fence(MPI.MODE_NOSUCCEED)
show("max_replace_requests", (a.tolist(), rg.tolist()))
win.Free()

# Allocate, viewed with np.frombuffer; partial targets and displacement units
w2 = MPI.Win.Allocate(8 * (p + 2), disp_unit=8, comm=c)
mem = np.frombuffer(w2, dtype="i8")
mem[:] = 1000 * r + np.arange(p + 2)
w2.Fence()
buf = np.full(3, -5, dtype="i8")
w2.Get(buf, right, target=(r, 2, MPI.INT64_T))
w2.Fence()
show("allocate_get_part", buf.tolist())
old = np.zeros(2, dtype="i8")
w2.Get_accumulate(np.array([7, 7], dtype="i8"), old, left, target=(1, 2, MPI.INT64_T),
                  op=MPI.PROD)
w2.Fence()
peek = np.zeros(p + 2, dtype="i8")
w2.Get_accumulate(np.zeros(p + 2, dtype="i8"), peek, r, op=MPI.NO_OP)
w2.Fence(MPI.MODE_NOSUCCEED)
show("get_accumulate", (old.tolist(), peek.tolist()))
w2.Free()

# post-start-complete-wait: each rank exposes its window to its left neighbour and
# accesses its right one
ring = np.full(2, -1, dtype="i4")
w3 = MPI.Win.Create(ring, disp_unit=4, comm=c)
g = c.Get_group()
for step in range(2):
    w3.Post(g.Incl([left]))
    w3.Start(g.Incl([right]))
    w3.Put(np.array([10 * step + r], dtype="i4"), right, target=step)
    w3.Complete()
    w3.Wait()
    show(f"pscw{step}", ring.tolist())
w3.Free()

# locks: a counter at rank 0 that every rank increments under Lock_all, and a
# compare-and-swap that only one rank wins
cnt = MPI.Win.Allocate(16 if r == 0 else 0, disp_unit=8, comm=c)
if r == 0:
    np.frombuffer(cnt, dtype="i8")[:] = (0, -1)
c.Barrier()
seen = []
res = np.zeros(1, dtype="i8")
cnt.Lock_all()
for _ in range(4):
    cnt.Fetch_and_op(np.array([1], dtype="i8"), res, 0, 0, op=MPI.SUM)
    cnt.Flush(0)
    seen.append(int(res[0]))
cnt.Unlock_all()
cnt.Lock(0, MPI.LOCK_EXCLUSIVE)
prev = np.zeros(1, dtype="i8")
cnt.Compare_and_swap(np.array([r], dtype="i8"), np.array([-1], dtype="i8"), prev, 0, 1)
cnt.Unlock(0)
won = c.allreduce(int(prev[0] == -1))
everything = c.gather(seen, root=0)
cnt.Lock(0, MPI.LOCK_SHARED)
final = np.zeros(2, dtype="i8")
cnt.Get(final, 0)
cnt.Unlock(0)
c.Barrier()
show("counter", (sorted(sum(everything, [])) if r == 0 else None, int(final[0]), won,
                 final[1] in range(p)))
cnt.Free()

# Allocate_shared: rank 0 holds every rank's item; the ranks store into it directly
sh = MPI.Win.Allocate_shared(8 * p if r == 0 else 0, disp_unit=8, comm=c)
mem0, unit = sh.Shared_query(0)
whole = np.ndarray(buffer=mem0, dtype="d", shape=(p,))
sh.Fence()
whole[r] = r + 0.25
sh.Fence()
show("shared", (whole.tolist(), unit, len(sh.Shared_query(right)[0])))
sh.Free()

c.Barrier()
with open(f"{sys.argv[1]}/rank{r}.txt", "w") as f:
    f.write("\n".join(out) + "\n")
