"""The Ray-native collective backend: direct actor-to-actor messages, no torch.

Usage: ``register_ray_backend(); init_collective_group(n, rank, backend="RAYFLOW", group_name=g)``

Every rank actor exposes a mailbox method (:class:`MailboxHost`); a rank sends by calling its
peer's ``_rf_deliver`` directly, so a message is one actor call: arrays under Ray's inline
limit (100 KiB) travel inside the call, larger ones go through the shared-memory object store
and are read without a copy. The first version (a rendezvous actor holding every message, data
through ``ray.put``) paid two hops and an object-store round trip per message; the
measurements are in ``docs/hpc.md``.

Ranks find each other once per group through a small named rendezvous actor
(:func:`join_group`). :mod:`rayflow.hpc.ray_collective` registers the same backend with
``ray.util.collective`` (``RAYFLOW``); rayflow's own gangs join without that module, because
importing ``ray.util.collective`` imports torch when it is installed (measured: a rank's USS
went from 61 to 258 MB).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

BACKEND_NAME = "RAYFLOW"
# Above this size a message sent to several ranks is put in the object store once and the
# peers get its reference (Ray would otherwise serialise the array once per call).
_SHARE_BYTES = 100 * 1024
_RDV_PREFIX = "rayflow.hpc.rdv."


class _Shared:
    """A message body left in the object store; the receiver fetches it by reference."""

    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref


class StageAborted(RuntimeError):
    """Raised in a surviving rank blocked on a dead peer, so that the rank can be reused."""


class Mailbox:
    """Messages delivered to this process, by stage and (source, key)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._boxes: dict[str, dict[tuple[int, tuple], Any]] = {}
        self._aborted: set[str] = set()

    def put(self, stage: str, src: int, key: tuple, obj: Any) -> None:
        with self._cond:
            self._boxes.setdefault(stage, {})[(src, key)] = obj
            self._cond.notify_all()

    def take(self, stage: str, src: int, key: tuple, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if stage in self._aborted:
                    raise StageAborted(f"stage {stage} was aborted (a peer died)")
                box = self._boxes.get(stage)
                if box is not None and (src, key) in box:
                    return box.pop((src, key))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"no message from rank {src} with key {key} within {timeout_s:.0f}s "
                        "(a peer probably died; the stage will be retried)"
                    )
                self._cond.wait(left)

    def forget_other_stages(self, stage: str) -> None:
        """Drop messages left over from earlier stages on this (reused) gang."""
        with self._cond:
            for s in [s for s in self._boxes if s != stage]:
                del self._boxes[s]
            self._aborted.intersection_update({stage})

    def abort(self, stage: str) -> None:
        """Make every ``take`` of ``stage`` (waiting now or later) raise :class:`StageAborted`."""
        with self._cond:
            self._aborted.add(stage)
            self._cond.notify_all()


class MailboxHost:
    """Mixin for an actor that hosts a rank: the mailbox and its delivery method.

    The host must be a threaded actor whose ``_rf_deliver`` can run while the rank function
    blocks in ``recv`` (rayflow's rank actor puts it in its own concurrency group).
    """

    def _rf_mailbox(self) -> Mailbox:
        box = getattr(self, "_rf_box", None)
        if box is None:
            box = self._rf_box = Mailbox()
        return box

    def _rf_deliver(self, stage: str, src: int, key: tuple, obj: Any) -> None:
        self._rf_mailbox().put(stage, src, key, obj)


# The mailbox of this process, found by the group without going through the actor handle.
_LOCAL_HOST: list[MailboxHost] = []


def set_local_host(host: MailboxHost) -> None:
    """Declare the actor instance of this process that hosts the rank's mailbox."""
    _LOCAL_HOST[:] = [host]


class RayTransport:
    """Point-to-point messages between rank actors by direct calls to ``_rf_deliver``."""

    backend = "ray"

    def __init__(self, rank: int, peers: Sequence[Any], mailbox: Mailbox, stage: str = "",
                 timeout_s: float = 600.0):
        self.rank = rank
        self.size = len(peers)
        self._peers = list(peers)
        self._box = mailbox
        self.stage = stage
        self.timeout_s = timeout_s

    def for_stage(self, stage: str) -> RayTransport:
        """The same links, with messages scoped to ``stage``."""
        return RayTransport(self.rank, self._peers, self._box, stage, self.timeout_s)

    def send(self, dest: int, key: tuple, obj: Any) -> None:
        if dest == self.rank:
            snap = obj.copy() if isinstance(obj, np.ndarray) else obj  # a send snapshots
            self._box.put(self.stage, self.rank, key, snap)
        else:
            # Fire and forget: a failed delivery means a dead peer, which the driver detects.
            self._peers[dest]._rf_deliver.options(num_returns=0).remote(self.stage, self.rank, key, obj)

    def send_many(self, dests: Sequence[int], key: tuple, obj: Any) -> None:
        if len(dests) > 1 and isinstance(obj, np.ndarray) and obj.nbytes > _SHARE_BYTES:
            obj = _Shared(ray.put(obj))
        for d in dests:
            self.send(d, key, obj)

    def recv(self, src: int, key: tuple) -> Any:
        obj = self._box.take(self.stage, src, key, self.timeout_s)
        if isinstance(obj, _Shared):
            obj = ray.get(obj.ref)
        return obj


@ray.remote(num_cpus=0)
class _Rendezvous:
    """Collects the actor handles of a group's ranks (one named actor per group)."""

    def __init__(self, world_size: int):
        self._handles: list[Any] = [None] * world_size

    def register(self, rank: int, handle: Any) -> None:
        self._handles[rank] = handle

    def peers(self) -> list[Any] | None:
        return None if any(h is None for h in self._handles) else self._handles


def create_rendezvous(group_name: str, world_size: int, namespace: str | None = None) -> Any:
    """Create the named rendezvous actor of ``group_name`` (call in the driver)."""
    return _Rendezvous.options(name=_RDV_PREFIX + group_name, namespace=namespace).remote(
        world_size
    )


def join_group(world_size: int, rank: int, group_name: str, timeout_s: float = 60.0) -> RayTransport:
    """Register this rank with the group's rendezvous actor and wait for all peers.

    Called inside a rank actor that mixes in :class:`MailboxHost`, after the driver created
    the rendezvous actor with :func:`create_rendezvous`.
    """
    if not _LOCAL_HOST:
        raise RuntimeError("joining a group needs a MailboxHost actor (call set_local_host)")
    host = _LOCAL_HOST[0]
    rdv = ray.get_actor(_RDV_PREFIX + group_name)
    me = ray.get_runtime_context().current_actor
    ray.get(rdv.register.remote(rank, me))
    deadline = time.monotonic() + timeout_s
    peers = None
    while peers is None:
        peers = ray.get(rdv.peers.remote())
        if peers is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rendezvous of group {group_name!r} timed out")
            time.sleep(0.01)
    return RayTransport(rank, peers, host._rf_mailbox(), stage="group:" + group_name)

