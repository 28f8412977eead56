"""MPI stages on a laptop-sized embedded Ray, in a fresh interpreter (the session's Ray has 8
logical CPUs): the README's stage runs on 2 CPUs with the default settings, and a user error
is reported once, with the caller's gang kept."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

_USER_ERROR = textwrap.dedent('''
    import gc, time
    from rayflow.hpc import Gang

    def boom(comm, block):
        if comm.rank == 1:
            raise KeyError("bad-block-7f3a")
        comm.barrier()  # rank 0 waits on rank 1
        return block

    g = Gang(2).start()
    try:
        mpimap(boom, BlockDataset.from_numpy(np.arange(4.0), 2), gang=g)
    except KeyError as err:
        print("CAUGHT", "bad-block-7f3a" in str(err))
    print("KEPT", g.started, g.starts)
    gc.collect()
    time.sleep(3)  # Ray logs unread errors when their refs are freed
    print("DONE")
''')


@pytest.mark.slow  # a fresh Ray and four gangs on a loaded 2-core VM: 60-150 s
@pytest.mark.timeout(600)
def test_readme_stage_runs_on_a_2_cpu_local_ray_with_default_settings(tmp_path):
    code = re.search(r"## An MPI stage in ten lines\n\n```python\n(.*?)```", README.read_text(),
                     re.S).group(1)
    script = "\n".join([
        "import rayflow",
        "rayflow.init(num_cpus=2)  # a 2-core laptop",
        code,
        "import ray",
        "assert ray.cluster_resources()['CPU'] == 2",
        "print('README_OK', C.shape, x.shape)",
        _USER_ERROR,
    ])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.pop("RAYFLOW_HPC__RANK_NUM_CPUS", None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=540)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "README_OK (1024, 1024) (512,)" in proc.stdout
    assert "CAUGHT True" in proc.stdout and "KEPT True 1" in proc.stdout
    assert "DONE" in proc.stdout
    # printed by nobody but the script: no "Unhandled error" logs of the same exception
    assert "Unhandled error" not in out, out[-4000:]
    assert out.count("bad-block-7f3a") == 0, out[-4000:]


def test_init_is_public_and_refuses_a_second_different_ray(ray_session):
    import rayflow
    from rayflow import _raycontext

    assert "init" in rayflow.__all__
    assert rayflow.init() is ray_session  # already running: returns it
    assert _raycontext.is_embedded()  # the session's Ray was started here, by address "local"
    with pytest.raises(RuntimeError, match="Ray already runs in this process"):
        rayflow.init(num_cpus=4)


@pytest.mark.parametrize("env, address", [
    (None, None), ("10.0.0.5:6379", "10.0.0.5:6379"), ("ray://head:10001", "ray://head:10001"),
    ("http://127.0.0.1:8265", None),  # a dashboard URL for job submission, not a cluster
])
def test_a_stage_without_init_joins_the_job_cluster_or_starts_the_embedded_ray(
    monkeypatch, env, address
):
    import ray

    from rayflow import _raycontext

    asked = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(_raycontext, "ensure_ray", lambda a=None, *_, **__: asked.append(a))
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    _raycontext.ensure_ray_default()
    assert asked == [address]
