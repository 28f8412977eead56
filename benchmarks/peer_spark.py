"""Apache Spark (pyspark) peers for W5 and W6, run in a subprocess by :mod:`peers`.

    python benchmarks/peer_spark.py cannon 2048 4 3        # n, ranks (local[ranks]), reps
    python benchmarks/peer_spark.py cg 4096 2 3 30         # n, ranks, reps, iterations

The JVM lives in this process (never in a benchmark's), on ``local[ranks]``, one BLAS thread
per task. Same data as the rayflow benchmarks (same seeds). Inputs are cached and
materialised before timing. Prints one line ``PEER-RESULT {json}``.

- ``cannon``: MLlib ``BlockMatrix.multiply`` on a sqrt(ranks) x sqrt(ranks) block grid; the
  product is forced in the JVM (``blocks().count()``), not shipped to Python, inside the
  timed region. Median seconds, GFLOP/s, error against numpy (n <= CHECK_MAX_N).
- ``cg``: the study's Spark CG baseline: A as ``ranks`` cached row blocks, each iteration the
  driver broadcasts p, a map computes ``A_r @ p``, the driver collects q and does the vector
  updates (:func:`rayflow.hpc.algorithms.cg_math.conjugate_gradient`). Median ms per iteration. Note:
  pyspark caches a Python RDD as pickled bytes in the JVM, so every task unpickles its row
  block (one copy of it) before the mat-vec; a Scala job would keep it deserialised.

Set ``PEER_SPARK_DRIVER_MEMORY`` (default 8g) for matrices that need more, and
``PEER_SPARK_JAVA_OPTS`` to add JVM options (e.g. ``--add-modules=jdk.incubator.vector`` for
netlib's VectorBLAS; by default MLlib's gemm runs on netlib's pure-Java BLAS when no system
libblas.so.3 is found, reported as ``jvm_blas``).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from statistics import median

# one BLAS thread here, in the JVM (native BLAS, if any) and in the Python workers, which
# inherit this environment; set before numpy is imported
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

CHECK_MAX_N = 2048  # above this the product is not collected to check it (memory)

_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# pyspark's "Setting default log level" banner prints unless the gateway's logger is
# configured at the root level
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


def _session(ranks: int, app: str):
    """A local[ranks] SparkSession, quiet, one BLAS thread; and the seconds its JVM took."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])
    from pyspark.sql import SparkSession

    tmp = tempfile.mkdtemp(prefix="peer-spark-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    log4j = Path(tmp) / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    b = (SparkSession.builder.master(f"local[{ranks}]").appName(app)
         .config("spark.driver.memory", os.environ.get("PEER_SPARK_DRIVER_MEMORY", "8g"))
         .config("spark.driver.maxResultSize", "4g")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.pyspark.python", sys.executable)
         .config("spark.driver.extraJavaOptions",
                 f"-Dlog4j2.configurationFile=file:{log4j} "
                 + os.environ.get("PEER_SPARK_JAVA_OPTS", "")))
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        b = b.config(f"spark.executorEnv.{v}", "1")
    t0 = time.perf_counter()
    spark = b.getOrCreate()
    jvm_start_s = time.perf_counter() - t0
    spark.sparkContext.setLogLevel("ERROR")
    return spark, jvm_start_s


def _jvm_blas(sc) -> str | None:
    """The BLAS MLlib's gemm runs on: netlib's native (JNI) one when a system libblas.so.3
    loads, else its Java one (Java11BLAS, or VectorBLAS when the JVM has
    jdk.incubator.vector), as mllib.linalg.BLAS.nativeBLAS picks it. Informational only."""
    netlib = sc._jvm.dev.ludovic.netlib.blas
    for impl in (netlib.NativeBLAS, netlib.JavaBLAS):
        try:
            return impl.getInstance().getClass().getName()
        except Exception:
            continue
    return None


