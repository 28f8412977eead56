"""Autoscaling experiment on Ray's fake multi-node provider (cluster/local-autoscale.yaml).

    python benchmarks/bench_autoscale.py            # ~4 min; writes results/autoscale.json + .png

A private autoscaling head (1 CPU; workers of 2 CPUs, at most 3, idle timeout 6 s) and the
embedded Kafka broker. Timeline:

1. **Stream** Kafka -> ``work`` (1 ms per record) -> Kafka, with every step actor asking for
   1 CPU (``stream.actor_num_cpus=1``) so that the autoscaler sees the stream's demand.
   Load: 300 rec/s, then 2,400 rec/s (more than one ``work`` instance can do), then 300 rec/s.
   A controller watches the backlog (records produced minus records written) and rescales
   ``work`` from a savepoint (``Job.rescale``): 1 -> 4 instances when the backlog grows,
   back to 1 when the load is low and the backlog drained. The new instances' CPUs make the
   autoscaler add nodes; the way back lets them go idle.
2. **MPI stage**: Cannon (n=768, 2x2 = 4 ranks of 1 CPU) needs more CPUs than the head has:
   the gang waits while the autoscaler adds workers.
   It is requested once the stream's nodes have gone (from the head alone).
3. **Idle**, after the stream and after the gang: the cluster should return to the head alone
   within the idle timeout plus the autoscaler's reaction time (no rayflow actor may pin a node).

Recorded every 0.5 s: alive nodes and cluster CPUs. From the output topic: rate and latency
(outTime - eventTime) per second. Checked: every produced record was written (none lost
across the rescales; duplicates counted).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

import rayflow as rf  # sets RAY_AUTH_MODE=token before Ray is imported

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "cluster" / "local-autoscale.yaml"
WORK_S = 0.001  # per record in the `work` step: one instance does ~1,000 rec/s at most


def work(record: bytes) -> bytes:
    time.sleep(WORK_S)
    return record


def stamp(record: bytes, in_time: float, out_time: float) -> bytes:
    return b"%s,%d,%d" % (record, in_time * 1000, out_time * 1000)


class Producer(threading.Thread):
    """Writes ``id,eventTimeMs`` records at a rate that follows ``profile`` [(secs, rate)]."""

    def __init__(self, bootstrap: str, topic: str, profile: list[tuple[float, int]]):
        super().__init__(daemon=True)
        from kafka import KafkaProducer

        self.p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        self.topic, self.profile = topic, profile
        self.sent = 0
        self.phase_marks: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        for secs, rate in self.profile:
            self.phase_marks.append((time.time(), rate))
            end = time.time() + secs
            tick = 0.05
            while time.time() < end:
                t0 = time.time()
                n = max(1, int(rate * tick))
                now_ms = int(t0 * 1000)
                for _ in range(n):
                    self.p.send(self.topic, b"%d,%d" % (self.sent, now_ms))
                    self.sent += 1
                time.sleep(max(0.0, tick - (time.time() - t0)))
        self.p.flush()
        self.phase_marks.append((time.time(), 0))
        self.done.set()


class Sampler(threading.Thread):
    """Alive nodes and cluster CPUs every ``every_s``."""

    def __init__(self, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.every_s, self.rows, self.stop = every_s, [], threading.Event()

    def run(self) -> None:
        import ray

        while not self.stop.is_set():
            try:
                nodes = [n for n in ray.nodes() if n["Alive"]]
                cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
                self.rows.append({"t": time.time(), "nodes": len(nodes), "cpus": cpus})
            except Exception:  # noqa: BLE001 - a node going away mid-call
                pass
            self.stop.wait(self.every_s)

    def nodes_now(self) -> int:
        return self.rows[-1]["nodes"] if self.rows else 0

    def wait_nodes(self, pred, timeout_s: float) -> float | None:
        """Seconds until ``pred(nodes)`` holds, or None on timeout."""
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if self.rows and pred(self.rows[-1]["nodes"]):
                return self.rows[-1]["t"] - t0 if self.rows[-1]["t"] > t0 else 0.0
            time.sleep(0.2)
        return None


def build_flow(bs: str, topic_in: str, topic_out: str, parallelism: int):
    flow = rf.Dataflow("autoscale")
    (flow.source("source", rf.KafkaSource(topic_in, bootstrap=bs))
         .rebalance()
         .map("work", work, parallelism=parallelism)
         .sink("sink", rf.KafkaSink(topic_out, bootstrap=bs, stamp=stamp), parallelism=1))
    return flow


def read_output(bs: str, topic: str) -> list[tuple[int, int, int, int]]:
    from rayflow.connectors.kafka import read_values

    return [tuple(int(x) for x in v.split(b",")) for v in read_values(bs, topic,
                                                                      "read_uncommitted")]


def per_second(records, t0: float) -> list[dict]:
    """Rate and latency percentiles per second of outTime."""
    if not records:
        return []
    arr = np.array(records, dtype=np.int64)
    out_s = arr[:, 3] / 1000.0 - t0
    lat = (arr[:, 3] - arr[:, 1]).astype(float)
    rows = []
    for sec in range(int(out_s.min()), int(out_s.max()) + 1):
        m = (out_s >= sec) & (out_s < sec + 1)
        if m.any():
            rows.append({"t": sec, "rate": int(m.sum()),
                         "lat_p50_ms": float(np.percentile(lat[m], 50)),
                         "lat_p99_ms": float(np.percentile(lat[m], 99))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="shorter phases")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    args = ap.parse_args()
    if args.plot_only:
        plot(json.loads((RESULTS_DIR / "autoscale.json").read_text()),
             RESULTS_DIR / "autoscale.png")
        return
    scale = 0.5 if args.quick else 1.0
    profile = [(15 * scale, 300), (40 * scale, 2400), (45 * scale, 300)]

    from rayflow.connectors.kafka import create_topic
    from rayflow.deploy.local import start_head, stop_head
    from rayflow.deploy.spec import validate_file

    spec = validate_file(SPEC)
    idle_timeout_s = spec.idle_timeout_minutes * 60
    head = start_head(num_cpus=1, autoscaling_config=SPEC, object_store_mb=150)
    broker = rf.EmbeddedBroker().start()
    events: list[dict] = []
    result: dict = {"spec": str(SPEC.relative_to(ROOT)), "idle_timeout_s": idle_timeout_s,
                    "head_start_s": head.started_s}
    try:
        import ray

        ray.init(address=head.address, log_to_driver=False)
        sampler = Sampler()
        sampler.start()
        bs = broker.bootstrap
        create_topic(bs, "as-in", 4)
        create_topic(bs, "as-out", 1)
        t0 = time.time()

        def event(name: str, **kw) -> None:
            events.append({"t": round(time.time() - t0, 2), "event": name,
                           "nodes": sampler.nodes_now(), **kw})
            print(f"[{time.time() - t0:6.1f}s] {name} {kw} nodes={sampler.nodes_now()}",
                  flush=True)

        time.sleep(2)
        event("start", min_nodes=sampler.nodes_now())
        cfg = dict(stream={"actor_num_cpus": 1, "batch_size": 500, "linger_ms": 20},
                   checkpoint={"interval_s": 1.0, "processing_guarantee": "at_least_once"})
        ts = time.time()
        job = rf.run(build_flow(bs, "as-in", "as-out", 1), background=True, **cfg)
        event("stream_started", parallelism=1, start_s=round(time.time() - ts, 2))
        prod = Producer(bs, "as-in", profile)
        prod.start()
        written_before = 0  # records written by earlier jobs (before a rescale)
        parallelism, high_seen = 1, False
        rescales = []
        last_sent, last_t = 0, time.time()
        while not prod.done.is_set():
            time.sleep(1.0)
            sent, now = prod.sent, time.time()
            rate = (sent - last_sent) / (now - last_t)
            last_sent, last_t = sent, now
            written = written_before + job.metrics()["sink"]["records_in"]
            backlog = sent - written
            if parallelism == 1 and backlog > 1500:
                ts = time.time()
                n_before = sampler.nodes_now()
                old, job = job, job.rescale({"work": 4})
                written_before += old.metrics()["sink"]["records_in"]  # final, after the stop
                rescales.append({"t": round(ts - t0, 2), "to": 4, "backlog": backlog,
                                 "rescale_s": round(time.time() - ts, 2),
                                 "nodes_before": n_before, "nodes_after": sampler.nodes_now()})
                parallelism, high_seen = 4, True
                event("rescaled", parallelism=4, rescale_s=rescales[-1]["rescale_s"])
            elif parallelism == 4 and high_seen and rate < 600 and backlog < 300:
                ts = time.time()
                old, job = job, job.rescale({"work": 1})
                written_before += old.metrics()["sink"]["records_in"]
                rescales.append({"t": round(ts - t0, 2), "to": 1, "backlog": backlog,
                                 "rescale_s": round(time.time() - ts, 2),
                                 "nodes_before": sampler.nodes_now()})
                parallelism = 1
                event("rescaled", parallelism=1, rescale_s=rescales[-1]["rescale_s"])
                t_down = time.time()
        event("load_end", sent=prod.sent)
        # let the last records through, then stop at a savepoint (nothing in flight is lost)
        deadline = time.time() + 30
        while time.time() < deadline and written_before + job.metrics()["sink"][
                "records_in"] < prod.sent:
            time.sleep(0.5)
        job.stop(savepoint=True)
        event("stream_stopped")
        if rescales and rescales[-1]["to"] == 1:
            rescales[-1]["nodes_after_down_rescale_min"] = min(
                r["nodes"] for r in sampler.rows if r["t"] >= t_down)
        # the stream's actors are gone: no node may stay pinned
        t_stream_end = time.time()
        back_stream = sampler.wait_nodes(lambda n: n <= 1, timeout_s=120)
        event("back_to_min_after_stream", seconds=back_stream)
        # MPI stage: 4 ranks of 1 CPU; the head has 1
        from rayflow.hpc import BlockDataset, cannon_matmul

        rng = np.random.default_rng(0)
        a, b = rng.random((768, 768)), rng.random((768, 768))
        A, B = BlockDataset.from_numpy(a, (2, 2)), BlockDataset.from_numpy(b, (2, 2))
        n_before = sampler.nodes_now()
        ts = time.time()
        event("gang_requested", ranks=4, nodes_before=n_before)
        C = cannon_matmul(A, B, gang_timeout_s=180)
        err = float(np.abs(C.to_numpy() - a @ b).max())
        gang_s = time.time() - ts
        event("gang_done", seconds=round(gang_s, 2), max_abs_err=err)
        nodes_in_gang = max(r["nodes"] for r in sampler.rows if r["t"] >= ts)
        gang_up = next((r["t"] - ts for r in sampler.rows if r["t"] >= ts
                        and r["nodes"] >= nodes_in_gang), None)
        del C, A, B
        # idle: back to the minimum?
        t_idle = time.time()
        back = sampler.wait_nodes(lambda n: n <= 1, timeout_s=120)
        event("back_to_min_after_gang", seconds=back)
        time.sleep(1)
        sampler.stop.set()
        sampler.join()

        recs = read_output(bs, "as-out")
        ids = [r[0] for r in recs]
        distinct = set(ids)
        timeline = per_second(recs, t0)
        rows = [{"t": round(r["t"] - t0, 2), "nodes": r["nodes"], "cpus": r["cpus"]}
                for r in sampler.rows]
        # scale-up: from demand to the peak node count of that phase
        first_rescale = next((r for r in rescales if r["to"] == 4), None)
        up = None
        if first_rescale:
            peak = max(r["nodes"] for r in rows if first_rescale["t"] <= r["t"]
                       <= first_rescale["t"] + 60)
            reach = next(r["t"] for r in rows if r["t"] >= first_rescale["t"]
                         and r["nodes"] >= peak)
            up = {"from_nodes": first_rescale["nodes_before"], "to_nodes": peak,
                  "seconds": round(reach - first_rescale["t"], 2),
                  "rescale_s": first_rescale["rescale_s"]}
        stream_start = next(e for e in events if e["event"] == "stream_started")
        result.update({
            "profile": [{"seconds": s, "rate": r} for s, r in profile],
            "work_ms_per_record": WORK_S * 1000,
            "stream_start": {"start_s": stream_start["start_s"],
                             "nodes_after": stream_start["nodes"]},
            "scale_up_stream": up,
            "rescales": rescales,
            "gang": {"ranks": 4, "nodes_before": n_before, "nodes_during": nodes_in_gang,
                     "scale_up_s": round(gang_up, 2) if gang_up is not None else None,
                     "seconds_incl_scale_up": round(gang_s, 2), "max_abs_err": err},
            "back_to_min_after_stream_s": (round(back_stream, 2)
                                           if back_stream is not None else None),
            "back_to_min_after_gang_s": round(back, 2) if back is not None else None,
            "idle_timeout_note": "back-to-min = idle timeout + autoscaler reaction "
                                 "(update interval 1 s) + node teardown",
            "records": {"produced": prod.sent, "written": len(ids), "distinct": len(distinct),
                        "lost": prod.sent - len(distinct & set(range(prod.sent))),
                        "duplicates": len(ids) - len(distinct)},
            "events": events,
            "nodes_timeline": rows,
            "rate_latency_timeline": timeline,
        })
        write_result("autoscale", result)
        plot(result, RESULTS_DIR / "autoscale.png")
        print(json.dumps({k: v for k, v in result.items() if k not in
                          ("nodes_timeline", "rate_latency_timeline", "events")}, indent=2))
        del t_idle, t_stream_end
    finally:
        try:
            import ray

            ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
        broker.stop()
        stop_head(head)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = result["nodes_timeline"]
    tl = result["rate_latency_timeline"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    axes[0].step([r["t"] for r in nodes], [r["nodes"] for r in nodes], where="post")
    axes[0].set_ylabel("alive nodes")
    axes[1].plot([r["t"] for r in tl], [r["rate"] for r in tl])
    axes[1].set_ylabel("written rec/s")
    axes[2].semilogy([r["t"] for r in tl], [max(r["lat_p50_ms"], 1) for r in tl], label="p50")
    axes[2].semilogy([r["t"] for r in tl], [max(r["lat_p99_ms"], 1) for r in tl], label="p99")
    axes[2].set_ylabel("latency ms")
    axes[2].set_xlabel("seconds")
    axes[2].legend()
    marks = [(r["t"], f"rescale to {r['to']}") for r in result["rescales"]]
    marks += [(e["t"], e["event"].replace("_", " ")) for e in result["events"]
              if e["event"] in ("stream_started", "load_end", "gang_requested", "gang_done")]
    for ax in axes:
        for t, _ in marks:
            ax.axvline(t, color="grey", lw=0.6, ls="--")
    for t, label in marks:
        axes[0].annotate(label, (t, 0.03), xycoords=axes[0].get_xaxis_transform(),
                         rotation=90, fontsize=7, va="bottom", ha="right")
    axes[0].set_title("rayflow on the fake multi-node autoscaler (cluster/local-autoscale.yaml)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
