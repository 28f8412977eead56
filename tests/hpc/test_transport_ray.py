"""Direct channels in real gangs: shared memory between rank actors, released on repair and
shutdown (nothing named in /dev/shm, no process left mapping a group's memory)."""

from __future__ import annotations

import glob
import os
import time

import numpy as np
import pytest
import ray

from rayflow.hpc import BlockDataset, Gang, mpimap
from rayflow.hpc.backends import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="shared-memory rings need x86-64 Linux")


def _maps_of(pid: int | str) -> list[str]:
    """The rayflow shared-memory files process ``pid`` maps (memfd names, deduplicated)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return sorted({ln.split("memfd:")[1].split(" ")[0] for ln in f if "memfd:rayflow-" in ln})
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def _mappers_of(group_prefix: str) -> list[int]:
    """Every live process that maps a file of the groups named ``group_prefix...``."""
    pids = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(d.rsplit("/", 1)[1])
        if any(name.startswith(group_prefix) for name in _maps_of(pid)):
            pids.append(pid)
    return pids


def _rayflow_shm_files() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if "rayflow" in f}


def _probe(comm, block):
    x = np.full(4, comm.rank + 1.0)
    total = comm.allreduce(x)
    big = comm.bcast(np.arange(200_000.0) if comm.rank == 0 else None)  # a segment
    return {"pid": os.getpid(), "kinds": comm._t.kinds, "sum": total, "big_ok": bool(
        (big == np.arange(200_000.0)).all()), "maps": _maps_of("self")}


def test_ranks_on_one_node_talk_through_shared_memory(gang4):
    outs = mpimap(_probe, BlockDataset.from_numpy(np.zeros(4), 4), gang=gang4).blocks()
    for r, o in enumerate(outs):
        assert o["kinds"] == [None if d == r else "shm" for d in range(4)]
        np.testing.assert_array_equal(o["sum"], np.full(4, 10.0))
        assert o["big_ok"]
        # for this gang's group: its three inbound rings, the three peers' rings it writes
        # into (a long-lived rank may also still map the rings of a group of another test)
        groups = {m.split("-from")[0] for m in o["maps"] if "-from" in m}
        assert any(
            len([m for m in o["maps"] if m.startswith(g + "-from") and m.endswith(f"-to{r}")])
            == 3 and len([m for m in o["maps"] if m.startswith(f"{g}-from{r}-")]) == 3
            for g in groups), o["maps"]


def _unread_then_maybe_die(comm, block):
    # a 2 MiB message nobody receives: its segment must still go when the gang does
    if comm.rank == 0:
        comm.send(np.ones(262_144), 1, tag=7)
    comm.barrier()
    if comm.attempt == 0 and comm.rank == 1:
        ray.kill(ray.get_runtime_context().current_actor)
        time.sleep(60)
    comm.barrier()
    return {"pid": os.getpid(), "maps": _maps_of("self")}


def test_channels_are_released_on_repair_and_shutdown(ray_session):
    before = _rayflow_shm_files()
    with Gang(2, rank_num_cpus=0.25, gang_timeout_s=60) as gang:
        out = mpimap(_unread_then_maybe_die, BlockDataset.from_numpy(np.zeros(2), 2), gang=gang)
        assert out.stage.attempts == 2 and out.stage.ranks_replaced == 1
        blocks = out.blocks()
        survivor, newcomer = blocks[0], blocks[1]
        groups = {m.split("-from")[0].split("-seg")[0] for b in blocks for m in b["maps"]}
        # the survivor closed the first group's channels when it joined the second
        assert len(groups) == 1, blocks
        assert survivor["maps"] and newcomer["maps"]
        # the unread message's segment, mapped by its receiver when it read the ring
        assert any(m.endswith("-seg0-to1") for m in newcomer["maps"])
        group = groups.pop()
        assert _mappers_of(group) == sorted([survivor["pid"], newcomer["pid"]])
    deadline = time.monotonic() + 30
    while _mappers_of(group) and time.monotonic() < deadline:  # killed actors exit shortly
        time.sleep(0.2)
    assert _mappers_of(group) == []
    assert _mappers_of("rayflow-rf-") == [] or all(
        # other live gangs of this session (the shared fixtures) may hold their own groups
        not any(m.startswith(group) for m in _maps_of(p)) for p in _mappers_of("rayflow-rf-"))
    assert _rayflow_shm_files() == before == set()
