"""Multi-node behaviour on a simulated cluster (``ray.cluster_utils.Cluster``).

Each scenario runs in its own process (multinode_scenarios.py) with its own cluster: a
driver holds one Ray, and the other tests share the session-wide local one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("multinode_scenarios.py")


def run_scenario(name: str, timeout_s: float = 240) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), name], capture_output=True, text=True,
                          timeout=timeout_s, cwd=SCRIPT.parents[2])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:] + proc.stderr[-4000:])
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def node_loss():
    """One streaming run on head + 3 workers: placement, then a worker removed mid-stream."""
    return run_scenario("node_loss", timeout_s=300)


def test_stream_operators_spread_across_nodes(node_loss):
    assert len(node_loss["nodes"]) == 4
    used = set(node_loss["placement"].values())
    # 8 step actors of 0 CPUs with SPREAD: at least 3 of the 4 nodes hold some
    assert len(used) >= 3 and used <= set(node_loss["nodes"]), node_loss["placement"]


def test_node_loss_mid_stream_recovers_exactly_once(node_loss):
    res = node_loss
    assert res["lost_steps"], "the removed node hosted no step"
    assert len(res["recoveries"]) >= 1 and res["recoveries"][0]["restored_checkpoint"]
    assert res["state"] == "FINISHED" and res["alive_nodes"] == 3
    # exactly once on read_committed output: every id, none twice
    assert res["committed"] == res["distinct"] == res["n"] and res["missing"] == 0


def test_gangs_honour_strategy_and_a_gang_that_cannot_fit_fails():
    res = run_scenario("gangs")
    assert sorted(res["strict_spread"]) == sorted(res["nodes"])  # one rank per node
    assert res["allreduce"] == [3.0, 3.0, 3.0]
    assert len(set(res["strict_pack"])) == 1
    for name, strategy in (("too_many_nodes", "STRICT_SPREAD"), ("too_many_cpus", "PACK")):
        err = res[name]
        assert err != "placed", name
        assert f"with strategy {strategy}" in err["error"] and "not placed within 3s" in \
            err["error"]
        assert err["after_s"] < 10
    assert res["free_cpus_after"] == 6.0  # failed gangs released their reservations


@pytest.mark.slow
def test_spread_gang_uses_every_node_and_a_waiting_gang_takes_a_new_node():
    res = run_scenario("gang_growth")
    assert set(res["spread6"]) == set(res["nodes"])
    gang = res["waiting_gang"]
    assert "error" not in gang, gang
    assert len(set(gang["nodes"])) == 4 and set(res["nodes"]) < set(gang["nodes"])
