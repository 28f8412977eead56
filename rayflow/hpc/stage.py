"""MPI stages: run a rank function on a gang, one rank per block.

Usage: ``C = mpimap(lambda comm, a: a * comm.size, A)``

``mpimap(fn, *datasets)`` runs ``fn(comm, *blocks)`` on a gang of ``datasets[0].num_blocks``
ranks; rank ``r`` gets block ``r`` (row-major) of every dataset, resolved from the object
store without copies. The blocks ``fn`` returns become a new :class:`BlockDataset` on the same
grid. They are return values of the actor calls, so the driver owns them and they survive the
gang's teardown (an object ``ray.put`` inside the actor would die with it).

Recovery: if a rank dies (actor death, node loss), the stage runs again from the same input
refs; earlier stages are not recomputed because their outputs are driver-owned refs. With the
Ray-native backend only the dead ranks are replaced, in their own placement-group bundles: the
survivors' runs are aborted (a rank waiting on the dead peer is woken) and every rank joins a
new group. With gloo, whose blocked receives cannot be woken, the whole gang is replaced.

User exceptions are not retried: they would fail again. They are raised on the driver once
(every other return value holding the error is read, so Ray does not also log it as an
unhandled error), and a gang the caller passed stays usable for the next stage: with the
Ray-native backend the other ranks' runs are aborted; with gloo they get a few seconds to
end, and if some do not (blocked in a gloo receive), the gang is shut down and the error says
so.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from rayflow.config import HpcOptions, load_config
from rayflow.errors import RayflowError
from rayflow.hpc.dataset import BlockDataset
from rayflow.hpc.gang import Gang
from rayflow.hpc.pool import warm_gangs
from rayflow.metrics import StageExporter

_log = logging.getLogger(__name__)


class StageError(RayflowError):
    """A stage failed more often than its retries allow."""


@dataclass
class StageInfo:
    """What a stage did: attempts, failures and timings.

    Attributes:
        name: the stage name.
        size: number of ranks.
        attempts: how many times the stage ran (1 when nothing failed).
        failures: a short description of each failed attempt.
        gang_starts: gangs started for this stage (0 when it reused a started gang).
        ranks_replaced: rank actors started to replace dead ones (a whole gang counts all).
        wall_s: driver-side time from submission to the last rank's completion, all attempts.
        rank_wall_s: per-rank time inside the rank function, last attempt.
        rank_maxrss_bytes: per-rank peak RSS, last attempt.
    """

    name: str
    size: int
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
    gang_starts: int = 0
    ranks_replaced: int = 0
    wall_s: float = 0.0
    rank_wall_s: list[float] = field(default_factory=list)
    rank_maxrss_bytes: list[int] = field(default_factory=list)


def _wait_all(status_refs: list) -> list[dict]:
    """Wait for every rank; raise as soon as one fails (the others may be blocked on it)."""
    pending = list(status_refs)
    index = {r: i for i, r in enumerate(status_refs)}
    out: list[Any] = [None] * len(status_refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, fetch_local=False)
        for ref in ready:
            out[index[ref]] = ray.get(ref)
    return out


# How long the other gloo ranks may take to end after a rank raised, before the gang (whose
# blocked receives cannot be woken) is shut down.
_GLOO_SETTLE_S = 5.0


def _read_all(refs: list) -> None:
    """Read refs that may hold errors, so that Ray does not log them as unhandled."""
    for ref in refs:
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001 - the error is known; only reading it matters
            pass


def _end_failed_stage(g: Gang, stage_id: str, calls: list) -> str | None:
    """After a rank raised: end the other ranks' runs and keep the gang usable.

    Returns a note for the user's error when the gang could not be kept as it was.
    """
    if g.backend == "ray":
        dead = _stop_survivors(g, stage_id, calls)
        if not dead:
            return None
        g.repair(dead)
        _read_all([ref for r in dead for ref in calls[r]])  # killed by the repair: errors now
        return (f"rayflow: ranks {sorted(dead)} did not stop after the error and were "
                "replaced; the gang stays usable")
    status_refs = [c[0] for c in calls]
    _, running = ray.wait(status_refs, num_returns=len(status_refs), timeout=_GLOO_SETTLE_S,
                          fetch_local=False)
    stuck = sorted(status_refs.index(ref) for ref in running)
    if stuck:
        g.shutdown()
    _read_all([ref for c in calls for ref in c])
    if not stuck:
        return None
    return (f"rayflow: the gloo gang was shut down, since ranks {stuck} were still running "
            "(a rank blocked in a gloo receive cannot be woken); the next stage on it starts "
            "a new gang")


def _stop_survivors(g: Gang, stage_id: str, calls: list, timeout_s: float = 30.0) -> set[int]:
    """Abort the stage on every rank and wait for the runs to end; the ranks that are dead.

    A rank whose run does not end within ``timeout_s`` (stuck outside a receive) counts as
    dead, so it is replaced too.
    """
    for actor in g.actors:
        actor.abort.options(num_returns=0).remote(stage_id)
    status_refs = [c[0] for c in calls]
    done, stuck = ray.wait(status_refs, num_returns=len(status_refs), timeout=timeout_s,
                           fetch_local=False)
    dead = {status_refs.index(ref) for ref in stuck}
    for ref in done:
        r = status_refs.index(ref)
        try:
            ray.get(ref)
            continue  # this rank had finished: its outputs are fine (and unread)
        except RayActorError:
            dead.add(r)
        except Exception:  # noqa: BLE001 - aborted (StageAborted) or failed: the rank lives
            pass
        for out in calls[r][1:]:  # the call's other returns hold the same error: read them,
            try:  # or Ray logs each as an unhandled error
                ray.get(out)
            except Exception:  # noqa: BLE001
                pass
    return dead


def _add_note(err: BaseException, note: str) -> None:
    """``err.add_note(note)``, also on Python 3.10 (which has no ``add_note``)."""
    if hasattr(err, "add_note"):
        err.add_note(note)
    else:  # where 3.11 keeps notes; a 3.10 traceback does not print them
        err.__notes__ = [*getattr(err, "__notes__", ()), note]  # type: ignore[attr-defined]


def mpimap(
    fn: Callable[..., Any],
    *datasets: BlockDataset,
    num_outputs: int = 1,
    fn_args: tuple = (),
    fn_kwargs: dict | None = None,
    gang: Gang | None = None,
    backend: str | None = None,
    strategy: str | None = None,
    gang_timeout_s: float | None = None,
    rank_num_cpus: float | None = None,
    max_retries: int | None = None,
    name: str | None = None,
    options: HpcOptions | None = None,
) -> BlockDataset | tuple[BlockDataset, ...]:
    """Run ``fn(comm, *blocks, *fn_args, **fn_kwargs)`` as one gang-scheduled stage.

    Args:
        fn: the rank function; returns one block, or a tuple of ``num_outputs`` blocks.
        *datasets: the inputs, all with the same number of blocks (= ranks).
        num_outputs: how many blocks ``fn`` returns per rank.
        fn_args: extra positional arguments passed to every rank.
        fn_kwargs: extra keyword arguments passed to every rank.
        gang: a started (or startable) gang to reuse; by default a gang is started for the
            stage and shut down after it (one placement group per stage).
        backend, strategy, gang_timeout_s, rank_num_cpus: gang settings (defaults from config).
        max_retries: re-runs allowed after rank deaths (default ``hpc.max_stage_retries``).
        name: the stage name in errors and :class:`StageInfo`.
        options: HPC options supplying the defaults.

    Returns:
        One :class:`BlockDataset` per output (a tuple when ``num_outputs > 1``), with
        ``.stage`` holding the :class:`StageInfo`.

    Raises:
        GangSchedulingError: the gang could not be placed in time.
        StageError: ranks kept dying beyond ``max_retries``.
        ray.exceptions.RayTaskError: ``fn`` raised (not retried); it is also an instance of
            the exception ``fn`` raised. A ``gang`` passed in stays started.
    """
    if not datasets:
        raise ValueError("mpimap needs at least one dataset")
    size = datasets[0].num_blocks
    for ds in datasets[1:]:
        if ds.num_blocks != size:
            raise ValueError(f"datasets have {size} and {ds.num_blocks} blocks; ranks need one each")
    opts = options or load_config().hpc
    retries = opts.max_stage_retries if max_retries is None else max_retries
    info = StageInfo(str(name or getattr(fn, "__name__", "stage")), size)
    own_gang = gang is None
    g = gang or warm_gangs.acquire(Gang(size, backend=backend, strategy=strategy,
                                        gang_timeout_s=gang_timeout_s,
                                        rank_num_cpus=rank_num_cpus, options=opts))
    if g.size != size:
        raise ValueError(f"gang has {g.size} ranks, datasets have {size} blocks")
    fn_ref = ray.put(fn)  # serialised once, not once per rank
    ok = False
    t0 = time.perf_counter()
    try:
        while True:
            if not g.started:
                # inputs first: block-building tasks need CPUs that a placed gang would hold
                # (unique refs: the same dataset may come twice, as in A @ A)
                refs = list(dict.fromkeys(r for ds in datasets for r in ds.refs))
                ray.wait(refs, num_returns=len(refs), fetch_local=False)
                g.start()
                info.gang_starts += 1
            stage_id = uuid.uuid4().hex[:12]
            calls = [
                actor.run.options(num_returns=1 + num_outputs).remote(
                    stage_id, info.attempts, num_outputs, fn_ref, fn_args, fn_kwargs,
                    *[ds.refs[r] for ds in datasets],
                )
                for r, actor in enumerate(g.actors)
            ]
            info.attempts += 1
            try:
                statuses = _wait_all([c[0] for c in calls])
            except RayTaskError as err:
                if isinstance(err, RayActorError):  # some Ray versions combine the two
                    raise
                # the other ranks may wait forever on the one that raised: end their runs
                note = _end_failed_stage(g, stage_id, calls)
                if note is not None and not own_gang:
                    _add_note(err, note)
                raise
            except RayActorError as err:
                info.failures.append(f"attempt {info.attempts}: {type(err).__name__}")
                _log.info("stage %r lost a rank (attempt %d of at most %d): %s", info.name,
                          info.attempts, retries + 1, type(err).__name__)
                if info.attempts > retries:
                    g.shutdown()
                    raise StageError(
                        f"stage {info.name!r} lost a rank in {info.attempts} attempts "
                        f"(max_retries={retries}): {info.failures}"
                    ) from err
                if g.backend == "ray":
                    dead = _stop_survivors(g, stage_id, calls)
                    info.ranks_replaced += g.repair(dead)
                else:
                    g.shutdown()  # survivors may be blocked in a gloo recv: a new gang
                    info.ranks_replaced += g.size
                continue
            ok = True
            break
    finally:
        info.wall_s = time.perf_counter() - t0
        if own_gang:  # a warm gang for the next stage, unless this one failed
            warm_gangs.release(g, opts.warm_gang_idle_s if ok else 0)
    info.rank_wall_s = [s["wall_s"] for s in statuses]
    info.rank_maxrss_bytes = [s["maxrss_bytes"] for s in statuses]
    # Prometheus, through Ray's metrics: labelled by the driver's Ray job (a stage has no
    # job of its own), the stage name and the rank
    StageExporter(ray.get_runtime_context().get_job_id(), info.name).export(
        info.wall_s, info.attempts, info.rank_wall_s, info.rank_maxrss_bytes)
    grid = datasets[0].grid
    outs = tuple(
        BlockDataset(tuple(c[1 + k] for c in calls), grid, None, None, stage=info)
        for k in range(num_outputs)
    )
    return outs[0] if num_outputs == 1 else outs
