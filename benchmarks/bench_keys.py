"""Keyed state at scale: event-time tumbling windows over 1 k, 10 k, 100 k and 1 M distinct
keys, records/s and memory per key, per state backend, beside a plain-Python baseline.

    python benchmarks/bench_keys.py [--quick] [--keys 1000,10000] [--backends memory,rocksdb]
                                    [--rounds 3]

Each configuration runs in a fresh Python process (so its memory figure is its own): the
window step's logic (``Windowed(TumblingWindow, Count, EventTime)``, as a job's instance runs
it, without the channels) is fed batches of 10,000 ``(key, t)`` records for two windows,
with a watermark after each batch; a window fires when the next one starts. Two series:

- ``same records``: two windows, every key at least twice per window and at least 4 M
  records in all, as many as 10⁶ keys need at 2 a window (so the fixed costs of a run weigh
  the same at every size, and no run is short: a run of 400,000 records over 1 k keys
  lasted 0.15 s, and its median moved by half between two full runs on the 2-core VM): at
  1 k keys a window gets 2,000 records per key, at 1 M keys 2, so what each window costs to
  open and fire (its state, its result) is spread over fewer records as the keys grow;
- ``same density``: 2 records per key and window at every size, and as many windows as
  4 M records need: the cost of a record, window costs included, is the same at every
  size, and only the number of windows open at once (one per key) grows. (At 1 M keys the
  two series are the same runs.)

The figures:

- records/s over the whole run (adds, firings, state reads and writes);
- memory per key: the process's USS growth (psutil) at the peak, when every key's window is
  open, divided by the number of keys; for RocksDB also the database's bytes on disk per key;
- the plain baseline: the same records counted per (window, key) in nested dicts, fired
  the same way, in a process of its own (the COST floor).

The backends: ``memory``, ``filesystem``, ``rocksdb`` (as a job runs it, with its cache of
recently used entries) and ``rocksdb-nocache`` (every batch writes its windows' partials to
RocksDB, and every firing reads them back: the database's own cost as the keys grow).
Each ``<backend>-arrow`` feeds the same records as Arrow batches (a ``key`` and a ``t``
column, keyed by the field ``key``), which tumbling windows keep as columns
(:mod:`rayflow.operators.windows.columnar`): their open windows are Arrow tables in the
step's memory between checkpoints, written to the backend at a checkpoint (none is taken
here), so the backend's own cost does not show in these rows.

Both run with Python's garbage collector set as a step actor sets it (``stream.gc_threshold``
and ``stream.gc_freeze``: higher thresholds, and what is alive once the steps are built is
frozen out of later collections). With Python's own thresholds the full collections, which
walk the state's million-entry dicts, took over half of the time at 1 M keys (measured on
the 2-core VM: 14.4 s of 27 s in 59 full collections).

Every configuration runs ``--rounds`` times, in interleaved rounds (each configuration once a
round): the figures are medians, records/s with its min-max over the rounds.

The target is a cost per record that does not grow with the number of open windows:
records/s at 1 M keys within 2x of 1 k keys, for each backend (``vs_fewest_keys`` within
each series).
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import click  # noqa: E402
import psutil  # noqa: E402
from _common import machine_info, print_table, ratio, write_result  # noqa: E402

WINDOW_S = 10.0
MIN_PER_KEY_PER_WINDOW = 2
MIN_RECORDS = 4_000_000
QUICK_MIN_RECORDS = 40_000
WINDOWS = 2
BATCH = 10_000
KEYS = (1_000, 10_000, 100_000, 1_000_000)
QUICK_KEYS = (1_000, 10_000)
BACKENDS = ("memory", "filesystem", "rocksdb", "rocksdb-nocache", "memory-arrow",
            "filesystem-arrow", "rocksdb-arrow")


SERIES = ("same records", "same density")


def layout(keys: int, min_records: int, series: str) -> tuple[int, int]:
    """``(records per key and window, windows)`` of a run."""
    if series == "same density":
        return MIN_PER_KEY_PER_WINDOW, max(WINDOWS, -(-min_records // (
            keys * MIN_PER_KEY_PER_WINDOW)))
    return max(MIN_PER_KEY_PER_WINDOW, -(-min_records // (keys * WINDOWS))), WINDOWS


def _batches(keys: int, per_key: int, windows: int, arrow: bool = False):
    """``(records, event times, watermark)``: window w holds every key ``per_key`` times,
    keys in turn in an order of their own (a fixed random permutation: keys come from an
    input in no order, not sorted by name, so a window's firing order costs what it
    costs there), at times spread evenly over the window; the watermark trails the batch
    by 1 ms. ``arrow``: each batch's records as an Arrow table, columns ``key`` and ``t``."""
    import numpy as np

    per_window = keys * per_key
    dt = WINDOW_S / per_window
    order = np.random.default_rng(0).permutation(keys)
    # batches do not straddle windows: after a window's last batch all its keys are open
    for lo, hi in ((lo, min((w + 1) * per_window, lo + BATCH)) for w in range(windows)
                   for lo in range(w * per_window, (w + 1) * per_window, BATCH)):
        i = np.arange(lo, hi)
        t = i * dt
        names = [f"k{k}" for k in order[i % keys].tolist()]
        if arrow:  # (made here, so no list of records is made and freed before the figures)
            import pyarrow as pa

            yield pa.table({"key": names, "t": t}), t, float(t[-1]) - 0.001
        else:
            yield list(zip(names, t.tolist())), t, float(t[-1]) - 0.001


