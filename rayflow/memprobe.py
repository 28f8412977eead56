"""Peak memory of a job, measured as the W1 study did: all of its processes together.

The measure is **USS** (unique set size: pages that belong to one process only), summed over
the driver, the Ray instance's processes (GCS, raylet, agents) and every worker and actor
process, sampled while the job runs. RSS would count the object store's shared pages once
in every process that maps them (reading an 80 MiB object raised RSS by 114 MiB and USS by
11 MiB on this project's test machine), so the object store is reported on its own: the peak of Ray's
"Plasma memory usage" (MiB granularity). Job memory is the peak USS sum *above* the same
sum measured on the idle Ray just before the job started, plus nothing else.

    probe = MemoryProbe()            # after Ray is up: measures the idle baseline
    with probe:                      # samples in a thread while the job runs
        job = rf.run(flow)
    probe.report()                   # {"uss_peak_above_idle_mb": ..., "object_store_peak_mb": ...}

Processes are found from the driver: its descendants (a local Ray started by the driver
runs under it), plus the raylet and GCS of the driver's session and their descendants
(a driver that connected with ``address=...`` on a head node). Processes on other nodes are
not seen.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

import psutil

MB = 1e6
_NAMES: dict[str, str] = {}  # pid -> last process name seen (Ray retitles its workers)
_PLASMA = re.compile(r"Plasma memory usage (\d+) MiB")


def _session_roots() -> list[psutil.Process]:
    """The raylet and GCS server of the connected Ray session on this machine."""
    try:
        import ray._private.worker as worker

        node = worker._global_node
        session = node.get_session_dir_path() if node is not None else None
    except Exception:  # noqa: BLE001 - no Ray, or an API change: fall back to the driver tree
        return []
    if not session:
        return []
    roots = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if p.info["name"] in ("raylet", "gcs_server") and \
                    any(session in a for a in (p.info["cmdline"] or ())):
                roots.append(p)
        except (psutil.Error, TypeError):
            continue
    return roots


def job_processes(roots: list[psutil.Process] | None = None) -> list[psutil.Process]:
    """The driver, its descendants, and ``roots`` with their descendants (deduplicated)."""
    me = psutil.Process(os.getpid())
    seen: dict[int, psutil.Process] = {me.pid: me}
    for root in [me, *(roots or [])]:
        try:
            seen.setdefault(root.pid, root)
            for c in root.children(recursive=True):
                seen.setdefault(c.pid, c)
        except psutil.Error:
            continue
    return list(seen.values())


def uss_total(procs: list[psutil.Process],
              per_process: dict[str, int] | None = None) -> tuple[int, int]:
    """(sum of USS, sum of RSS) in bytes over ``procs``; vanished processes count 0.

    ``per_process``, when given, is updated with each process's peak USS, keyed by pid.
    """
    uss = rss = 0
    for p in procs:
        try:
            m = p.memory_full_info()
            if per_process is not None:
                # keyed by pid: a worker's title changes (IDLE, then its actor's method)
                key = f"{p.pid}"
                per_process[key] = max(per_process.get(key, 0), m.uss)
                _NAMES[key] = p.name()
        except (psutil.Error, OSError):
            continue
        uss += m.uss
        rss += m.rss
    return uss, rss


def object_store_bytes() -> int | None:
    """Bytes in Ray's object store (all nodes), or None when Ray does not say."""
    try:
        import ray._private.worker as worker
        from ray._private.internal_api import memory_summary

        node = worker._global_node
        if node is None:  # Ray is not started
            return None
        text = memory_summary(address=node.gcs_address, stats_only=True)
    except Exception:  # noqa: BLE001 - memory reporting must never fail a job
        return None
    m = _PLASMA.search(text)
    return int(m.group(1)) * (1 << 20) if m else None


class MemoryProbe:
    """Samples the job's USS and the object store in a background thread.

    Args:
        interval_s: time between samples (each reads /proc/<pid>/smaps of every process:
            a few ms of one core; 0.25 s keeps that under 2 %).
        object_store: also sample the object store (one GCS call per sample).
    """

    def __init__(self, interval_s: float = 0.25, object_store: bool = True):
        self.interval_s, self.with_store = interval_s, object_store
        self._roots = _session_roots()
        self.idle_by_process: dict[str, int] = {}
        self.peak_by_process: dict[str, int] = {}
        self.idle_uss, self.idle_rss = uss_total(job_processes(self._roots),
                                                 self.idle_by_process)
        self.idle_store = (object_store_bytes() or 0) if object_store else 0
        self.peak_uss = self.idle_uss
        self.peak_rss = self.idle_rss
        self.peak_store = self.idle_store
        self.peak_processes = 0
        self.samples: list[tuple[float, int, int]] = []  # (time, uss, store)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        procs = job_processes(self._roots)
        uss, rss = uss_total(procs, self.peak_by_process)
        store = (object_store_bytes() or 0) if self.with_store else 0
        self.peak_uss = max(self.peak_uss, uss)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_store = max(self.peak_store, store)
        self.peak_processes = max(self.peak_processes, len(procs))
        self.samples.append((time.time(), uss, store))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> MemoryProbe:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="memprobe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.report()

    def __enter__(self) -> MemoryProbe:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def report(self) -> dict[str, Any]:
        """Peaks in MB (10^6 bytes), the measure named, and the idle baseline."""
        return {
            "measure": "sum of USS over driver + Ray processes + workers, minus idle Ray",
            "uss_peak_above_idle_mb": round((self.peak_uss - self.idle_uss) / MB, 1),
            "uss_peak_total_mb": round(self.peak_uss / MB, 1),
            "uss_idle_mb": round(self.idle_uss / MB, 1),
            "rss_peak_total_mb": round(self.peak_rss / MB, 1),
            "object_store_peak_mb": round((self.peak_store - self.idle_store) / MB, 1),
            "processes_peak": self.peak_processes,
            "samples": len(self.samples),
            "growth_by_process_mb": self.growth_by_process(),
        }

    def peak_of(self, name_part: str) -> float:
        """MB: the summed peak USS of the processes whose name contains ``name_part`` (e.g.
        ``"StepHost"``), whole, whether or not they existed at idle. Unlike the growth above
        idle, it does not depend on whether an actor started a new process or took over one
        of Ray's idle workers (whose USS is part of the idle baseline)."""
        return round(sum(v for k, v in self.peak_by_process.items()
                         if name_part in _NAMES.get(k, "")) / MB, 1)

    def growth_by_process(self, top: int = 8) -> dict[str, float]:
        """The processes whose USS grew most over idle (new processes: their whole USS)."""
        growth = {k: v - self.idle_by_process.get(k, 0) for k, v in self.peak_by_process.items()}
        best = sorted(growth.items(), key=lambda kv: -kv[1])[:top]
        return {f"{_NAMES.get(k, '?')}[{k}]": round(v / MB, 1) for k, v in best}
