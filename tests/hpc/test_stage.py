"""Block datasets, mpimap stages and gangs on a local Ray."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from rayflow.errors import GangSchedulingError
from rayflow.hpc import BlockDataset, Gang, mpimap


def _gen(i, j, rows, cols):
    r = np.arange(rows.start, rows.stop)[:, None]
    c = np.arange(cols.start, cols.stop)[None, :]
    return (r * 100 + c).astype(np.float64)


def test_dataset_roundtrips(ray_session):
    a = np.arange(70.0).reshape(7, 10)
    ds = BlockDataset.from_numpy(a, (3, 2))
    assert ds.grid == (3, 2) and ds.row_sizes == (3, 2, 2) and ds.col_sizes == (5, 5)
    assert ds.shape == (7, 10)
    np.testing.assert_array_equal(ds.to_numpy(), a)
    v = np.arange(5.0)
    np.testing.assert_array_equal(BlockDataset.from_numpy(v, 2).to_numpy(), v)
    s = sp.random(9, 9, density=0.3, random_state=0, format="csr")
    got = BlockDataset.from_numpy(s, (3, 1)).to_numpy()
    assert sp.issparse(got) and (got != s).nnz == 0


def test_from_function_builds_blocks_remotely(ray_session):
    ds = BlockDataset.from_function(_gen, (5, 7), (2, 2), dtype=np.float32)
    full = ds.to_numpy()
    assert full.dtype == np.float32
    np.testing.assert_array_equal(full, _gen(0, 0, slice(0, 5), slice(0, 7)))


def _scale(comm, block, factor):
    return block * factor + comm.rank


def _pair(comm, a, b):
    return a + b, np.array([comm.size])


def test_mpimap_chains_on_a_reused_gang(gang4):
    a = np.arange(16.0).reshape(4, 4)
    ds = BlockDataset.from_numpy(a, (2, 2))
    s1 = mpimap(_scale, ds, fn_args=(2.0,), gang=gang4)
    s2, sizes = mpimap(_pair, s1, ds, num_outputs=2, gang=gang4)
    rank_of = np.repeat(np.repeat(np.arange(4).reshape(2, 2), 2, 0), 2, 1)
    np.testing.assert_array_equal(s1.to_numpy(), a * 2 + rank_of)
    np.testing.assert_array_equal(s2.to_numpy(), a * 3 + rank_of)
    assert [b.item() for b in sizes.blocks()] == [4] * 4
    assert s2.stage.attempts == 1 and s2.stage.gang_starts == 0 and len(s2.stage.rank_wall_s) == 4


def test_outputs_outlive_their_own_gang(ray_session):
    ds = BlockDataset.from_numpy(np.arange(4.0), 2)
    out = mpimap(_scale, ds, fn_args=(3.0,), rank_num_cpus=0.5)  # gang started and removed
    assert out.stage.gang_starts == 1
    np.testing.assert_array_equal(out.to_numpy(), np.array([0.0, 3.0, 7.0, 10.0]))


def _boom(comm, block):
    if comm.rank == 1:
        raise KeyError("bad block")
    comm.barrier()  # rank 0 would wait forever: the driver must not
    return block


def test_user_error_is_raised_not_retried(ray_session):
    ds = BlockDataset.from_numpy(np.arange(4.0), 2)
    with pytest.raises(KeyError, match="bad block"):
        mpimap(_boom, ds, rank_num_cpus=0.5, max_retries=3)


def test_gang_that_cannot_fit_times_out_with_a_clear_error(ray_session):
    import ray

    before = len(ray.util.placement_group_table())
    with pytest.raises(GangSchedulingError, match=r"3 bundles of \{'CPU': 100.0\}.*STRICT_SPREAD"):
        Gang(3, rank_num_cpus=100, strategy="STRICT_SPREAD", gang_timeout_s=0.5).start()
    table = ray.util.placement_group_table()
    assert len(table) == before + 1
    assert [v["state"] for v in table.values()].count("PENDING") == 0  # removed, not pending


def test_mismatched_inputs_are_rejected(ray_session):
    a = BlockDataset.from_numpy(np.arange(4.0), 2)
    b = BlockDataset.from_numpy(np.arange(6.0), 3)
    with pytest.raises(ValueError, match="blocks"):
        mpimap(_pair, a, b)
    with pytest.raises(ValueError, match="unknown backend"):
        Gang(2, backend="mpi")
