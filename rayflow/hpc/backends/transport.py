"""The one point-to-point protocol every backend implements (:class:`Transport`), the handle
of a non-blocking send (:class:`Request`), and an in-process transport for one rank
(:class:`LocalTransport`). The collectives of :mod:`rayflow.hpc.comm` are written over it.
No Ray is imported by this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class Transport(Protocol):
    """Point-to-point messaging between the world ranks of one gang."""

    rank: int
    size: int

    def send(self, dest: int, key: tuple, obj: Any) -> None:
        """Deliver ``obj`` to world rank ``dest`` under ``key``; returns without waiting.

        The transport must snapshot ``obj`` before returning (MPI's buffered send): callers
        reuse the buffer at once (``sendrecv_replace``, Cannon's shifts).
        """

    def send_many(self, dests: Sequence[int], key: tuple, obj: Any) -> None:
        """Deliver the same ``obj`` to several ranks (a backend may serialise it once)."""

    def recv(self, src: int, key: tuple) -> Any:
        """Block until the message from world rank ``src`` under ``key`` arrives; return it."""


#: What a transport's optional ``try_recv`` returns when the message has not arrived.
NO_MESSAGE = type("NoMessage", (), {"__repr__": lambda self: "NO_MESSAGE"})()


class Request:
    """The handle of a non-blocking send (``comm.isend``): ``wait()`` before reusing the buffer."""

    def __init__(self, works: Sequence[Any] = ()):
        self._works = list(works)

    def test(self) -> bool:
        """Whether the send has completed (the buffer may be reused)."""
        return all(w.is_completed() for w in self._works)

    def wait(self) -> None:
        """Block until the send has completed."""
        for w in self._works:
            w.wait()
        self._works = []


class LocalTransport:
    """An in-process transport for one rank (size 1); handy for tests and serial runs."""

    backend = "local"

    def __init__(self):
        self.rank, self.size = 0, 1
        self._box: dict[tuple, Any] = {}

    def send(self, dest: int, key: tuple, obj: Any) -> None:
        self._box[key] = obj.copy() if isinstance(obj, np.ndarray) else obj

    def send_many(self, dests: Sequence[int], key: tuple, obj: Any) -> None:
        for d in dests:
            self.send(d, key, obj)

    def try_recv(self, src: int, key: tuple) -> Any:
        return self._box.pop(key, NO_MESSAGE)

    def recv(self, src: int, key: tuple) -> Any:
        try:
            return self._box.pop(key)
        except KeyError:
            raise RuntimeError(f"deadlock: a single rank waits for a message {key} never sent") from None