def _uss() -> int:
    return psutil.Process().memory_full_info().uss


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _gc_as_in_a_step_actor() -> None:
    """Python's garbage collector set as a step actor of a default job sets it."""
    from rayflow.config import load_config
    from rayflow.runtime.host import tune_gc

    tune_gc(load_config().stream)


def run_rayflow(backend: str, keys: int, per_key: int, windows: int) -> dict:
    """One configuration in this process: the window logic on ``backend``."""
    from operator import itemgetter

    from rayflow.core.operators import StepContext
    from rayflow.core.records import Field
    from rayflow.operators.windows import Count, EventTime, TumblingWindow, Windowed
    from rayflow.state import backend_from_name

    tmp = Path(tempfile.mkdtemp(prefix="bench-keys-"))
    arrow = backend.endswith("-arrow")
    backend = backend.removesuffix("-arrow")
    spec = Windowed(TumblingWindow(WINDOW_S), Count(), Field("key") if arrow else itemgetter(0),
                    EventTime())
    # made before timing and the memory baseline
    batches = list(_batches(keys, per_key, windows, arrow))
    warm = spec.build(StepContext("warm", 0, 1))  # first-call imports are not the figure
    warm.process(batches[0][0][:10], batches[0][1][:10])
    if arrow:  # (and the columnar path's first calls)
        warm.process(batches[0][0], batches[0][1])
    warm.on_end()
    base = _uss()
    # rocksdb-nocache: RocksDB without the cache of recently used entries (every batch
    # writes RocksDB), the database's own scaling
    store = (backend_from_name("rocksdb", str(tmp), rocksdb_cache_entries=0)
             if backend == "rocksdb-nocache" else backend_from_name(backend, str(tmp)))
    logic = spec.build(StepContext("win", 0, 1, "bench", store))
    _gc_as_in_a_step_actor()  # (the steps are built)
    peak, disk, fired, n, probed = 0, 0, 0, 0, False
    half = keys * per_key
    t0 = time.perf_counter()
    for recs, times, wm in batches:
        logic.process(recs, times)
        out = logic.on_watermark(wm)
        fired += len(out.items) if out else 0
        n += len(recs)
        if n >= half and not probed:  # every key's first window open, none fired: the peak
            probed = True
            t_probe = time.perf_counter()
            peak = _uss() - base
            if backend.startswith("rocksdb"):
                logic.state.flush()
                disk = _dir_bytes(tmp)
            t0 += time.perf_counter() - t_probe  # the probe is not processing time
    out = logic.on_end()
    fired += len(out.items) if out else 0
    secs = time.perf_counter() - t0
    logic.close()
    assert fired == keys * windows, (fired, keys)
    return {"records": n, "seconds": secs, "records_s": n / secs,
            "mem_bytes_per_key": peak / keys, "disk_bytes_per_key": disk / keys or None}


def run_plain(keys: int, per_key: int, windows: int) -> dict:
    """The baseline: nested dicts ``{window start: {key: count}}``, fired by the watermark,
    with the garbage collector set as for the step (a baseline no worse tuned)."""
    batches = list(_batches(keys, per_key, windows))
    _gc_as_in_a_step_actor()
    base = _uss()
    open_: dict[float, dict] = {}
    peak, fired, n, probed = 0, 0, 0, False
    half = keys * per_key
    t0 = time.perf_counter()
    for recs, _times, wm in batches:
        for key, t in recs:
            start = math.floor(t / WINDOW_S) * WINDOW_S
            w = open_.get(start)
            if w is None:
                w = open_[start] = {}
            w[key] = w.get(key, 0) + 1
        for start in [s for s in open_ if s + WINDOW_S <= wm]:
            fired += len(open_.pop(start))
        n += len(recs)
        if n >= half and not probed:
            probed = True
            t_probe = time.perf_counter()
            peak = _uss() - base
            t0 += time.perf_counter() - t_probe
    fired += sum(len(w) for w in open_.values())
    secs = time.perf_counter() - t0
    assert fired == keys * windows, (fired, keys)
    return {"records": n, "seconds": secs, "records_s": n / secs,
            "mem_bytes_per_key": peak / keys}


