"""Multi-node scenarios on ``ray.cluster_utils.Cluster``, one per process.

    python tests/deploy/multinode_scenarios.py gangs|gang_growth|node_loss|node_loss_sink

Each scenario builds its own simulated cluster (private GCS port and temp dir; no dashboard),
runs, prints one JSON line ``RESULT {...}`` and exits; tests/deploy/test_multinode.py asserts
on it. A separate process per scenario keeps these clusters away from the session-wide local
Ray of the other tests (one Ray per driver process).
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import threading
import time

import rayflow as rf  # noqa: F401 - sets RAY_AUTH_MODE=token before Ray is imported

# fast node-death detection: the node-loss scenario should not wait ~15 s for the GCS
SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                 "health_check_initial_delay_ms": 0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_cluster(head_cpus: float, workers: list[float]):
    import ray
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="rfc-", dir="/tmp")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head_cpus, "gcs_server_port": _free_port(), "temp_dir": tmp,
        "include_dashboard": False, "object_store_memory": 100 * 2**20,
        "_system_config": SYSTEM_CONFIG})
    cluster.rf_temp_dir = tmp
    nodes = [cluster.add_node(num_cpus=c, object_store_memory=100 * 2**20) for c in workers]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    # the scheduler's resource view lags node registration on a loaded machine: SPREAD only
    # uses nodes it already sees, so wait until every node's CPUs are in the view
    want = head_cpus + sum(workers)
    deadline = time.time() + 60
    while ray.available_resources().get("CPU", 0) < want and time.time() < deadline:
        time.sleep(0.2)
    return cluster, nodes


def actor_nodes(handles) -> list[str]:
    """Node id of each actor (from the GCS actor table; no dashboard needed)."""
    import ray

    table = ray._private.state.actors()
    return [table[h._actor_id.hex()]["Address"]["NodeID"] for h in handles]


def scenario_gangs() -> dict:
    """Gangs honour their strategy; one that cannot fit fails with GangSchedulingError."""
    import ray

    from rayflow.errors import GangSchedulingError
    from rayflow.hpc import BlockDataset, Gang, mpimap

    cluster, _ = make_cluster(2, [2, 2])
    res: dict = {"nodes": [x["NodeID"] for x in ray.nodes() if x["Alive"]]}
    with Gang(3, strategy="STRICT_SPREAD", gang_timeout_s=30) as g:
        res["strict_spread"] = list(g.node_ids)
        import numpy as np

        ds = BlockDataset.from_numpy(np.arange(3.0).reshape(3, 1), (3, 1))
        out = mpimap(lambda comm, b: b * 0 + comm.allreduce(float(b.sum())), ds, gang=g)
        res["allreduce"] = out.to_numpy().ravel().tolist()
    with Gang(2, strategy="STRICT_PACK", gang_timeout_s=30) as g:
        res["strict_pack"] = list(g.node_ids)
    for name, kw in {"too_many_nodes": dict(size=4, strategy="STRICT_SPREAD"),
                     "too_many_cpus": dict(size=7, strategy="PACK")}.items():
        t0 = time.time()
        try:
            Gang(gang_timeout_s=3, **kw).start()
            res[name] = "placed"
        except GangSchedulingError as exc:
            res[name] = {"error": str(exc), "after_s": round(time.time() - t0, 2)}
    # after the failures nothing is left reserved: the whole cluster is free again
    time.sleep(1)
    res["free_cpus_after"] = ray.available_resources().get("CPU", 0)
    res["_cluster"] = cluster
    return res


def scenario_gang_growth() -> dict:
    """SPREAD uses every node; a gang waiting for a node is placed when one joins."""
    import ray

    from rayflow.hpc import Gang

    cluster, _ = make_cluster(2, [2, 2])
    res: dict = {"nodes": [x["NodeID"] for x in ray.nodes() if x["Alive"]]}
    with Gang(6, strategy="SPREAD", gang_timeout_s=30) as g:
        res["spread6"] = list(g.node_ids)
    # a gang waiting for a node gets it when the node joins
    box: dict = {}

    def start_big():
        t0 = time.time()
        try:
            with Gang(4, strategy="STRICT_SPREAD", gang_timeout_s=60) as g:
                box["nodes"] = list(g.node_ids)
        except Exception as exc:  # noqa: BLE001
            box["error"] = repr(exc)
        box["after_s"] = round(time.time() - t0, 2)

    t = threading.Thread(target=start_big)
    t.start()
    time.sleep(2)
    cluster.add_node(num_cpus=2, object_store_memory=100 * 2**20)
    t.join(90)
    res["waiting_gang"] = box
    res["_cluster"] = cluster
    return res


def scenario_node_loss(victim_kind: str = "steps") -> dict:
    """A worker node dies mid-stream; the job recovers from its checkpoint, exactly once.

    ``victim_kind="steps"`` removes the worker with the most step instances but not the sink
    (nor the coordinator); ``"sink"`` removes the sink's node (see test_multinode.py)."""
    import ray

    from rayflow.connectors.kafka import create_topic, produce

    cluster, workers = make_cluster(2, [1, 1, 1])
    broker = rf.EmbeddedBroker().start()
    bs = broker.bootstrap
    n = 4000  # long enough that the stream is mid-flight when the node goes (~3 s left)
    create_topic(bs, "in", 2)
    produce(bs, "in", (b"%d" % i for i in range(n)), 2)
    # SPREAD is best effort: if no worker fits the victim kind (e.g. every worker without
    # the sink holds no step), start over on a fresh output topic, at most 3 times
    for attempt in range(3):
        out = f"out{attempt}"
        create_topic(bs, out, 1)
        flow = rf.Dataflow("nodeloss")
        (flow.source("source", rf.KafkaSource("in", bootstrap=bs, bounded=True), parallelism=2)
             .map("id", lambda r: (time.sleep(0.003), r)[1], parallelism=4)
             .sink("sink", rf.KafkaSink(out, bootstrap=bs),
                   parallelism=3 if victim_kind == "sink" else 1))
        job = rf.run(flow, background=True, stream={"batch_size": 20},
                     checkpoint={"interval_s": 0.3, "processing_guarantee": "exactly_once"})
        deadline = time.time() + 60
        while time.time() < deadline and not (
                any(c["status"] == "completed" for c in job.checkpoints())
                and job.metrics()["sink"]["records_in"] > 150):
            time.sleep(0.1)
        keys = sorted(job.hosts)
        placement = dict(zip(keys, actor_nodes([job.hosts[k] for k in keys])))
        nodes = [x["NodeID"] for x in ray.nodes() if x["Alive"]]
        coord = actor_nodes([job.coordinator])[0]
        by_id = {w.node_id: w for w in workers}
        sink_nodes = {v for (s, _), v in placement.items() if s == "sink"}
        counts = {nid: sum(v == nid for v in placement.values()) for nid in by_id
                  if nid != coord and (nid in sink_nodes) == (victim_kind == "sink")}
        counts = {nid: c for nid, c in counts.items() if c}
        if counts:
            break
        job.cancel()
    else:
        return {"skipped": f"no worker fits victim_kind={victim_kind}", "_cluster": cluster}
    victim = max(counts, key=counts.get)
    lost_steps = sorted(f"{s}/{i}" for (s, i), v in placement.items() if v == victim)
    t_kill = time.time()
    cluster.remove_node(by_id[victim], allow_graceful=False)
    job.wait(180)
    got = _read(bs, out, "read_committed")
    raw = set(_read(bs, out, "read_uncommitted"))
    after = actor_nodes([h for h in job.hosts.values()]) if job.hosts else []
    broker.stop()
    return {"nodes": nodes, "placement": {f"{s}/{i}": v for (s, i), v in placement.items()},
            "victim": victim, "lost_steps": lost_steps, "victim_had_sink": victim in sink_nodes,
            "attempts": attempt + 1, "recoveries": job.recoveries,
            "recovered_s": round(job.recoveries[0]["at"] + job.recoveries[0]["restart_s"]
                                 - t_kill, 2) if job.recoveries else None,
            "committed": len(got), "distinct": len(set(got)),
            "missing": len(set(range(n)) - set(got)), "n": n, "state": job.state,
            # diagnosis: ids not even in the log (lost) vs written but not visible committed
            "missing_uncommitted": len(set(range(n)) - raw),
            "alive_nodes": sum(x["Alive"] for x in ray.nodes()), "after": after,
            "_cluster": cluster}


def _read(bs: str, topic: str, isolation: str) -> list[int]:
    from rayflow.connectors.kafka import read_values

    return [int(v) for v in read_values(bs, topic, isolation)]


def scenario_node_loss_sink() -> dict:
    return scenario_node_loss("sink")


def main() -> None:
    name = sys.argv[1]
    res = globals()[f"scenario_{name}"]()
    cluster = res.pop("_cluster")
    print("RESULT " + json.dumps(res, default=str), flush=True)
    import ray

    ray.shutdown()
    cluster.shutdown()
    import shutil

    shutil.rmtree(cluster.rf_temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
