"""The Ray-native collective backend: direct actor-to-actor messages, no torch.

Usage: ``register_ray_backend(); init_collective_group(n, rank, backend="RAYFLOW", group_name=g)``

Every rank actor exposes a mailbox method (:class:`MailboxHost`); a rank sends by calling its
peer's ``_rf_deliver`` directly, so a message is one actor call: arrays under Ray's inline
limit (100 KiB) travel inside the call, larger ones go through the shared-memory object store
and are read without a copy. The first version (a rendezvous actor holding every message, data
through ``ray.put``) paid two hops and an object-store round trip per message; the
measurements are in ``docs/hpc.md``.

Ranks find each other once per group through a small named rendezvous actor. The backend is
registered with ``ray.util.collective`` (``RAYFLOW``) and implements its in-place tensor API
on numpy arrays, so ``ray.util.collective.allreduce(arr, group_name)`` works in our ranks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
from ray.util.collective.backend_registry import _global_registry, register_collective_backend
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import ReduceOp

from rayflow.hpc.comm import Communicator

BACKEND_NAME = "RAYFLOW"
# Above this size a message sent to several ranks is put in the object store once and the
# peers get its reference (Ray would otherwise serialise the array once per call).
_SHARE_BYTES = 100 * 1024
_RDV_PREFIX = "rayflow.hpc.rdv."

_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}


class _Shared:
    """A message body left in the object store; the receiver fetches it by reference."""

    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref


class Mailbox:
    """Messages delivered to this process, by stage and (source, key)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._boxes: dict[str, dict[tuple[int, tuple], Any]] = {}

    def put(self, stage: str, src: int, key: tuple, obj: Any) -> None:
        with self._cond:
            self._boxes.setdefault(stage, {})[(src, key)] = obj
            self._cond.notify_all()

    def take(self, stage: str, src: int, key: tuple, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
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


class RayNativeGroup(BaseGroup):
    """``ray.util.collective`` group over :class:`RayTransport` (numpy arrays, in place).

    Built inside a rank actor that mixes in :class:`MailboxHost`, after the driver created the
    rendezvous actor with :func:`create_rendezvous`.
    """

    def __init__(self, world_size: int, rank: int, group_name: str, timeout_s: float = 60.0):
        super().__init__(world_size, rank, group_name)
        if not _LOCAL_HOST:
            raise RuntimeError("RayNativeGroup needs a MailboxHost actor (call set_local_host)")
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
        self.transport = RayTransport(rank, peers, host._rf_mailbox(), stage="group:" + group_name)
        self.comm = Communicator(self.transport, context=("group", group_name))

    @classmethod
    def backend(cls) -> str:
        return BACKEND_NAME

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    # ray.util.collective passes tensors wrapped in a list, and expects results in place.
    def allreduce(self, tensor, allreduce_options=None):
        t = tensor[0]
        op = _OPS[allreduce_options.reduceOp] if allreduce_options is not None else "sum"
        np.copyto(t, self.comm.allreduce(t, op))

    def barrier(self, barrier_options=None):
        self.comm.barrier()

    def reduce(self, tensor, reduce_options=None):
        t = tensor[0]
        root = reduce_options.root_rank if reduce_options is not None else 0
        op = _OPS[reduce_options.reduceOp] if reduce_options is not None else "sum"
        out = self.comm.reduce(t, op, root)
        if out is not None:
            np.copyto(t, out)

    def allgather(self, tensor_list, tensor, allgather_options=None):
        for dst, got in zip(tensor_list[0], self.comm.allgather(tensor[0])):
            np.copyto(dst, got)

    def broadcast(self, tensor, broadcast_options=None):
        t = tensor[0]
        root = broadcast_options.root_rank if broadcast_options is not None else 0
        got = self.comm.bcast(t if self.rank == root else None, root)
        if self.rank != root:
            np.copyto(t, got)

    def reducescatter(self, tensor, tensor_list, reducescatter_options=None):
        op = _OPS[reducescatter_options.reduceOp] if reducescatter_options is not None else "sum"
        pieces = self.comm.alltoall(list(tensor_list[0]))
        acc = pieces[0].copy()
        for p in pieces[1:]:
            acc = _apply(op, acc, p)
        np.copyto(tensor[0], acc)

    def send(self, tensor, send_options):
        self.comm.send(tensor[0], send_options.dst_rank)

    def recv(self, tensor, recv_options):
        np.copyto(tensor[0], self.comm.recv(recv_options.src_rank))


def _apply(op: str, a, b):
    from rayflow.hpc.comm import REDUCE_OPS

    return REDUCE_OPS[op](a, b)


def register_ray_backend() -> None:
    """Register :class:`RayNativeGroup` as ``RAYFLOW`` (idempotent; call in driver and ranks)."""
    if not _global_registry.is_registered(BACKEND_NAME):
        register_collective_backend(BACKEND_NAME, RayNativeGroup)
