"""mpi4py's vector, prefix, non-blocking, persistent and group calls and probes, each
rank's results written to DIR/rank<r>.txt: `mpiexec -n 3 python calls.py DIR` (MPICH 4,
mpi4py 4.1) wrote the files in calls_mpich_n3/, which the tests compare with this
program's under rayflow.

    python calls.py DIR [nopoll]

``nopoll`` leaves out the calls that look for a message without blocking (iprobe, probe from
ANY_SOURCE), which the gloo backend cannot make."""
import sys

import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
r, p = c.Get_rank(), c.Get_size()
out = []


def show(name, v):
    out.append(f"{name}: {v}")


# vector collectives: rank q's block has q + 1 items; the root's blocks in reverse order,
# two items apart
counts = [q + 1 for q in range(p)]
displs = [sum(counts[q + 1:]) + 2 * (p - q) for q in range(p)]
big = np.arange(sum(counts) + 2 * p + 1, dtype="d")
got = np.full(r + 1, -1.0)
c.Scatterv([big, counts, displs, MPI.DOUBLE] if r == 0 else None, got, root=0)
show("scatterv", got.tolist())
g = np.full(sum(counts) + 2 * p + 1, -1, dtype="i")
c.Gatherv(np.full(r + 1, r, dtype="i"), [g, counts, displs, MPI.INT] if r == 1 else None,
          root=1)
if r == 1:
    show("gatherv", g.tolist())
ag = np.zeros(sum(counts))
c.Allgatherv(np.full(r + 1, r + 0.5), [ag, counts, None, MPI.DOUBLE])
show("allgatherv", ag.tolist())
ag2 = np.zeros(sum(counts))
start = sum(counts[:r])
ag2[start:start + r + 1] = -r
c.Allgatherv(MPI.IN_PLACE, [ag2, counts, None, MPI.DOUBLE])
show("allgatherv_inplace", ag2.tolist())
sc = [r + q + 1 for q in range(p)]
send = np.concatenate([np.full(n, 10 * r + q, dtype="d") for q, n in enumerate(sc)])
rc = [q + r + 1 for q in range(p)]
recv = np.zeros(sum(rc))
c.Alltoallv([send, sc, None, MPI.DOUBLE], [recv, rc, None, MPI.DOUBLE])
show("alltoallv", recv.tolist())
x = np.arange(float(sum(counts))) * (r + 1)
rs = np.zeros(r + 1)
c.Reduce_scatter(x, rs, counts, op=MPI.SUM)
show("reduce_scatter", rs.tolist())
ip = x.copy()
c.Reduce_scatter(MPI.IN_PLACE, ip, counts, op=MPI.MAX)
show("reduce_scatter_inplace", ip[:r + 1].tolist())

# prefix reductions on buffers
s = np.zeros(2)
c.Scan(np.array([r + 1.0, -r]), s, op=MPI.SUM)
show("scan", s.tolist())
e = np.full(2, 99.0)
c.Exscan(np.array([r + 1.0, -r]), e, op=MPI.PROD)
if r > 0:
    show("exscan", e.tolist())
sp = np.array([r + 1.0, 2.0])
c.Scan(MPI.IN_PLACE, sp, op=MPI.MAX)
show("scan_inplace", sp.tolist())
node = c.Split_type(MPI.COMM_TYPE_SHARED, key=-r)
show("split_type", (node.Get_size(), node.Get_rank()))

# non-blocking collectives, all started before any completes
b = np.arange(3.0) if r == p - 1 else np.zeros(3)
ig, isc, iag = np.full(2 * p, -1.0), np.zeros(2), np.zeros(2 * p)
ia2, ired, iar, irsb = np.zeros(2 * p), np.zeros(2 * p), np.zeros(2 * p), np.zeros(2)
xs = np.arange(2.0 * p) * (r + 1) - r
reqs = [c.Ibcast(b, root=p - 1), c.Igather(xs[:2], ig, root=0),
        c.Iscatter(np.arange(2.0 * p) * 3 if r == 0 else None, isc, root=0),
        c.Iallgather(xs[:2], iag), c.Ialltoall(xs, ia2),
        c.Ireduce(xs, ired, op=MPI.SUM, root=0), c.Iallreduce(xs, iar, op=MPI.MAX),
        c.Ireduce_scatter_block(xs, irsb, op=MPI.SUM), c.Ibarrier()]
MPI.Request.Waitall(reqs)
for name, a in (("ibcast", b), ("iscatter", isc), ("iallgather", iag), ("ialltoall", ia2),
                ("iallreduce", iar), ("ireduce_scatter_block", irsb)):
    show(name, a.tolist())
