"""Gangs: one placement group and one rank actor per rank, all placed or none.

Usage: ``with Gang(4, strategy="SPREAD") as g: out = mpimap(fn, ds, gang=g)``

A gang that cannot be placed never fails by itself in Ray: its placement group stays pending
forever. :meth:`Gang.start` therefore waits at most ``gang_timeout_s``, then removes the group
and raises :class:`~rayflow.errors.GangSchedulingError` naming the bundles it asked for and
what the cluster had free.

On the embedded local Ray (started by :func:`rayflow.init` or by the first stage), nothing
will ever be added, so a gang is sized to it: with the default ``rank_num_cpus`` a gang of
more ranks than the instance has CPUs gives each rank ``CPUs / ranks`` (the ranks then share
cores, as MPI ranks oversubscribing a laptop do), and a gang that can never fit (an explicit
``rank_num_cpus`` too large, STRICT_SPREAD over one node) fails at once instead of after the
timeout. On a cluster given by address the request is taken as it is: an autoscaler may
still add the nodes it needs.
"""

from __future__ import annotations

import logging
import math
import resource
import time
import uuid
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rayflow.config import HpcOptions, load_config
from rayflow.errors import GangSchedulingError
from rayflow.hpc.backends.ray_backend import (
    DirectTransport,
    MailboxHost,
    create_rendezvous,
    join_group,
    set_local_host,
)
from rayflow.hpc.blas import limit_blas_threads
from rayflow.hpc.comm import Communicator

_log = logging.getLogger(__name__)

# Ray accounts fractional resources in steps of 1e-4 CPU: a fitted share is rounded down to
# one, so that ``size`` shares never add up to more than the instance has.
_CPU_STEPS_PER_CPU = 10_000
_CPU_STEP = 1 / _CPU_STEPS_PER_CPU


def fit_rank_cpus(size: int, requested: float, total_cpus: float, explicit: bool) -> float:
    """CPUs per rank for a gang of ``size`` on a Ray with ``total_cpus`` that will not grow.

    A default request (not ``explicit``) that does not fit is lowered to an equal share of
    ``total_cpus``; an explicit one is kept (the caller then decides it cannot fit).

    >>> fit_rank_cpus(4, 1.0, 2.0, explicit=False)
    0.5
    >>> fit_rank_cpus(3, 1.0, 2.0, explicit=False)
    0.6666
    >>> fit_rank_cpus(4, 1.0, 2.0, explicit=True), fit_rank_cpus(2, 1.0, 2.0, explicit=False)
    (1.0, 1.0)
    """
    if explicit or total_cpus <= 0 or size * requested <= total_cpus:
        return requested
    return math.floor(total_cpus * _CPU_STEPS_PER_CPU / size) / _CPU_STEPS_PER_CPU


def spawned_rank_cpus(size: int) -> float | None:
    """CPUs per rank of a gang of ``size`` that a rank (a Ray actor) starts for itself
    (mpi4py's spawned processes): the starting rank's own CPUs each, or an equal share of
    the free CPUs where they do not fit (MPI would oversubscribe the cores). None outside
    an actor (the gang's own default applies)."""
    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    if ctx.get_actor_id() is None:  # the driver
        return None
    cpus = ctx.get_assigned_resources().get("CPU")
    if cpus is None:
        return None
    return fit_rank_cpus(size, cpus, float(ray.available_resources().get("CPU", 0.0)), False)


# Rank actors run the rank function in their default group (one thread) and take deliveries
# in a separate pool, so a rank blocked in recv still receives.
_MAIL_THREADS = 4


# (Ray's overloads of remote() omit concurrency_groups)
@ray.remote(concurrency_groups={"mail": _MAIL_THREADS})  # type: ignore[call-overload]
class RankActor(MailboxHost):
    """Hosts one rank: its mailbox, its communicator and the rank function's runs."""

    def __init__(self, blas_threads: int | None):
        set_local_host(self)
        self._limits = limit_blas_threads(blas_threads)
        self._transport: Any = None
        self._native: Any = None
        self._check_roots = False  # hpc.check_collectives, set by setup()

    @ray.method(concurrency_group="mail")
    def _rf_deliver(self, stage: str, src: int, key: tuple, obj: Any) -> None:
        self._rf_mailbox().put(stage, src, key, obj)

    @ray.method(concurrency_group="mail")
    def abort(self, stage: str) -> None:
        """Wake this rank's run of ``stage`` if it waits on a message (a peer died)."""
        self._rf_mailbox().abort(stage)

    def setup(self, world_size: int, rank: int, group_name: str, backend: str,
              check_roots: bool = False) -> str:
        """Join the collective group; returns the node id (for placement checks)."""
        self.rank, self.world_size = rank, world_size
        self._check_roots = check_roots
        if backend == "gloo":
            from ray.util import collective

            from rayflow.hpc.backends.gloo_backend import GlooNative, GlooTransport

            collective.init_collective_group(world_size, rank,  # (Ray's stub wants its enum)
                                             backend="gloo",  # type: ignore[arg-type]
                                             group_name=group_name)
            self._transport = GlooTransport(rank, world_size)
            self._native = GlooNative(collective, group_name, self._transport)
        else:
            # not through ray.util.collective: importing it imports torch (+197 MB per rank)
            if isinstance(self._transport, DirectTransport):
                self._transport.close()  # a survivor of a repair: the old group's channels
            self._transport = join_group(world_size, rank, group_name)
        return ray.get_runtime_context().get_node_id()

    def run(self, stage: str, attempt: int, num_outputs: int, fn, fn_args, fn_kwargs, *blocks):
        """Run ``fn(comm, *blocks, *fn_args, **fn_kwargs)``; return status then the outputs."""
        if isinstance(self._transport, DirectTransport):
            self._rf_mailbox().forget_other_stages(stage)
        transport = self._transport.for_stage(stage)
        comm = Communicator(transport, context=("world",), native=self._native, attempt=attempt,
                            check_roots=self._check_roots)
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


