"""A rank killed mid-stage: the stage re-runs from driver-owned inputs, CG from a checkpoint."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from rayflow.hpc import BlockDataset, Gang, StageError, cg_solve, mpimap


@ray.remote(num_cpus=0)
class Counter:
    def __init__(self):
        self.counts = {}

    def hit(self, key):
        self.counts[key] = self.counts.get(key, 0) + 1

    def get(self):
        return self.counts


def _kill_self():
    """Inject the failure with ray.kill, as an operator would, from inside the rank."""
    ray.kill(ray.get_runtime_context().current_actor)
    time.sleep(60)  # never returns: the kill lands first


def _first(comm, block, counter):
    ray.get(counter.hit.remote(f"first:{comm.attempt}"))
    return block + 1.0


def _second(comm, block, counter, kill_on):
    ray.get(counter.hit.remote(f"second:{comm.attempt}"))
    total = comm.allreduce(block.sum())
    if comm.attempt in kill_on and comm.rank == 1:
        _kill_self()
    comm.barrier()
    return block * 0 + total


def test_killed_rank_reruns_only_its_stage(ray_session):
    counter = Counter.remote()
    ds = BlockDataset.from_numpy(np.arange(4.0), 2)
    with Gang(2, rank_num_cpus=0.5) as gang:
        s1 = mpimap(_first, ds, fn_args=(counter,), gang=gang)
        before = [a._actor_id for a in gang.actors]
        s2 = mpimap(_second, s1, fn_args=(counter, {0}), gang=gang)
        after = [a._actor_id for a in gang.actors]
        assert gang.starts == 1  # the gang was repaired, not replaced
        assert after[0] == before[0] and after[1] != before[1]
    np.testing.assert_array_equal(s2.to_numpy(), np.full(4, 10.0))
    counts = ray.get(counter.get.remote())
    assert counts == {"first:0": 2, "second:0": 2, "second:1": 2}  # stage 1 not recomputed
    assert s1.stage.attempts == 1
    assert s2.stage.attempts == 2 and s2.stage.gang_starts == 0
    assert s2.stage.ranks_replaced == 1  # only the killed rank; rank 0 (blocked) was reused
    assert "ActorDiedError" in s2.stage.failures[0] or "RayActorError" in s2.stage.failures[0]


def test_gloo_gang_is_replaced_whole_after_a_death(ray_session):
    """A survivor blocked in a gloo receive cannot be woken: the whole gang is replaced."""
    pytest.importorskip("torch")
    counter = Counter.remote()
    ds = BlockDataset.from_numpy(np.arange(4.0), 2)
    with Gang(2, backend="gloo", rank_num_cpus=0.5) as gang:
        out = mpimap(_second, ds, fn_args=(counter, {0}), gang=gang)
        assert gang.starts == 2
    np.testing.assert_array_equal(out.to_numpy(), np.full(4, 6.0))
    assert out.stage.attempts == 2 and out.stage.ranks_replaced == 2
    assert ray.get(counter.get.remote()) == {"second:0": 2, "second:1": 2}


@pytest.mark.slow
def test_retries_are_bounded(ray_session):
    counter = Counter.remote()
    ds = BlockDataset.from_numpy(np.arange(4.0), 2)
    with pytest.raises(StageError, match="lost a rank in 1 attempts"):
        mpimap(_second, ds, fn_args=(counter, {0}), rank_num_cpus=0.5, max_retries=0)


def _kill_at(k_fail):
    def hook(comm, k):
        if comm.attempt == 0 and comm.rank == 1 and k == k_fail:
            _kill_self()

    return hook


def _spd(n, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    return m @ m.T + 5 * np.eye(n), rng.standard_normal(n)


@pytest.mark.parametrize(
    "every,resume", [(4, 8), pytest.param(0, 0, marks=pytest.mark.slow)]
)
def test_cg_resumes_from_checkpoint(ray_session, every, resume):
    a, b = _spd(40, seed=1)
    res = cg_solve(a, b, ranks=2, tol=1e-10, checkpoint_every=every, on_iteration=_kill_at(10),
                   rank_num_cpus=0.5)
    np.testing.assert_allclose(res.x, np.linalg.solve(a, b), rtol=1e-7, atol=1e-9)
    assert res.stage.attempts == 2
    assert res.resumed_from == resume  # newest iteration all ranks saved before the kill
    assert res.iterations_run == res.iterations - resume
    assert len(res.history) == res.iterations + 1
