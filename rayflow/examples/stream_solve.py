"""Streams and MPI stages in one program: per-sensor least-squares fits, each window solved
by conjugate gradients on a gang of ranks, results to Kafka exactly once.

sensor rows -> key_by(sensor) -> count window of R rows -> CG stage on a reused gang
(normal equations X'X b = X'y) -> JSON -> Kafka (exactly-once, read_committed)

    python jobs/stream_solve.py --windows 40 --rows 400 --features 32

The flow and its helpers, shared by ``jobs/stream_solve.py`` (the CLI), the demo, the
tests and the benchmarks.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

import rayflow as rf
from rayflow.hpc.bridge import GangStep
from rayflow.operators.windows import Aggregator, CountWindow

RIDGE = 1e-6


def true_coefficients(sensor: int, features: int) -> np.ndarray:
    return np.random.default_rng(10_000 + sensor).normal(size=features)


@dataclass(frozen=True)
class SensorRows:
    """Record ``i``: sensor ``i % sensors``, features x and target y = x . beta + noise."""

    sensors: int
    features: int

    def __call__(self, i: int):
        rng = np.random.default_rng(i)
        s = i % self.sensors
        x = rng.normal(size=self.features)
        y = float(x @ true_coefficients(s, self.features) + 0.01 * rng.normal())
        return (s, x, y)


@dataclass(frozen=True)
class Rows(Aggregator):
    """Collects a window's (x, y) rows."""

    def create(self):
        return []

    def add(self, acc, record):
        acc.append((record[1], record[2]))
        return acc

    def merge(self, a, b):
        return a + b


@dataclass(frozen=True)
class SolveWindow:
    """The MPI stage of one window: CG on the normal equations, on the step's gang."""

    tol: float = 1e-10

    def __call__(self, window, gang):
        from rayflow.hpc import cg_solve

        X = np.stack([x for x, _ in window.value])
        y = np.array([v for _, v in window.value])
        A = X.T @ X + RIDGE * np.eye(X.shape[1])
        b = X.T @ y
        t0 = time.perf_counter()
        res = cg_solve(A, b, ranks=gang.size, gang=gang, tol=self.tol)
        return {"sensor": int(window.key), "window": int(window.start),
                "rows": len(window.value), "beta": res.x.tolist(),
                "iterations": int(res.iterations), "residual": float(res.history[-1]),
                "stage_ms": round(1000 * (time.perf_counter() - t0), 2)}


def build_flow(sink, windows: int, rows: int, features: int, sensors: int = 4, ranks: int = 2,
               reuse_gang: bool = True, rate: float | None = None,
               name: str = "stream-solve") -> rf.Dataflow:
    flow = rf.Dataflow(name)
    (flow.source("rows", rf.GeneratorSource(SensorRows(sensors, features),
                                            count=windows * rows, rate=rate))
         .key_by(lambda r: r[0])
         .window("window", CountWindow(rows), Rows())
         .apply("solve", GangStep(SolveWindow(), ranks=ranks, reuse_gang=reuse_gang,
                                  rank_num_cpus=0.5))
         .map("json", lambda r: json.dumps(r).encode())
         .sink("out", sink))
    return flow


def reference_fits(windows: int, rows: int, features: int, sensors: int = 4) -> dict:
    """numpy ground truth: (sensor, window) -> coefficients, from the same rows in order."""
    make = SensorRows(sensors, features)
    per: dict[int, list] = {}
    fits = {}
    for i in range(windows * rows):
        s, x, y = make(i)
        per.setdefault(s, []).append((x, y))
        if len(per[s]) % rows == 0:
            chunk = per[s][-rows:]
            X = np.stack([c[0] for c in chunk])
            yy = np.array([c[1] for c in chunk])
            beta = np.linalg.solve(X.T @ X + RIDGE * np.eye(features), X.T @ yy)
            fits[(s, len(per[s]) // rows - 1)] = beta
    return fits