if r == 0:
    show("igather", ig.tolist())
    show("ireduce", ired.tolist())

# non-blocking vector and prefix collectives
vg = np.full(sum(counts) + 2 * p + 1, -1, dtype="i")
vs = np.full(r + 1, -1.0)
vag = np.zeros(sum(counts))
vrecv = np.zeros(sum(rc))
vrs = np.zeros(r + 1)
isc_, iex = np.zeros(2), np.full(2, 99.0)
reqs = [c.Igatherv(np.full(r + 1, r, dtype="i"), [vg, counts, displs, MPI.INT] if r == 0
                   else None, root=0),
        c.Iscatterv([big, counts, displs, MPI.DOUBLE] if r == p - 1 else None, vs,
                    root=p - 1),
        c.Iallgatherv(np.full(r + 1, r + 0.5), [vag, counts, None, MPI.DOUBLE]),
        c.Ialltoallv([send, sc, None, MPI.DOUBLE], [vrecv, rc, None, MPI.DOUBLE]),
        c.Ireduce_scatter(x, vrs, counts, op=MPI.SUM),
        c.Iscan(np.array([r + 1.0, -r]), isc_, op=MPI.SUM),
        c.Iexscan(np.array([r + 1.0, -r]), iex, op=MPI.PROD)]
MPI.Request.Waitall(reqs)
for name, a in (("iscatterv", vs), ("iallgatherv", vag), ("ialltoallv", vrecv),
                ("ireduce_scatter", vrs), ("iscan", isc_)):
    show(name, a.tolist())
if r == 0:
    show("igatherv", vg.tolist())
else:
    show("iexscan", iex.tolist())

# groups and the communicators made from them
world = c.Get_group()
evens = world.Incl(list(range(p - 1, -1, -2)))
show("group", (evens.Get_size(), evens.Get_rank(), evens.Translate_ranks(None, world)))
show("group_ops", (MPI.Group.Union(world.Excl([0]), evens).Translate_ranks(None, world),
                   MPI.Group.Difference(world, evens).Translate_ranks(None, world),
                   world.Range_incl([(p - 1, 0, -2)]).Translate_ranks(None, world),
                   world.Compare(world), evens.Compare(world)))
sub = c.Create(evens)
show("create", None if sub == MPI.COMM_NULL else (sub.Get_rank(), sub.allgather(r)))
if evens.Get_rank() != MPI.UNDEFINED:
    cg = c.Create_group(evens, 3)
    show("create_group", (cg.Get_rank(), cg.allgather(r)))

# probes: a buffer sized from its status, an object found from any source
if r == 0:
    for q in range(1, p):
        c.Send(np.arange(q + 2, dtype="i"), dest=q, tag=q)
        c.send({"q": q}, dest=q, tag=100)
else:
    st = MPI.Status()
    c.Probe(source=0, tag=MPI.ANY_TAG, status=st)
    buf = np.empty(st.Get_count(MPI.INT), dtype="i")
    c.Recv(buf, source=0, tag=st.Get_tag())
    show("probe", (st.Get_source(), st.Get_tag(), buf.tolist()))
    if sys.argv[2:] != ["nopoll"]:
        st2 = MPI.Status()
        c.probe(source=MPI.ANY_SOURCE, tag=100, status=st2)
        show("probe_obj", (st2.Get_source(), st2.Get_tag(), c.recv(source=0, tag=100)))
        show("iprobe_none", c.iprobe(source=0, tag=55))
    else:
        show("probe_obj", (0, 100, c.recv(source=0, tag=100)))
# persistent requests around the ring, and a matched probe
ring_out, ring_in = np.zeros(2), np.zeros(2)
pers = [c.Recv_init(ring_in, source=(r - 1) % p, tag=7),
        c.Send_init(ring_out, dest=(r + 1) % p, tag=7)]
for step in range(2):
    ring_out[:] = (r, step)
    MPI.Prequest.Startall(pers)
    MPI.Request.Waitall(pers)
    show(f"persistent{step}", ring_in.tolist())
for q in pers:
    q.Free()
c.send(("m", r), dest=(r + 1) % p, tag=8)
mst = MPI.Status()
msg = c.mprobe(source=(r - 1) % p, tag=8, status=mst)
show("mprobe", (mst.Get_source(), mst.Get_tag(), msg.recv()))
c.Set_errhandler(MPI.ERRORS_RETURN)
show("errhandler", c.Get_errhandler() == MPI.ERRORS_RETURN)
c.Barrier()
with open(f"{sys.argv[1]}/rank{r}.txt", "w") as f:
    f.write("\n".join(out) + "\n")
