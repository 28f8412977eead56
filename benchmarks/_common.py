"""Shared helpers for the benchmarks: machine description and result files.

Every benchmark writes ``benchmarks/results/<name>.json`` with ``machine`` (from
:func:`machine_info`), ``date``, and its own ``rows``; ``rayflow report`` turns them into
BENCHMARKS.md.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Any

import psutil

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, memory and load average of this machine, now."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": model,
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (plus machine and date) to ``benchmarks/results/<name>.json``."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        **payload,
    }
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2, default=float) + "\n")
    return path


def timed(fn, reps: int) -> tuple[float, list[float]]:
    """``fn`` once to warm up (worker processes, imports, first-touch pages), then ``reps``
    timed calls: (median seconds, every time)."""
    import time
    from statistics import median

    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return median(times), times


def ratio(ours: float, other: float) -> float | None:
    """ours / other, or None when other is zero or missing."""
    return round(ours / other, 3) if other else None


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """Print a plain aligned table (works when stdout is not a terminal)."""
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        return f"{c:,.3g}" if abs(c) < 100 else f"{c:,.0f}"
    return "-" if c is None else str(c)