def cannon(n: int, ranks: int, reps: int) -> dict:
    from pyspark.mllib.linalg import DenseMatrix
    from pyspark.mllib.linalg.distributed import BlockMatrix

    p = int(round(ranks ** 0.5))
    assert p * p == ranks and n % p == 0, "a square number of ranks whose root divides n"
    s = n // p
    rng = np.random.default_rng(n)  # as bench_cannon.py builds A and B
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))

    spark, jvm_start_s = _session(ranks, f"peer-cannon-{n}")
    try:
        sc = spark.sparkContext

        def blocks(m: np.ndarray) -> BlockMatrix:
            parts = [((i, j), DenseMatrix(s, s, m[i * s:(i + 1) * s, j * s:(j + 1) * s]
                                          .ravel(order="F")))  # MLlib is column-major
                     for i in range(p) for j in range(p)]
            bm = BlockMatrix(sc.parallelize(parts, p * p), s, s, n, n).cache()
            bm._java_matrix_wrapper._java_model.blocks().count()  # materialised in the JVM
            return bm

        t0 = time.perf_counter()
        A, B = blocks(a), blocks(b)
        load_s = time.perf_counter() - t0

        def run() -> BlockMatrix:
            c = A.multiply(B)
            c._java_matrix_wrapper._java_model.blocks().count()  # force the product
            return c

        t0 = time.perf_counter()
        run()  # warm-up: JIT, Python-free JVM code paths, shuffle files
        warmup_s = time.perf_counter() - t0
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            c = run()
            times.append(time.perf_counter() - t0)
        err = None
        if n <= CHECK_MAX_N:
            with threadpool_limits(1, user_api="blas"):
                ref = a @ b
            got = c.toLocalMatrix().toArray()
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
        t = median(times)
        return {"peer": "spark", "n": n, "ranks": ranks, "median_s": t, "runs_s": times,
                "gflops": 2.0 * n**3 / t / 1e9, "rel_error_f64": err,
                "grid": [p, p], "block_size": s, "master": f"local[{ranks}]",
                "warmup_s": warmup_s, "load_s": load_s, "jvm_start_s": jvm_start_s,
                "jvm_blas": _jvm_blas(sc), "version": spark.version}
    finally:
        spark.stop()


def cg(n: int, ranks: int, reps: int, iters: int) -> dict:
    from bench_cg import _spd

    from rayflow.hpc.algorithms.cg_math import conjugate_gradient

    a, b = _spd(n, seed=n)
    with threadpool_limits(1, user_api="blas"):
        x_ref = conjugate_gradient(lambda v: a @ v, np.dot, b, tol=0.0, max_iter=iters)[0]

    spark, jvm_start_s = _session(ranks, f"peer-cg-{n}")
    try:
        sc = spark.sparkContext
        rows = np.array_split(np.arange(n), ranks)
        t0 = time.perf_counter()
        A = sc.parallelize([(k, np.ascontiguousarray(a[r])) for k, r in enumerate(rows)],
                           ranks).cache()
        A.count()  # materialised (cached) before timing
        load_s = time.perf_counter() - t0
        a = None  # the driver keeps b and the vectors only

        def matvec(v: np.ndarray) -> np.ndarray:
            bv = sc.broadcast(v)
            try:
                parts = A.map(lambda kv: (kv[0], kv[1] @ bv.value)).collect()
            finally:
                bv.unpersist()
            return np.concatenate([q for _, q in sorted(parts, key=lambda kq: kq[0])])

        per_it = []
        with threadpool_limits(1, user_api="blas"):
            t0 = time.perf_counter()
            conjugate_gradient(matvec, np.dot, b, tol=0.0, max_iter=3)  # warm-up
            warmup_s = time.perf_counter() - t0
            for _ in range(reps):
                t0 = time.perf_counter()
                x, _, st = conjugate_gradient(matvec, np.dot, b, tol=0.0, max_iter=iters)
                per_it.append((time.perf_counter() - t0) / st.iteration * 1e3)
        diff = float(np.abs(x - x_ref).max() / np.abs(x_ref).max())
        return {"peer": "spark", "n": n, "ranks": ranks, "iters": iters,
                "ms_per_it": median(per_it), "runs_ms_per_it": per_it,
                "rel_diff_vs_numpy_x": diff, "master": f"local[{ranks}]",
                "warmup_s": warmup_s, "load_s": load_s, "jvm_start_s": jvm_start_s,
                "version": spark.version}
    finally:
        spark.stop()


def main(argv: list[str]) -> int:
    usage = "usage: peer_spark.py cannon N RANKS REPS | cg N RANKS REPS ITERS"
    if len(argv) < 4 or argv[0] not in ("cannon", "cg") or (argv[0] == "cg" and len(argv) < 5):
        print(usage, file=sys.stderr)
        return 2
    kind, n, ranks, reps = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    try:
        out = cannon(n, ranks, reps) if kind == "cannon" else cg(n, ranks, reps, int(argv[4]))
    except Exception as e:  # the JVM's traces are long: end stderr with a one-line summary
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:500]
        print(f"PEER-ERROR peer_spark {' '.join(argv)}: {type(e).__name__}: {first}",
              file=sys.stderr, flush=True)
        return 1
    print("PEER-RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
