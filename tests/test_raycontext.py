"""Starting the embedded Ray, whatever the program imported first."""

import os
import subprocess
import sys

PROGRAM = """
import ray  # a Ray user's habit: Ray first, then rayflow
import rayflow as rf

flow = rf.Dataflow("ray-first")
flow.source("in", rf.MemorySource([1, 2, 3])).map("double", lambda x: 2 * x).sink(
    "out", rf.CollectSink())
print(sorted(rf.run(flow).collect("out")))
"""


def test_a_program_that_imports_ray_before_rayflow_runs_on_the_embedded_ray():
    """Ray reads its authentication mode when it is imported: rayflow must not ask for
    tokens afterwards (the local instance's processes would want a token the driver does
    not send, and ``rf.run`` failed with InvalidAuthToken)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env["RAYFLOW_RAY__INCLUDE_DASHBOARD"] = "false"
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[2, 4, 6]"
