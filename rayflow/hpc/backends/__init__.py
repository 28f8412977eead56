"""How the ranks of a gang talk: one point-to-point transport protocol
(:mod:`~rayflow.hpc.backends.transport`) and the backends behind it.

- ``ray`` (the default): ranks meet once through Ray (:mod:`.ray_backend`), then send over
  direct channels (:mod:`.channels`: shared-memory rings and segments on one node,
  :mod:`.shm`; ZeroMQ across nodes; the wire format in :mod:`.wire`, the links in
  :mod:`.links`);
- ``gloo``: ``torch.distributed`` (:mod:`.gloo_backend`), when torch is installed.

The collectives are written once, over the protocol, in :mod:`rayflow.hpc.comm`
(:mod:`rayflow.hpc.ray_collective` offers them to ``ray.util.collective`` too).
Importing this package imports no Ray.
"""
