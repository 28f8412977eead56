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
    from rayflow.hpc.pool import warm_gangs

    warm_gangs.clear()  # no warm gang of an earlier test
    ds = BlockDataset.from_numpy(np.arange(4.0), 2)
    out = mpimap(_scale, ds, fn_args=(3.0,), rank_num_cpus=0.5)
    assert out.stage.gang_starts == 1
    warm_gangs.clear()  # the stage's gang, kept warm, is shut down now
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


def _pending_groups():
    import ray

    return [v for v in ray.util.placement_group_table().values() if v["state"] == "PENDING"]


@pytest.mark.parametrize("kwargs", [dict(rank_num_cpus=100), dict(strategy="STRICT_SPREAD")])
def test_gang_that_can_never_fit_the_local_ray_fails_at_once(ray_session, kwargs):
    """The embedded Ray never grows: no waiting for the timeout, and no group left behind."""
    import time

    t0 = time.monotonic()
    with pytest.raises(GangSchedulingError) as err:
        Gang(3, gang_timeout_s=600, **kwargs).start()
    assert time.monotonic() - t0 < 60  # far below the 600 s timeout
    cpu = 100.0 if "rank_num_cpus" in kwargs else 1.0
    strategy = kwargs.get("strategy", "PACK")
    assert f"asked for 3 bundles of {{'CPU': {cpu}}} (total CPU {3 * cpu:g}) with strategy " \
        f"{strategy}" in str(err.value)
    assert "can never be placed on the local Ray (1 node, 8 CPUs)" in str(err.value)
    assert "available" in str(err.value)
    assert not _pending_groups()


def test_gang_that_does_not_fit_now_times_out_with_a_clear_error(ray_session):
    """Fits the instance but not what is free (a group holds CPUs): the timeout path."""
    from ray.util.placement_group import placement_group, remove_placement_group

    holder = placement_group([{"CPU": 1}])
    assert holder.wait(60)
    try:
        with pytest.raises(GangSchedulingError, match=r"not placed within 0.5s: asked for 2 "
                           r"bundles of \{'CPU': 4.0\} \(total CPU 8\) with strategy PACK; "
                           r"cluster total .*available"):
            Gang(2, rank_num_cpus=4, gang_timeout_s=0.5).start()
    finally:
        remove_placement_group(holder)
    assert not _pending_groups()  # removed, not pending


def test_default_rank_cpus_shrink_to_fit_the_local_ray_but_explicit_ones_do_not(ray_session):
    from rayflow.hpc.gang import fit_rank_cpus

    assert fit_rank_cpus(16, 1.0, 8.0, explicit=False) == 0.5
    assert fit_rank_cpus(3, 1.0, 2.0, explicit=False) * 3 <= 2.0
    assert fit_rank_cpus(16, 1.0, 8.0, explicit=True) == 1.0
    assert fit_rank_cpus(4, 1.0, 8.0, explicit=False) == 1.0
    g = Gang(16)  # default rank_num_cpus: 16 CPUs asked of an 8-CPU local Ray
    g._fit_embedded()  # sizes the gang without starting 16 processes on 2 cores
    assert g.rank_num_cpus == 0.5 and g.bundle == {"CPU": 0.5}
    with pytest.raises(GangSchedulingError, match="can never be placed"):
        Gang(16, rank_num_cpus=1.0)._fit_embedded()


def _mismatch(comm, block):
    return comm.allreduce(np.ones(3 + comm.rank))


def _collect_rank(comm, block):
    return block + comm.allreduce(1)


def test_user_error_keeps_the_callers_gang(ray_session):
    ds = BlockDataset.from_numpy(np.arange(6.0), 3)
    with Gang(3, rank_num_cpus=0.25, gang_timeout_s=60) as g:
        with pytest.raises(KeyError, match="bad block"):
            mpimap(_boom, ds, gang=g)  # rank 0 and 2 wait in a barrier on rank 1
        with pytest.raises(ValueError, match=r"rank 0: an array of float64 \(3,\), rank 1: an "
                           r"array of float64 \(4,\), rank 2: an array of float64 \(5,\)"):
            mpimap(_mismatch, ds, gang=g)
        assert g.started and g.starts == 1
        out = mpimap(_collect_rank, ds, gang=g)
        assert out.stage.gang_starts == 0 and g.starts == 1
        np.testing.assert_array_equal(out.to_numpy(), np.arange(6.0) + 3)


def test_mismatched_inputs_are_rejected(ray_session):
    a = BlockDataset.from_numpy(np.arange(4.0), 2)
    b = BlockDataset.from_numpy(np.arange(6.0), 3)
    with pytest.raises(ValueError, match="blocks"):
        mpimap(_pair, a, b)
    with pytest.raises(ValueError, match="unknown backend"):
        Gang(2, backend="mpi")
