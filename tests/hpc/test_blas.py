"""limit_blas_threads: every BLAS a rank uses is limited, scipy's (loaded later) included."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_CHILD = """
import json, sys
import numpy as np
from threadpoolctl import threadpool_info
if sys.argv[1] == "rayflow":
    from rayflow.hpc.blas import limit_blas_threads
    keep = limit_blas_threads(1)
else:  # what a rank did before: limit what is loaded, then a GEMM loads scipy's BLAS
    from threadpoolctl import threadpool_limits
    keep = threadpool_limits(limits=1, user_api="blas")
from rayflow.hpc.algorithms.cannon import _accumulate
c = np.zeros((64, 64))
_accumulate(c, np.ones((64, 64)), np.ones((64, 64)))
assert (c == 64).all()
print(json.dumps(sorted((i["filepath"], i["num_threads"]) for i in threadpool_info()
                        if i["user_api"] == "blas")))
"""


def _threads(how: str) -> list:
    # the user's shell asks for 2 BLAS threads (OPENBLAS_NUM_THREADS is read when a BLAS loads)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", _CHILD, how], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_every_blas_is_limited_scipys_too():
    libs = _threads("rayflow")
    assert libs and {n for _, n in libs} == {1}, libs


def test_a_limit_set_before_scipy_loads_misses_scipys_blas():
    """The defect the helper fixes, shown where the two BLAS libraries are distinct."""
    libs = _threads("threadpoolctl")
    if len(libs) < 2:
        pytest.skip("numpy and scipy share one BLAS library here")
    assert sorted(n for _, n in libs) == [1, 2], libs
