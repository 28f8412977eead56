"""The same collective conformance checks for both backends, on a 2x2 gang, against numpy."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from rayflow.hpc import BlockDataset, mpimap


def _data(r):
    return np.linspace(-1.0, 1.0, 6) * (r + 1) + r


def _all_collectives(comm, block):
    r = comm.rank
    cart = comm.create_cart((2, 2), periods=(True, True))
    row, col = cart.row(), cart.col()
    x = _data(r)
    big = np.full(200_000, r + 1.0)
    buf = np.full(3, float(r))
    cart.shift_replace(buf, 1, -1)
    out = {
        "sum": comm.allreduce(x), "min": comm.allreduce(x, "min"), "max": comm.allreduce(x, "max"),
        "prod": comm.allreduce(x, "prod"), "scalar": comm.allreduce(float(r)),
        "big": comm.allreduce(big)[:3],
        "f32": comm.allreduce(x.astype(np.float32)),
        "reduce": comm.reduce(x, "sum", root=3),
        "bcast": comm.bcast(np.arange(5) if r == 2 else None, root=2),
        "bcast_obj": comm.bcast({"k": [1, 2]} if r == 0 else None),
        "allgather": comm.allgather(np.arange(r + 1)),  # ragged pieces
        "rs": comm.reduce_scatter(np.arange(10.0) * (r + 1)),
        "row": row.allreduce(x), "col": col.allreduce(x), "row_gather": row.allgather(r),
        "shifted": buf, "sendrecv": cart.sendrecv(r, dest=cart.shift(0, 1)[1],
                                                   source=cart.shift(0, 1)[0]),
    }
    grid = comm.create_cart((2, 2))  # non-periodic, as MPI's default
    left, right = grid.shift(1, 1)
    out["halo"] = grid.sendrecv(r, dest=right, source=left)  # the edge ranks too
    out["exact"] = {
        "big_int": comm.allreduce(2**62),
        "fraction": comm.allreduce(Fraction(1, r + 1)),
        "bool": comm.allreduce(r < 3),
        "complex": comm.allreduce(np.array([1 + 2j, -1j]) * (r + 1)),
        "u64": comm.allreduce(np.array([2**63 + r], dtype=np.uint64), "max"),
        "f16": comm.allreduce(np.array([0.5, 1.5], dtype=np.float16)),
        "f32_scalar": comm.allreduce(np.float32(r)),
        "rs_complex": comm.reduce_scatter(np.arange(4) * (1 + 1j)),
    }
    src, dst = cart.shift(0, 1)
    arr = np.full(4, float(r))
    req = cart.isend(arr, dst, tag=5)
    out["isend"] = cart.recv(src, tag=5)
    req.wait()
    assert req.test()
    comm.barrier()
    return out


@pytest.fixture(params=["ray", "gloo"])
def any_gang(request):
    return request.getfixturevalue("gang4" if request.param == "ray" else "gloo_gang4")


def test_collectives_conform_to_numpy(any_gang):
    ds = BlockDataset.from_numpy(np.zeros(4), 4)
    outs = mpimap(_all_collectives, ds, gang=any_gang).blocks()
    stack = np.stack([_data(r) for r in range(4)])
    for r, o in enumerate(outs):
        i, j = divmod(r, 2)
        np.testing.assert_allclose(o["sum"], stack.sum(0), rtol=1e-14)
        np.testing.assert_array_equal(o["min"], stack.min(0))
        np.testing.assert_array_equal(o["max"], stack.max(0))
        np.testing.assert_allclose(o["prod"], stack.prod(0), rtol=1e-14)
        assert o["scalar"] == 6.0
        np.testing.assert_array_equal(o["big"], [10.0] * 3)
        assert o["f32"].dtype == np.float32
        np.testing.assert_allclose(o["f32"], stack.sum(0), rtol=1e-6, atol=1e-6)
        if r == 3:
            np.testing.assert_allclose(o["reduce"], stack.sum(0), rtol=1e-14)
        else:
            assert o["reduce"] is None
        np.testing.assert_array_equal(o["bcast"], np.arange(5))
        assert o["bcast_obj"] == {"k": [1, 2]}
        assert [len(g) for g in o["allgather"]] == [1, 2, 3, 4]
        np.testing.assert_array_equal(o["rs"], np.array_split(np.arange(10.0) * 10, 4)[r])
        np.testing.assert_allclose(o["row"], stack[2 * i] + stack[2 * i + 1], rtol=1e-14)
        np.testing.assert_allclose(o["col"], stack[j] + stack[2 + j], rtol=1e-14)
        assert o["row_gather"] == [2 * i, 2 * i + 1]
        np.testing.assert_array_equal(o["shifted"], np.full(3, float(2 * i + (j + 1) % 2)))
        assert o["sendrecv"] == 2 * ((i - 1) % 2) + j
        np.testing.assert_array_equal(o["isend"], np.full(4, 2.0 * ((i - 1) % 2) + j))
        assert o["halo"] == (None if j == 0 else r - 1)
        ex = o["exact"]
        assert ex["big_int"] == 2**64 and type(ex["big_int"]) is int
        assert ex["fraction"] == Fraction(25, 12)
        assert ex["bool"] == 3 and type(ex["bool"]) is int
        assert ex["complex"].dtype == np.complex128
        np.testing.assert_array_equal(ex["complex"], [10 + 20j, -10j])
        assert ex["u64"].dtype == np.uint64 and int(ex["u64"][0]) == 2**63 + 3
        assert ex["f16"].dtype == np.float16
        np.testing.assert_array_equal(ex["f16"], [2.0, 6.0])
        assert type(ex["f32_scalar"]) is np.float32 and ex["f32_scalar"] == 6
        np.testing.assert_array_equal(ex["rs_complex"], [4 * r * (1 + 1j)])


def _ray_util_collective(comm, block, group_name_holder):
    """Use the RAYFLOW backend through ray.util.collective's own API."""
    import uuid

    import ray
    from ray.util import collective as col

    from rayflow.hpc.backends.ray_backend import create_rendezvous
    from rayflow.hpc.ray_collective import register_ray_backend

    register_ray_backend()
    name = comm.bcast(f"t-{uuid.uuid4().hex[:8]}" if comm.rank == 0 else None)
    if comm.rank == 0:
        rdv = create_rendezvous(name, comm.size)
        ray.get(rdv.__ray_ready__.remote())
    comm.barrier()
    col.init_collective_group(comm.size, comm.rank, backend="RAYFLOW", group_name=name)
    x = np.full(3, comm.rank + 1.0)
    col.allreduce(x, group_name=name)
    y = np.arange(2.0) if comm.rank == 0 else np.zeros(2)
    col.broadcast(y, src_rank=0, group_name=name)
    outs = [np.zeros(1) for _ in range(comm.size)]
    col.allgather(outs, np.array([comm.rank * 2.0]), group_name=name)
    col.barrier(name)
    comm.barrier()
    return np.concatenate([x, y, np.concatenate(outs)])


