"""mpi4py's process topologies beyond Cartesian grids: a graph (``Create_graph``), a
distributed graph given by each rank's own neighbors (``Create_dist_graph_adjacent``,
weighted, with a repeated edge and an edge to itself) and by edges any rank names
(``Create_dist_graph``), and the neighbor collectives on them. Each rank's results go to
DIR/rank<r>.txt: `mpiexec -n N python topo.py DIR` (MPICH 5.0, mpi4py 4.1) wrote the files
in topo_mpich_n<N>/ for 3 and 5 ranks. (On one rank, where every edge is to itself, and
for Cartesian neighbors past a non-periodic edge, that MPICH build hangs or returns
garbage: those cases are tested against numpy in test_mpi_topo.py.)

    python topo.py DIR"""
import sys

import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
r, p = c.Get_rank(), c.Get_size()
out = []


def show(name, v):
    out.append(f"{name}: {v}")


# a ring as a graph: node i's neighbors are i - 1 and i + 1
index = [2 * (i + 1) for i in range(p)]
edges = [x for i in range(p) for x in ((i - 1) % p, (i + 1) % p)]
g = c.Create_graph(index, edges)
show("graph", (g.Get_topology() == MPI.GRAPH, g.Get_dims(), g.Get_neighbors(r),
               g.Get_neighbors_count((r + 1) % p), g.degrees))
show("graph_allgather", g.neighbor_allgather(("from", r)))
got = np.full(2 * 3, -1.0)
g.Neighbor_allgather(np.arange(3.0) + 10 * r, got)
show("graph_Allgather", got.tolist())
g.Free()

# each rank: sources r - 1 and itself, destinations r + 1 twice (two edges) and itself
src = [(r - 1) % p, r]
dst = [(r + 1) % p, (r + 1) % p, r]
dg = c.Create_dist_graph_adjacent(src, dst, sourceweights=[1, 2], destweights=[3, 4, 5])
show("dist", (dg.Get_topology() == MPI.DIST_GRAPH, dg.Get_dist_neighbors_count(),
              dg.Get_dist_neighbors()))
# rank q sends destinations (q+1, q+1, q) the items 100 q + (0, 1, 2): rank r gets, from
# r - 1 (its first edge to r) 100 (r - 1) and, from itself, 100 r + 2
show("dist_alltoall", dg.neighbor_alltoall([100 * r + k for k in range(3)]))
recv = np.full(2 * 2, -1, dtype="i")
dg.Neighbor_alltoall(np.arange(6, dtype="i").reshape(3, 2) + 10 * r, recv)
show("dist_Alltoall", recv.tolist())
counts = [1, 3]  # one item from r - 1 (its first block), three from itself (its last)
rv = np.full(4, -1.0)
dg.Neighbor_allgatherv(np.full(2, float(r)),
                       [rv, [2, 2], [0, 2], MPI.DOUBLE])
show("dist_Allgatherv", rv.tolist())
sendv = np.arange(6.0) + 100 * r
recvv = np.full(6, -1.0)
dg.Neighbor_alltoallv([sendv, [1, 2, 3], [0, 1, 3], MPI.DOUBLE],
                      [recvv, counts, [0, 2], MPI.DOUBLE])
show("dist_Alltoallv", recvv.tolist())
dg.Free()

# edges named by any rank: rank 0 names every edge q -> (q + 2) % p with weight q
if r == 0:
    eg = c.Create_dist_graph(list(range(p)), [1] * p, [(q + 2) % p for q in range(p)],
                             weights=list(range(p)))
else:
    eg = c.Create_dist_graph([], [], [], weights=[])
ins, outs, w = eg.Get_dist_neighbors()
show("dist_graph", (sorted(ins), sorted(outs), sorted(w[0]), sorted(w[1])))
show("dist_graph_allgather", sorted(eg.neighbor_allgather(r)))
eg.Free()

c.Barrier()
with open(f"{sys.argv[1]}/rank{r}.txt", "w") as f:
    f.write("\n".join(out) + "\n")
