"""A gang whose ranks sit on different raylets (``ray.cluster_utils.Cluster``), run alone.

    python tests/hpc/transport_multinode.py   # prints one ``RESULT {json}`` line
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import time

import numpy as np

import rayflow as rf  # noqa: F401 - sets RAY_AUTH_MODE=token before Ray is imported


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(comm, block):
    x = np.arange(5.0) * (comm.rank + 1)
    big = np.arange(300_000.0) + comm.rank  # 2.4 MB in several TCP frames
    got = [comm.recv(0, tag=1) for _ in range(50)] if comm.rank == 1 else None
    if comm.rank == 0:
        for k in range(50):
            comm.send(k, 1, tag=1)
    return {"kinds": comm._t.kinds, "sum": comm.allreduce(x).tolist(),
            "big": float(comm.allreduce(big).sum()), "order": got,
            "gather": comm.allgather(comm.rank)}


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    from rayflow.hpc import BlockDataset, Gang, mpimap

    tmp = tempfile.mkdtemp(prefix="rft-", dir="/tmp")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "gcs_server_port": _free_port(), "temp_dir": tmp,
        "include_dashboard": False, "object_store_memory": 100 * 2**20})
    try:
        cluster.add_node(num_cpus=1, object_store_memory=100 * 2**20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        deadline = time.time() + 60
        while ray.available_resources().get("CPU", 0) < 2 and time.time() < deadline:
            time.sleep(0.2)
        with Gang(2, strategy="STRICT_SPREAD", rank_num_cpus=1, gang_timeout_s=60) as g:
            nodes = list(g.node_ids)
            out = mpimap(_rank, BlockDataset.from_numpy(np.zeros(2), 2), gang=g).blocks()
        print("RESULT " + json.dumps({"nodes": nodes, "ranks": out}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
