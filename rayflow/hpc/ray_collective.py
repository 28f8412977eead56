"""The Ray-native backend registered with ``ray.util.collective`` as ``RAYFLOW``.

Usage: ``register_ray_backend(); init_collective_group(n, rank, backend="RAYFLOW", group_name=g)``

:class:`RayNativeGroup` implements ``ray.util.collective``'s in-place tensor API on numpy
arrays over the backend's direct channels (:class:`~rayflow.hpc.backends.channels.DirectTransport`), so
``ray.util.collective.allreduce(arr, group_name)`` works in rayflow's rank actors. This module
is separate from :mod:`rayflow.hpc.backends.ray_backend` because ``ray.util.collective`` imports torch
whenever torch is installed; rayflow's gangs join groups without it.
"""

from __future__ import annotations

import numpy as np
from ray.util.collective.backend_registry import _global_registry, register_collective_backend
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import ReduceOp

from rayflow.hpc.backends.ray_backend import BACKEND_NAME, join_group
from rayflow.hpc.comm import Communicator

_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}


class RayNativeGroup(BaseGroup):
    """``ray.util.collective`` group over direct channels (numpy arrays, in place).

    Built inside a rank actor that mixes in ``MailboxHost``, after the driver created the
    rendezvous actor with ``create_rendezvous``.
    """

    def __init__(self, world_size: int, rank: int, group_name: str, timeout_s: float = 60.0):
        super().__init__(world_size, rank, group_name)
        self.transport = join_group(world_size, rank, group_name, timeout_s)
        self.comm = Communicator(self.transport, context=("group", group_name))

    def destroy_group(self):
        """Release the group's channels (``ray.util.collective.destroy_collective_group``)."""
        self.transport.close()

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
    from rayflow.hpc.reduce import REDUCE_OPS

    return REDUCE_OPS[op].array(a, b)


def register_ray_backend() -> None:
    """Register :class:`RayNativeGroup` as ``RAYFLOW`` (idempotent; call in driver and ranks)."""
    if not _global_registry.is_registered(BACKEND_NAME):
        register_collective_backend(BACKEND_NAME, RayNativeGroup)
