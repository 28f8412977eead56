"""Peers for W5 and W6 when they are installed: mpi4py (under ``mpiexec``), Dask and Spark.

Each returns None when its library (or ``mpiexec``, or ``java`` for Spark) is missing, so a
benchmark can print "not installed" instead of failing. Install them with
``pip install -e ".[peers]"`` (mpi4py with the MPICH wheel, dask[array] and pyspark; Spark
also needs a Java 17 runtime on PATH).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent


def mpiexec() -> str | None:
    """``mpiexec`` beside this Python, else on PATH; None without mpi4py."""
    if importlib.util.find_spec("mpi4py") is None:
        return None
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def mpi(kind: str, ranks: int, *args: int, timeout_s: float = 900) -> dict | None:
    """Run ``peer_mpi.py kind args`` on ``ranks`` MPI ranks; rank 0's result, or None."""
    exe = mpiexec()
    if exe is None:
        return None
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [exe, "-n", str(ranks), sys.executable, str(HERE / "peer_mpi.py"), kind,
           *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    for line in proc.stdout.splitlines():
        if line.startswith("PEER-RESULT "):
            return json.loads(line[len("PEER-RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")


def spark_installed() -> bool:
    """pyspark importable and a ``java`` on PATH (or under ``JAVA_HOME``)."""
    return importlib.util.find_spec("pyspark") is not None and _java() is not None


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def spark(kind: str, ranks: int, *args: int, timeout_s: float = 900) -> dict | None:
    """Run ``peer_spark.py kind n ranks args`` (a JVM on ``local[ranks]``, in its own
    process); its result, or None when pyspark or java is missing.

    ``spark("cannon", 4, n, reps)``: MLlib BlockMatrix.multiply on a 2 x 2 block grid.
    ``spark("cg", 2, n, reps, iters)``: the driver-broadcast CG on 2 cached row blocks.
    """
    if not spark_installed():
        return None
    if not args:
        raise ValueError("spark(kind, ranks, n, reps[, iters])")
    n, *rest = args
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE),
                                          os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(HERE / "peer_spark.py"), kind, str(n), str(ranks),
           *map(str, rest)]
    # its own session, so a timeout takes the JVM (and Spark's Python workers) down too
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    for line in out.splitlines():
        if line.startswith("PEER-RESULT "):
            return json.loads(line[len("PEER-RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")


def dask_matmul(a, b, p: int, reps: int) -> dict | None:
    """Dask's blocked ``a @ b`` on a p x p grid, threaded scheduler with p * p workers and
    one BLAS thread each; the inputs are persisted (distributed) before timing."""
    if importlib.util.find_spec("dask") is None:
        return None
    import dask
    import dask.array as da
    import numpy as np
    from threadpoolctl import threadpool_limits

    n = a.shape[0]
    s = n // p
    with threadpool_limits(1, user_api="blas"), dask.config.set(scheduler="threads",
                                                                 num_workers=p * p):
        x, y = da.from_array(a, chunks=(s, s)).persist(), da.from_array(b, chunks=(s, s)).persist()
        (x @ y).compute()  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            c = (x @ y).compute()
            times.append(time.perf_counter() - t0)
    ref = a @ b
    err = float(np.abs(c - ref).max() / np.abs(ref).max())
    return {"peer": "dask", "n": n, "ranks": p * p, "median_s": median(times), "runs_s": times,
            "rel_error_f64": err, "version": dask.__version__}
