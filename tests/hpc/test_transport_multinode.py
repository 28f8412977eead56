"""Ranks on different raylets talk over TCP (ZeroMQ); the scenario runs in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).with_name("transport_multinode.py")


@pytest.mark.slow
def test_ranks_on_two_nodes_use_tcp_and_agree_with_numpy():
    pytest.importorskip("zmq")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=280, cwd=SCRIPT.parents[2])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(lines[-1][len("RESULT "):])
    assert len(set(res["nodes"])) == 2  # one rank per raylet
    big = float((2 * np.arange(300_000.0) + 1).sum())
    for r, o in enumerate(res["ranks"]):
        assert o["kinds"] == [None, "tcp"] if r == 0 else o["kinds"] == ["tcp", None]
        assert o["sum"] == (np.arange(5.0) * 3).tolist()
        assert o["big"] == big
        assert o["gather"] == [0, 1]
    assert res["ranks"][1]["order"] == list(range(50))
