"""Graph and distributed graph topologies and the neighbor collectives (on them and on
Cartesian grids), on ranks that are threads (no Ray), against a plain-Python model of MPI's
rules: send block i to the i-th destination, receive block j from the j-th source, repeated
edges matched in order, ``PROC_NULL`` edges sending and receiving nothing. The same calls on
a Ray gang, beside MPICH's results, are in ``test_mpi_api_programs.py``."""

from __future__ import annotations

import numpy as np
import pytest

from rayflow.hpc import MPI
from tests.hpc.test_mpi_api_threads import run_ranks


def _model(sources: list[list[int]], dests: list[list[int]], sent: list[list]) -> list[list]:
    """What each rank receives: for its j-th source s, the item s sent on its k-th edge to
    this rank, k = how many earlier sources of this rank were s."""
    got = []
    for r, srcs in enumerate(sources):
        seen: dict[int, int] = {}
        mine = []
        for s in srcs:
            k = seen.get(s, 0)
            seen[s] = k + 1
            if s == MPI.PROC_NULL:
                mine.append(None)
                continue
            edges = [i for i, d in enumerate(dests[s]) if d == r]
            mine.append(sent[s][edges[k]])
        got.append(mine)
    return got


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_dist_graph_neighbor_alltoall_follows_mpis_matching(size):
    """Sources r - 1, r and r - 1 again; destinations r + 1 twice and r: repeated edges and
    self edges on every size (on one rank, every edge is to itself)."""
    sources = [[(r - 1) % size, r, (r - 1) % size] for r in range(size)]
    dests = [[(r + 1) % size, (r + 1) % size, r] for r in range(size)]
    sent = [[(r, k) for k in range(3)] for r in range(size)]

    def fn(c):
        r = c.rank
        g = c.Create_dist_graph_adjacent(sources[r], dests[r])
        lower = g.neighbor_alltoall(sent[r])
        buf = np.full(3 * 2, -1, dtype="i8")
        g.Neighbor_alltoall(np.array(sent[r], dtype="i8").reshape(-1), buf)
        gathered = g.neighbor_allgather(("all", r))
        return lower, [tuple(x) for x in buf.reshape(3, 2).tolist()], gathered

    out = run_ranks(size, fn)
    want = _model(sources, dests, sent)
    for r, (lower, upper, gathered) in enumerate(out):
        assert lower == want[r] and upper == want[r]
        assert gathered == [("all", s) for s in sources[r]]


@pytest.mark.parametrize("size, periodic", [(1, False), (3, False), (3, True), (4, False)])
def test_cartesian_neighbors_are_below_then_above_per_dimension(size, periodic):
    dims = MPI.Compute_dims(size, 2)

    def fn(c):
        cart = c.Create_cart(dims, periods=[periodic, True])
        r = cart.Get_rank()
        near = [q for d in range(2) for q in cart.Shift(d, 1)]
        halo = np.full(4, -7.0)
        cart.Neighbor_alltoall(np.arange(4.0) + 10 * r, halo)
        return near, cart.neighbor_allgather(r), halo.tolist()

    out = run_ranks(size, fn)
    for near, gathered, halo in out:
        assert gathered == [None if q == MPI.PROC_NULL else q for q in near]
        # block 2d comes from the neighbor below, which sent it upward (its block 2d + 1);
        # block 2d + 1 from the one above, which sent it downward (its block 2d)
        want = []
        for d in range(2):
            below, above = near[2 * d], near[2 * d + 1]
            want.append(-7.0 if below == MPI.PROC_NULL else 10.0 * below + 2 * d + 1)
            want.append(-7.0 if above == MPI.PROC_NULL else 10.0 * above + 2 * d)
        assert halo == want


def test_graph_and_dist_graph_describe_themselves_and_refuse_bad_input():
    def fn(c):
        r, p = c.rank, c.size
        index, edges = [1, 3, 4], [1, 0, 2, 1]  # a path 0 - 1 - 2 over the first 3 ranks
        g = c.Create_graph(index, edges)
        info = None if g == MPI.COMM_NULL else (
            g.Get_topology() == MPI.GRAPH, g.Get_topo(), g.neighbors, g.nnodes, g.nedges,
            g.neighbor_allgather(r))
        eg = c.Create_dist_graph([r], [1], [(r + 1) % p], weights=[10 * r])
        dist = (eg.Get_dist_neighbors(), eg.Get_dist_neighbors_count(), eg.degrees,
                eg.inedges, eg.outedges)
        errors = []
        for call in (lambda: c.Create_graph([2, 1], [0, 1]),
                     lambda: c.Create_graph([1], [5]),
                     lambda: c.Create_dist_graph_adjacent([p], [0]),
                     lambda: c.Create_dist_graph_adjacent([0], [0], sourceweights=[1]),
                     lambda: c.Create_dist_graph([0], [2], [1]),
                     lambda: eg.neighbor_alltoall([1, 2])):
            try:
                call()
            except ValueError as exc:
                errors.append(str(exc).split(":")[0])
        return info, dist, errors

    out = run_ranks(4, fn)
    assert [info for info, _, _ in out] == [
        (True, ([1, 3, 4], [1, 0, 2, 1]), [1], 3, 4, [1]),
        (True, ([1, 3, 4], [1, 0, 2, 1]), [0, 2], 3, 4, [0, 2]),
        (True, ([1, 3, 4], [1, 0, 2, 1]), [1], 3, 4, [1]),
        None]  # rank 3 is no node: COMM_NULL
    for r, (_, dist, errors) in enumerate(out):
        left, right = (r - 1) % 4, (r + 1) % 4
        assert dist == (([left], [right], ([10 * left], [10 * r])), (1, 1, True), (1, 1),
                        [left], [right])
        assert errors == ["Create_graph", "Create_graph", "Create_dist_graph_adjacent",
                          "Create_dist_graph_adjacent", "Create_dist_graph",
                          "neighbor_alltoall"]
