"""BLAS threads of a rank or task process.

numpy and scipy each ship their own OpenBLAS (``scipy_openblas64_`` and ``scipy_openblas``
in the current wheels), and scipy's is loaded only when ``scipy.linalg.blas`` is first
imported. threadpoolctl limits the libraries loaded when it is called, so a limit set when
a rank starts left scipy's BLAS, loaded later by the first GEMM (Cannon accumulates with
scipy's ``gemm``), at one thread per core in every rank: 16 ranks of 16 threads on a
16-core machine made Cannon three times slower on 16 ranks than on 4.
"""

from __future__ import annotations

import os
from typing import Any

#: the variables the BLAS libraries read when they are loaded
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def limit_blas_threads(threads: int | None) -> Any:
    """Limit every BLAS this process uses to ``threads`` threads; ``None`` or 0: no limit.

    Limits the BLAS libraries already loaded (threadpoolctl) and sets the variables that a
    BLAS loaded later reads when it starts (scipy's, at the first GEMM). Importing scipy's
    BLAS here instead would cost every rank 0.29 s and 29 MB that a stage without scipy
    never needs. Returns threadpoolctl's limiter (``None`` with no limit).
    """
    if not threads:
        return None
    for var in BLAS_THREAD_VARS:
        os.environ[var] = str(threads)
    import numpy  # noqa: F401  - its BLAS
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads, user_api="blas")
