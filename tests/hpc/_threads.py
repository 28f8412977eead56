"""Ranks as threads over an in-process mailbox: the transport the communicator's tests run on
(no Ray). A receive that waits past ``timeout_s`` raises ``TimeoutError``, so a collective
that hangs fails its test instead of stalling the suite."""

from __future__ import annotations

import pickle
import threading


class Hub:
    """The mailbox all ranks of one group share."""

    def __init__(self, size: int):
        self.size = size
        self.cond = threading.Condition()
        self.box: dict = {}


class ThreadTransport:
    backend = "threads"

    def __init__(self, hub: Hub, rank: int, timeout_s: float = 10.0):
        self.hub, self.rank, self.size = hub, rank, hub.size
        self.timeout_s = timeout_s

    def send(self, dest, key, obj):
        with self.hub.cond:
            assert (dest, self.rank, key) not in self.hub.box, "duplicate message key"
            # snapshot, as a real transport serialises at send time
            self.hub.box[(dest, self.rank, key)] = pickle.loads(pickle.dumps(obj))
            self.hub.cond.notify_all()

    def send_many(self, dests, key, obj):
        for d in dests:
            self.send(d, key, obj)

    def try_recv(self, src, key):
        """The message, or ``NO_MESSAGE`` at once (ANY_SOURCE, ``iprobe``, Request.Test)."""
        from rayflow.hpc.backends.transport import NO_MESSAGE

        with self.hub.cond:
            return self.hub.box.pop((self.rank, src, key), NO_MESSAGE)

    def recv(self, src, key):
        with self.hub.cond:
            if not self.hub.cond.wait_for(lambda: (self.rank, src, key) in self.hub.box,
                                          timeout=self.timeout_s):
                raise TimeoutError(f"rank {self.rank} waited for rank {src} {key}")
            return self.hub.box.pop((self.rank, src, key))