class Gang:
    """A placement group of ``size`` bundles and the rank actors placed in it.

    Args:
        size: number of ranks.
        backend: ``"ray"`` (Ray-native, default) or ``"gloo"`` (needs torch).
        strategy: placement strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD.
        gang_timeout_s: how long to wait for the whole gang to be placed.
        rank_num_cpus: CPUs reserved per rank (default ``hpc.rank_num_cpus``, 1; on the
            embedded local Ray a default that does not fit becomes an equal share).
        blas_threads: BLAS threads per rank, numpy's and scipy's BLAS alike
            (:func:`~rayflow.hpc.blas.limit_blas_threads`); ``None`` leaves the default.
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
        self.check_collectives = opts.check_collectives
        self.gang_timeout_s = gang_timeout_s if gang_timeout_s is not None else opts.gang_timeout_s
        cpus = rank_num_cpus if rank_num_cpus is not None else opts.rank_num_cpus
        if cpus < 0:
            raise ValueError(f"rank_num_cpus must be >= 0, got {cpus}")
        # explicit: the caller (or the configuration) chose it, so it is never lowered
        self._explicit_cpus = rank_num_cpus is not None or "rank_num_cpus" in opts.model_fields_set
        self._requested_cpus = float(cpus)
        self._set_cpus(float(cpus))
        if ray.is_initialized():  # sized now, so that a gang can be compared with a started one
            self._fit_embedded(check=False)
        self.blas_threads = blas_threads
        self.actors: list[Any] = []
        self.node_ids: list[str] = []
        self.starts = 0
        self._pg = None
        self._rdv = None

    def _set_cpus(self, cpus: float) -> None:
        self.rank_num_cpus = cpus
        # A bundle must ask for something; a token CPU fraction keeps "0 CPUs" placeable.
        self.bundle = {"CPU": cpus if cpus > 0 else 0.001}
        self._num_cpus = cpus

    def _asked(self) -> str:
        return (f"{self.size} bundles of {self.bundle} (total CPU "
                f"{self.size * self.bundle['CPU']:g}) with strategy {self.strategy}")

    def _fit_embedded(self, check: bool = True) -> None:
        """Size the gang to the embedded local Ray, and (``check``) fail at once if it can
        never fit."""
        from rayflow._raycontext import is_embedded

        if not is_embedded():
            return
        total = ray.cluster_resources()
        total_cpus = float(total.get("CPU", 0.0))
        cpus = fit_rank_cpus(self.size, self._requested_cpus, total_cpus, self._explicit_cpus)
        if cpus != self.rank_num_cpus:
            _log.info("gang of %d ranks on the local Ray with %g CPUs: %g CPU per rank "
                      "(ranks share cores)", self.size, total_cpus, cpus)
        self._set_cpus(cpus)
        if not check:
            return
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        never = self.size * self.bundle["CPU"] > total_cpus + _CPU_STEP / 2
        if self.strategy == "STRICT_SPREAD" and self.size > nodes:
            never = True
        if never:
            raise GangSchedulingError(
                f"gang of {self.size} ranks can never be placed on the local Ray ({nodes} "
                f"node, {total_cpus:g} CPUs): asked for {self._asked()}; cluster total "
                f"{total}, available {ray.available_resources()}. Lower rank_num_cpus, or "
                "start Ray with more CPUs: rayflow.init(num_cpus=...)"
            )

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
        from rayflow._raycontext import ensure_ray_default

        ensure_ray_default()
        self._fit_embedded()
        if self.backend == "gloo":
            from rayflow.hpc.backends.gloo_backend import gloo_available

            if not gloo_available():
                raise RuntimeError("the gloo backend needs torch: pip install -e '.[gloo]' (from the checkout)")
        bundles = [dict(self.bundle) for _ in range(self.size)]
        pg = placement_group(bundles, strategy=self.strategy)
        if not pg.wait(timeout_seconds=self.gang_timeout_s):
            remove_placement_group(pg)
            raise GangSchedulingError(
                f"gang of {self.size} ranks not placed within {self.gang_timeout_s:g}s: asked for "
                f"{self._asked()}; cluster total {ray.cluster_resources()}, available "
                f"{ray.available_resources()}"
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
        return RankActor.options(  # type: ignore[attr-defined]  # (added by ray.remote)
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
            [a.setup.remote(self.size, r, group, self.backend, self.check_collectives)
             for r, a in enumerate(self.actors)],
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
