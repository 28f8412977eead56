"""Gangs: one placement group and one rank actor per rank, all placed or none.

Usage: ``with Gang(4, strategy="SPREAD") as g: out = mpimap(fn, ds, gang=g)``

A gang that cannot be placed never fails by itself in Ray: its placement group stays pending
forever (RAY_NOTES). :meth:`Gang.start` therefore waits at most ``gang_timeout_s``, then
removes the group and raises :class:`~rayflow.errors.GangSchedulingError` naming the bundles
it asked for and what the cluster had free.
"""

from __future__ import annotations

import resource
import time
import uuid
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rayflow.config import HpcOptions, load_config
from rayflow.errors import GangSchedulingError
from rayflow.hpc.comm import Communicator
from rayflow.hpc.ray_backend import (
    MailboxHost,
    RayTransport,
    create_rendezvous,
    join_group,
    set_local_host,
)

# Rank actors run the rank function in their default group (one thread) and take deliveries
# in a separate pool, so a rank blocked in recv still receives.
_MAIL_THREADS = 4


@ray.remote(concurrency_groups={"mail": _MAIL_THREADS})
class RankActor(MailboxHost):
    """Hosts one rank: its mailbox, its communicator and the rank function's runs."""

    def __init__(self, blas_threads: int | None):
        set_local_host(self)
        self._limits = None
        if blas_threads:
            try:  # threadpoolctl is an optional (bench/dev) dependency
                from threadpoolctl import threadpool_limits

                self._limits = threadpool_limits(limits=blas_threads, user_api="blas")
            except ImportError:
                pass
        self._transport: Any = None
        self._native: Any = None

    @ray.method(concurrency_group="mail")
    def _rf_deliver(self, stage: str, src: int, key: tuple, obj: Any) -> None:
        self._rf_mailbox().put(stage, src, key, obj)

    @ray.method(concurrency_group="mail")
    def abort(self, stage: str) -> None:
        """Wake this rank's run of ``stage`` if it waits on a message (a peer died)."""
        self._rf_mailbox().abort(stage)

    def setup(self, world_size: int, rank: int, group_name: str, backend: str) -> str:
        """Join the collective group; returns the node id (for placement checks)."""
        self.rank, self.world_size = rank, world_size
        if backend == "gloo":
            from ray.util import collective

            from rayflow.hpc.gloo_backend import GlooNative, GlooTransport

            collective.init_collective_group(world_size, rank, backend="gloo",
                                             group_name=group_name)
            self._transport = GlooTransport(rank, world_size)
            self._native = GlooNative(collective, group_name, self._transport)
        else:
            # not through ray.util.collective: importing it imports torch (+197 MB per rank)
            self._transport = join_group(world_size, rank, group_name)
        return ray.get_runtime_context().get_node_id()

    def run(self, stage: str, attempt: int, num_outputs: int, fn, fn_args, fn_kwargs, *blocks):
        """Run ``fn(comm, *blocks, *fn_args, **fn_kwargs)``; return status then the outputs."""
        if isinstance(self._transport, RayTransport):
            self._rf_mailbox().forget_other_stages(stage)
            transport = self._transport.for_stage(stage)
        else:
            transport = self._transport
        comm = Communicator(transport, context=("world",), native=self._native, attempt=attempt)
        t0 = time.perf_counter()
        out = fn(comm, *blocks, *fn_args, **(fn_kwargs or {}))
        wall = time.perf_counter() - t0
        if num_outputs == 1:
            outs: tuple = (out,)
        else:
            outs = tuple(out)
            if len(outs) != num_outputs:
                raise ValueError(f"rank function returned {len(outs)} values, expected {num_outputs}")
        status = {
            "rank": comm.rank,
            "wall_s": wall,
            "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        return (status, *outs)

    def ping(self) -> int:
        return self.rank


class Gang:
    """A placement group of ``size`` bundles and the rank actors placed in it.

    Args:
        size: number of ranks.
        backend: ``"ray"`` (Ray-native, default) or ``"gloo"`` (needs torch).
        strategy: placement strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD.
        gang_timeout_s: how long to wait for the whole gang to be placed.
        rank_num_cpus: CPUs reserved per rank.
        blas_threads: BLAS threads per rank (threadpoolctl); ``None`` leaves the default.
        options: the :class:`~rayflow.config.HpcOptions` supplying unset arguments.
    """

    def __init__(
        self,
        size: int,
        *,
        backend: str | None = None,
        strategy: str | None = None,
        gang_timeout_s: float | None = None,
        rank_num_cpus: float | None = None,
        blas_threads: int | None = 1,
        options: HpcOptions | None = None,
    ):
        if size < 1:
            raise ValueError(f"a gang needs at least one rank, got {size}")
        opts = options or load_config().hpc
        self.size = size
        self.backend = backend or opts.backend
        if self.backend not in ("ray", "gloo"):
            raise ValueError(f"unknown backend {self.backend!r}; use 'ray' or 'gloo'")
        self.strategy = strategy or opts.strategy
        self.gang_timeout_s = gang_timeout_s if gang_timeout_s is not None else opts.gang_timeout_s
        cpus = rank_num_cpus if rank_num_cpus is not None else opts.rank_num_cpus
        # A bundle must ask for something; a token CPU fraction keeps "0 CPUs" placeable.
        self.bundle = {"CPU": float(cpus) if cpus > 0 else 0.001}
        self._num_cpus = float(cpus)
        self.blas_threads = blas_threads
        self.actors: list[Any] = []
        self.node_ids: list[str] = []
        self.starts = 0
        self._pg = None
        self._rdv = None

    def __enter__(self) -> Gang:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def started(self) -> bool:
        return bool(self.actors)

    def start(self) -> Gang:
        """Place the gang and start its ranks, or raise GangSchedulingError."""
        if self.started:
            return self
        if self.backend == "gloo":
            from rayflow.hpc.gloo_backend import gloo_available

            if not gloo_available():
                raise RuntimeError("the gloo backend needs torch: pip install 'rayflow[gloo]'")
        bundles = [dict(self.bundle) for _ in range(self.size)]
        pg = placement_group(bundles, strategy=self.strategy)
        if not pg.wait(timeout_seconds=self.gang_timeout_s):
            remove_placement_group(pg)
            raise GangSchedulingError(
                f"gang of {self.size} ranks not placed within {self.gang_timeout_s:g}s: asked for "
                f"{self.size} bundles of {self.bundle} (total CPU "
                f"{self.size * self.bundle['CPU']:g}) with strategy {self.strategy}; cluster "
                f"total {ray.cluster_resources()}, available {ray.available_resources()}"
            )
        self._pg = pg
        self.actors = [self._new_rank(pg, r) for r in range(self.size)]
        try:
            self._join_all()
        except Exception:
            self.shutdown()
            raise
        self.starts += 1
        return self

    def repair(self, dead: set[int]) -> int:
        """Replace the ranks in ``dead`` in their own bundles; the survivors stay.

        The survivors must be idle (their runs returned or were aborted). Every rank then joins
        a new group, so the survivors learn the new peers. Only the Ray-native backend can do
        this (a survivor blocked in a gloo recv cannot be woken, and gloo's world cannot take a
        new member), and only while the placement group holds the dead ranks' bundles; in any
        other case, or if the repair fails, the whole gang is replaced. Returns how many rank
        actors were started.
        """
        if self.backend != "ray" or self._pg is None:  # not started: restart() starts it
            self.restart()
            return self.size
        try:
            for r in sorted(dead):
                ray.kill(self.actors[r], no_restart=True)
                self.actors[r] = self._new_rank(self._pg, r)
            self._join_all()
        except Exception:  # noqa: BLE001 - e.g. a lost node's bundle: fall back to a new gang
            self.restart()
            return self.size
        return len(dead)

    def _new_rank(self, pg: Any, r: int) -> Any:
        return RankActor.options(
            num_cpus=self._num_cpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=r
            ),
        ).remote(self.blas_threads)

    def _join_all(self) -> None:
        """Every rank joins a new group (a new rendezvous for the Ray-native backend)."""
        group = f"rf-{uuid.uuid4().hex[:10]}"
        if self.backend == "ray":
            if self._rdv is not None:
                ray.kill(self._rdv, no_restart=True)
            self._rdv = create_rendezvous(group, self.size)
        self.node_ids = ray.get(
            [a.setup.remote(self.size, r, group, self.backend) for r, a in enumerate(self.actors)],
            timeout=self.gang_timeout_s + 60,
        )

    def restart(self) -> Gang:
        """Replace every rank (after a failure, the survivors may be stuck in recv)."""
        self.shutdown()
        return self.start()

    def shutdown(self) -> None:
        """Kill the ranks and release the placement group (the stage outputs survive)."""
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
        if self._rdv is not None:
            ray.kill(self._rdv, no_restart=True)
            self._rdv = None
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None
