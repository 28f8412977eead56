"""Warm gangs: a stage without ``gang=`` reuses the gang of the previous one, for a while."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import ray

from rayflow.config import load_config
from rayflow.hpc import BlockDataset, mpimap
from rayflow.hpc.pool import warm_gangs


def _opts(idle_s):
    return load_config().hpc.model_copy(update={"warm_gang_idle_s": idle_s})


@pytest.fixture
def pool(ray_session):
    warm_gangs.clear()
    yield warm_gangs
    warm_gangs.clear()


def _whoami(comm, block):
    return np.array([os.getpid(), comm.allreduce(block.sum())])


def test_next_stage_reuses_the_warm_gang_of_the_same_shape(pool):
    ds = BlockDataset.from_numpy(np.arange(4.0), 2)
    first = mpimap(_whoami, ds, rank_num_cpus=0.25, options=_opts(60))
    t0 = time.perf_counter()
    second = mpimap(_whoami, ds, rank_num_cpus=0.25, options=_opts(60))
    warm_s = time.perf_counter() - t0
    other = mpimap(_whoami, ds, rank_num_cpus=0.5, options=_opts(60))  # another shape
    a, b, c = (o.to_numpy().reshape(2, 2) for o in (first, second, other))
    assert first.stage.gang_starts == 1 and second.stage.gang_starts == 0
    assert other.stage.gang_starts == 1
    np.testing.assert_array_equal(a[:, 0], b[:, 0])  # the same rank processes
    assert set(c[:, 0]).isdisjoint(a[:, 0])
    np.testing.assert_array_equal(b[:, 1], [6.0, 6.0])
    assert len(pool.idle()) == 2
    print(f"stage on a warm gang: {warm_s * 1e3:.1f} ms")


@pytest.mark.slow
def test_an_idle_gang_goes_after_its_timeout_and_a_failed_one_at_once(pool):
    ds = BlockDataset.from_numpy(np.arange(4.0), 2)
    mpimap(_whoami, ds, rank_num_cpus=0.25, options=_opts(0.5))
    (g,) = pool.idle()
    deadline = time.monotonic() + 20
    while pool.idle() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.idle() == [] and not g.started and g._pg is None  # placement group removed

    def boom(comm, block):
        raise KeyError("bad block")

    with pytest.raises(ray.exceptions.RayTaskError, match="bad block"):
        mpimap(boom, ds, rank_num_cpus=0.25, options=_opts(60))
    assert pool.idle() == []
    mpimap(_whoami, ds, rank_num_cpus=0.25, options=_opts(0))  # 0: no pooling
    assert pool.idle() == []


@pytest.mark.slow  # two gangs of 2-CPU ranks start
def test_idle_gangs_make_room_for_a_gang_that_needs_their_cpus(pool):
    ds2 = BlockDataset.from_numpy(np.arange(4.0), 2)
    mpimap(_whoami, ds2, rank_num_cpus=2.0, options=_opts(60))
    (held,) = pool.idle()
    free = ray.available_resources().get("CPU", 0.0)
    size = int(free // 2) + 1  # does not fit beside the idle gang, fits without it
    if size * 2 > free + 4:
        pytest.skip(f"only {free} CPUs free")
    ds = BlockDataset.from_numpy(np.arange(float(size)), size)
    out = mpimap(_whoami, ds, rank_num_cpus=2.0, gang_timeout_s=20, options=_opts(60))
    assert not held.started  # shut down to make room
    assert out.stage.gang_starts == 1
    np.testing.assert_array_equal(out.to_numpy().reshape(size, 2)[:, 1],
                                  [size * (size - 1) / 2] * size)
