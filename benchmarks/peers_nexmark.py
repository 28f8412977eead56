"""Bytewax on Nexmark queries, beside rayflow in ``bench_nexmark.py``: the same events (the
generator's event dicts, made inside the source as the rayflow job's source makes them),
each query written with Bytewax's own operators and rayflow's functions (the same row
building, the same per-key functions), one worker
(``bytewax.run.cli_main(flow, workers_per_process=1)``, what ``python -m bytewax.run -w 1``
calls), in a fresh process, into a sink that counts and drops. Per core = events / the CPU
seconds of that process (all its threads) while the flow runs.

    python benchmarks/peers_nexmark.py q1 400000   # prints one JSON line

Queries: the stateless ones (q0-q2, which rayflow runs on Arrow batches and Bytewax record
by record, its only path) and the ``stateful_map_batches`` ones (q18, q19), which Bytewax
expresses with its ``stateful_batch``: the same function, once per key and batch. Bytewax
is in the ``peers`` extra; without it the rows are left out.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

QUERIES = ("q0", "q1", "q2", "q18", "q19")
CHUNK = 16_384


def available() -> bool:
    try:
        import bytewax  # noqa: F401
    except ImportError:
        return False
    return True


def bytewax_run(query: str, n: int, timeout_s: float = 600) -> dict:
    """One run in a fresh process: ``{"wall_s", "cpu_s", "per_core", "outputs", ...}``."""
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), query, str(n)],
                         capture_output=True, text=True, timeout=timeout_s, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _flow(query: str, n: int, counter: list):
    import bytewax.operators as op
    import numpy as np
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import DynamicSource, StatelessSourcePartition
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    from rayflow.nexmark import NexmarkGenerator
    from rayflow.nexmark import queries as Q

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_nexmark import CONFIG

    class Events(StatelessSourcePartition):
        def __init__(self):
            self.gen, self.lo = NexmarkGenerator(CONFIG), 0

        def next_batch(self):
            if self.lo >= n:
                raise StopIteration
            hi = min(n, self.lo + CHUNK)
            batch = self.gen.rows(np.arange(self.lo, hi))
            self.lo = hi
            return batch

    class Source(DynamicSource):
        def build(self, step_id, worker_index, worker_count):
            return Events()

    class Drop(StatelessSinkPartition):
        def write_batch(self, items):
            counter[0] += len(items)

    class Sink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return Drop()

    flow = Dataflow(f"nexmark-{query}")
    events = op.input("events", flow, Source())
    if query in ("q0", "q1"):
        row = Q._q0_row if query == "q0" else Q._q1_row
        out = op.map(query, op.filter("bids", events, Q._is_bid), row)
    elif query == "q2":
        out = op.map("q2", op.filter("q2-filter", events, Q._q2_keep), Q._q2_row)
    elif query in ("q18", "q19"):
        bids = op.filter("bids", events, Q._is_bid)
        if query == "q18":
            keyed = op.key_on("key", bids, lambda e: f"{e['bidder']}:{e['auction']}")
            fn = Q._q18_latest
        else:
            keyed = op.key_on("key", bids, lambda e: str(e["auction"]))
            fn = Q._q19_top

        class PerKey(op.StatefulBatchLogic):
            """rayflow's per-key function: ``fn(state, values) -> (state, outputs)``."""

            def __init__(self, state):
                self.state = state

            def on_batch(self, values):
                self.state, outputs = fn(self.state, values)
                return outputs, False

            def snapshot(self):
                return self.state

        out = op.stateful_batch(query, keyed, PerKey)
    else:
        raise SystemExit(f"no Bytewax flow for {query}")
    op.output("out", out, Sink())
    return flow


def main(query: str, n: int) -> None:
    from bytewax.run import cli_main
    from peers_stream import _version

    counter = [0]
    flow = _flow(query, n, counter)
    t0, c0 = time.perf_counter(), time.process_time()
    cli_main(flow, workers_per_process=1)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    print(json.dumps({"query": query, "events": n, "wall_s": wall, "cpu_s": cpu,
                      "per_core": n / cpu, "events_s": n / wall, "outputs": counter[0],
                      "version": _version("bytewax")}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
