"""MPI stages on Ray: block datasets, gang-scheduled ``mpimap``, communicators, Cannon and CG.

Usage: ``C = rayflow.hpc.cannon_matmul(a, b, grid=2).to_numpy()``

Names are loaded lazily (PEP 562), so ``import rayflow.hpc.algorithms.cannon_index`` or
``rayflow.hpc.algorithms.cg_math`` (pure logic) does not import Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BlockDataset": "rayflow.hpc.dataset",
    "mpimap": "rayflow.hpc.stage",
    "StageInfo": "rayflow.hpc.stage",
    "StageError": "rayflow.hpc.stage",
    "Gang": "rayflow.hpc.gang",
    "Communicator": "rayflow.hpc.comm",
    "CartComm": "rayflow.hpc.comm",
    "cannon_matmul": "rayflow.hpc.algorithms.cannon",
    "cg_solve": "rayflow.hpc.algorithms.cg",
    "CGResult": "rayflow.hpc.algorithms.cg",
    "ConvergenceWarning": "rayflow.hpc.algorithms.cg",
    "PROC_NULL": "rayflow.hpc.comm",
    "shuffle_matmul": "rayflow.hpc.algorithms.baselines",
    "broadcast_cg": "rayflow.hpc.algorithms.baselines",
    "register_ray_backend": "rayflow.hpc.ray_collective",
    "run_mpi": "rayflow.hpc.mpirun",
    "MPIRunError": "rayflow.hpc.mpirun",
}

__all__ = sorted([*_EXPORTS, "MPI"])


def __getattr__(name: str) -> Any:
    if name == "MPI":  # a module (mpi4py's name), not a name inside one
        return importlib.import_module("rayflow.hpc.MPI")
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'rayflow.hpc' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