def _in_process(kind: str, keys: int, per_key: int, windows: int) -> dict:
    """Run one configuration in a fresh interpreter and return its figures."""
    out = subprocess.run([sys.executable, __file__, "--worker",
                          f"{kind}:{keys}:{per_key}:{windows}"],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{kind} with {keys} keys failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--quick", is_flag=True,
              help="1 k and 10 k keys, 40,000 records a run (a few seconds).")
@click.option("--keys", "keys_opt", default=None, help="Comma-separated key counts.")
@click.option("--backends", default=",".join(BACKENDS), show_default=True)
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="Runs of every configuration, in interleaved rounds (every configuration "
                   "once per round): medians, with the min-max.")
@click.option("--worker", default=None, hidden=True)
def main(quick: bool, keys_opt: str | None, backends: str, rounds: int,
         worker: str | None) -> None:
    if worker is not None:  # one configuration, in this fresh process
        kind, keys, per_key, windows = (int(x) if x.isdigit() else x
                                        for x in worker.split(":"))
        res = (run_plain(keys, per_key, windows) if kind == "plain"
               else run_rayflow(kind, keys, per_key, windows))
        print(json.dumps(res))
        return
    names = [b.strip() for b in backends.split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown:
        raise click.BadParameter(f"unknown backends {unknown}; known: {list(BACKENDS)}")
    sizes = [int(k) for k in keys_opt.split(",")] if keys_opt else list(
        QUICK_KEYS if quick else KEYS)
    least = QUICK_MIN_RECORDS if quick else MIN_RECORDS
    rows, table = [], []

    def conf(kind: str, keys: int, series: str) -> tuple:
        return (kind, keys, *layout(keys, least, series))

    # every configuration (each run once: at 100 k keys and up the series share their runs),
    # once a round, rounds after each other: a slow spell of the machine falls on every
    # configuration alike, not on the one that ran then
    confs = list(dict.fromkeys(conf(kind, k, series) for series in SERIES for backend in names
                               for k in sizes for kind in (backend, "plain")))
    runs: dict[tuple, list[dict]] = {c: [] for c in confs}
    for r in range(rounds):
        for c in confs:
            runs[c].append(_in_process(*c))
            print(f"round {r + 1}/{rounds}: {c[0]} {c[1]:>9,} keys: "
                  f"{runs[c][-1]['records_s']:,.0f} records/s", flush=True)

    def measure(kind: str, keys: int, series: str) -> dict:
        got = runs[conf(kind, keys, series)]
        rates = [g["records_s"] for g in got]
        out = {f: statistics.median(g[f] for g in got) if got[0][f] is not None else None
               for f in got[0] if f != "records"}  # (the same in every round)
        return {**out, "records": got[0]["records"], "records_s_min": min(rates),
                "records_s_max": max(rates), "rounds": len(got)}

    for series in SERIES:
        for backend in names:
            first = None
            for k in sizes:
                per_key, windows = layout(k, least, series)
                res, plain = measure(backend, k, series), measure("plain", k, series)
                first = first or res["records_s"]
                row = {"series": series, "backend": backend, "keys": k,
                       "per_key_per_window": per_key, "windows": windows, **res,
                       "plain_records_s": plain["records_s"],
                       "plain_records_s_min": plain["records_s_min"],
                       "plain_records_s_max": plain["records_s_max"],
                       "plain_mem_bytes_per_key": plain["mem_bytes_per_key"],
                       "vs_plain": ratio(res["records_s"], plain["records_s"]),
                       "vs_fewest_keys": ratio(res["records_s"], first)}
                rows.append(row)
                table.append([series, backend, k, per_key, windows,
                              f"{row['records_s']:,.0f} ({row['records_s_min']:,.0f}-"
                              f"{row['records_s_max']:,.0f})",
                              row["plain_records_s"], row["vs_plain"], row["vs_fewest_keys"],
                              row["mem_bytes_per_key"], row["plain_mem_bytes_per_key"],
                              row["disk_bytes_per_key"]])
    machine = machine_info()
    print_table(f"Tumbling windows by number of keys (machine: {machine['logical_cores']}-core "
                f"{machine['cpu_model'] or 'VM'}, load {machine['loadavg_1m']})",
                ["series", "backend", "keys", "rec/key/window", "windows", "records/s",
                 "plain rec/s", "vs plain", "vs fewest keys", "B/key", "plain B/key",
                 "disk B/key"], table)
    # a smoke run or a subset must not overwrite the full run's figures
    subset = quick or keys_opt or set(names) != set(BACKENDS)
    path = write_result("keys_quick" if subset else "keys",
                        {"quick": quick, "rounds": rounds, "window_s": WINDOW_S,
                         "min_records": least,
                         "batch": BATCH, "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
