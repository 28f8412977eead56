"""The Ray-native collective backend: ranks meet through Ray, then talk directly. No torch.

Usage: ``create_rendezvous(g, n)`` in the driver, then ``join_group(n, rank, g)`` in each rank

A group's ranks find each other once, through a small named rendezvous actor: each tells the
others its node and process, opens the receiving half of its channels and publishes their
addresses, then connects to every peer (:mod:`rayflow.hpc.backends.channels`). From then on a message
is a write into a shared-memory ring (same node) or a ZeroMQ TCP frame (other nodes); no
actor call, no object store. The previous design sent every message as an actor call to the
peer's mailbox method (about 0.9 ms each here, two per small allreduce).

:mod:`rayflow.hpc.ray_collective` registers the same backend with ``ray.util.collective``
(``RAYFLOW``); rayflow's own gangs join without that module, because importing
``ray.util.collective`` imports torch when it is installed (measured: a rank's USS went from
61 to 258 MB).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

from rayflow.hpc.backends.channels import (
    DirectTransport,
    Endpoint,
    Mailbox,
    StageAborted,
    node_info,
)

__all__ = [
    "BACKEND_NAME",
    "DirectTransport",
    "Mailbox",
    "MailboxHost",
    "StageAborted",
    "create_rendezvous",
    "join_group",
    "set_local_host",
]

BACKEND_NAME = "RAYFLOW"
_RDV_PREFIX = "rayflow.hpc.rdv."


class MailboxHost:
    """Mixin for an actor that hosts a rank: the mailbox its channels fill and abort uses.

    The host must be a threaded actor whose ``abort`` can run while the rank function blocks
    in ``recv`` (rayflow's rank actor puts it in its own concurrency group).
    """

    def _rf_mailbox(self) -> Mailbox:
        box = getattr(self, "_rf_box", None)
        if box is None:
            box = self._rf_box = Mailbox()
        return box


# The mailbox of this process, found by the group without going through the actor handle.
_LOCAL_HOST: list[MailboxHost] = []


def set_local_host(host: MailboxHost) -> None:
    """Declare the actor instance of this process that hosts the rank's mailbox."""
    _LOCAL_HOST[:] = [host]


@ray.remote(num_cpus=0)
class _Rendezvous:
    """Gathers one value per rank for each setup phase of a group (one named actor per group).

    An async actor: every rank's ``exchange`` call waits on the phase's event, so a phase
    costs one call per rank and no polling.
    """

    def __init__(self, world_size: int):
        self._size = world_size
        self._values: dict[str, list[Any]] = {}
        self._done: dict[str, asyncio.Event] = {}

    async def exchange(self, phase: str, rank: int, value: Any) -> list[Any]:
        values = self._values.setdefault(phase, [None] * self._size)
        done = self._done.setdefault(phase, asyncio.Event())
        values[rank] = value
        if sum(v is not None for v in values) == self._size:
            done.set()
        await done.wait()
        return values


def create_rendezvous(group_name: str, world_size: int, namespace: str | None = None) -> Any:
    """Create the named rendezvous actor of ``group_name`` (call in the driver)."""
    return _Rendezvous.options(name=_RDV_PREFIX + group_name,  # type: ignore[attr-defined]  # (added by ray.remote)
                               namespace=namespace).remote(
        world_size
    )


def _exchange(rdv: Any, phase: str, rank: int, value: Any, deadline: float, group: str) -> list:
    try:
        return ray.get(rdv.exchange.remote(phase, rank, value),
                       timeout=max(0.1, deadline - time.monotonic()))
    except GetTimeoutError:
        raise TimeoutError(
            f"rendezvous of group {group!r} timed out in phase {phase!r} (a rank never joined)"
        ) from None


def join_group(world_size: int, rank: int, group_name: str, timeout_s: float = 60.0,
               mode: str = "auto", mailbox: Mailbox | None = None) -> DirectTransport:
    """Meet the group's other ranks and open direct channels to each of them.

    Called inside a rank actor that mixes in :class:`MailboxHost` (or in any process that
    gives the ``mailbox`` its channels fill), after the driver created the rendezvous
    actor with :func:`create_rendezvous`.

    Args:
        world_size, rank, group_name: the group and this rank's place in it.
        timeout_s: how long to wait for every rank to join.
        mode: ``"auto"`` (shared memory on a node, TCP across nodes) or ``"tcp"`` (TCP
            between all ranks).
    """
    if mailbox is None and not _LOCAL_HOST:
        raise RuntimeError("joining a group needs a MailboxHost actor (call set_local_host) "
                           "or a mailbox")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for a group of {world_size}")
    box = mailbox if mailbox is not None else _LOCAL_HOST[0]._rf_mailbox()
    deadline = time.monotonic() + timeout_s
    rdv = ray.get_actor(_RDV_PREFIX + group_name)
    info = node_info(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())
    infos = _exchange(rdv, "node", rank, info, deadline, group_name)
    ep = Endpoint(rank, infos, mode=mode, name=f"rayflow-{group_name}")
    addresses = _exchange(rdv, "addresses", rank, ep.address, deadline, group_name)
    transport = ep.connect(addresses, box, stage="group:" + group_name)
    try:
        # every peer has opened this rank's files through /proc: their descriptors may close
        _exchange(rdv, "connected", rank, True, deadline, group_name)
    except BaseException:
        transport.close()
        raise
    transport.release_fds()
    return transport