def test_backend_is_registered_with_ray_util_collective(gang4):
    ds = BlockDataset.from_numpy(np.zeros(4), 4)
    for blk in mpimap(_ray_util_collective, ds, fn_args=(None,), gang=gang4).blocks():
        np.testing.assert_array_equal(blk, [10, 10, 10, 0, 1, 0, 2, 4, 6])


def _allreduce_values(comm, block):
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(1000)
    return {"x": x, "sum": comm.allreduce(x), "min": comm.allreduce(x, "min"),
             "prod": comm.allreduce(x, "prod"), "scalar": comm.allreduce(comm.rank + 1),
             "i32": comm.allreduce(np.arange(4, dtype=np.int32) * comm.rank, "max")}


@pytest.mark.parametrize("size", [3, pytest.param(5, marks=pytest.mark.slow)])
def test_gloo_allreduce_any_rank_count_is_identical_on_every_rank(ray_session, size):
    """The gloo world allreduce runs as recursive doubling; extra ranks fold into partners."""
    pytest.importorskip("torch")
    from rayflow.hpc import Gang

    with Gang(size, backend="gloo", rank_num_cpus=0.25, gang_timeout_s=60) as g:
        outs = mpimap(_allreduce_values, BlockDataset.from_numpy(np.zeros(size), size),
                      gang=g).blocks()
    xs = np.stack([o["x"] for o in outs])
    for o in outs:
        # bitwise the same everywhere (CG keeps replicated vectors in step on this)
        np.testing.assert_array_equal(o["sum"], outs[0]["sum"])
        np.testing.assert_array_equal(o["prod"], outs[0]["prod"])
        np.testing.assert_allclose(o["sum"], xs.sum(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(o["min"], xs.min(0))
        np.testing.assert_allclose(o["prod"], xs.prod(0), rtol=1e-12)
        assert o["scalar"] == size * (size + 1) // 2
        assert o["i32"].dtype == np.int32
        np.testing.assert_array_equal(o["i32"], np.arange(4) * (size - 1))


def _imported(comm, block):
    import sys

    return {"torch": "torch" in sys.modules, "collective": "ray.util.collective" in sys.modules}


def test_ray_backend_ranks_do_not_import_torch(ray_session):
    """ray.util.collective imports torch when installed (+197 MB per rank, measured); the
    native backend's ranks join their group without it. (A fresh gang: the shared one also
    serves the test that uses ray.util.collective on purpose.)"""
    from rayflow.hpc import Gang

    with Gang(2, rank_num_cpus=0.25, gang_timeout_s=60) as g:
        outs = mpimap(_imported, BlockDataset.from_numpy(np.zeros(2), 2), gang=g).blocks()
    assert outs == [{"torch": False, "collective": False}] * 2
