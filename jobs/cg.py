"""W6 job: solve A x = b (dense SPD or sparse Laplacian) by distributed conjugate gradient.

Usage: ``python jobs/cg.py --n 4096 --ranks 2`` (local) or
``ray job submit -- python jobs/cg.py --address auto --n 8192 --ranks 4``
"""

from __future__ import annotations

import time

import click
import numpy as np


def _dense_rows(n: int, seed: int):
    def make(i, j, rows, cols):
        # Symmetric by construction: entry (r, c) depends only on the unordered pair.
        r = np.arange(rows.start, rows.stop)[:, None]
        c = np.arange(n)[None, :]
        lo, hi = np.minimum(r, c), np.maximum(r, c)
        vals = np.sin(lo * 12.9898 + hi * 78.233 + seed) * 0.5
        vals[np.arange(rows.stop - rows.start), np.arange(rows.start, rows.stop)] += 3 * np.sqrt(n)
        return vals

    return make


def _laplacian_rows(n: int):
    def make(i, j, rows, cols):
        import scipy.sparse as sp

        lap = sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], shape=(n, n), format="csr")
        return lap[rows.start : rows.stop]

    return make


@click.command()
@click.option("--n", default=4096, show_default=True)
@click.option("--ranks", default=2, show_default=True)
@click.option("--sparse", is_flag=True, help="tridiagonal CSR system instead of dense")
@click.option("--backend", type=click.Choice(["ray", "gloo"]), default="ray", show_default=True)
@click.option("--tol", default=1e-10, show_default=True)
@click.option("--max-iter", default=500, show_default=True)
@click.option("--checkpoint-every", default=10, show_default=True)
@click.option("--address", default=None, help="Ray address ('auto' inside ray job submit)")
@click.option("--rank-cpus", default=1.0, show_default=True)
def main(n, ranks, sparse, backend, tol, max_iter, checkpoint_every, address, rank_cpus):
    """Solve a random SPD system and report iterations and time per iteration."""
    from rayflow._raycontext import ensure_ray
    from rayflow.hpc import BlockDataset, cg_solve

    ensure_ray(address, num_cpus=None if address else max(ranks, 2))
    make = _laplacian_rows(n) if sparse else _dense_rows(n, 7)
    A = BlockDataset.from_function(make, (n, n), (ranks, 1))
    b = np.ones(n)
    t0 = time.perf_counter()
    res = cg_solve(A, b, tol=tol, max_iter=max_iter, checkpoint_every=checkpoint_every,
                   backend=backend, rank_num_cpus=rank_cpus)
    print(f"cg n={n} ranks={ranks} {backend} {'sparse' if sparse else 'dense'}: "
          f"{res.iterations} iterations, converged={res.converged}, "
          f"{res.ms_per_iteration:.2f} ms/iteration, stage {time.perf_counter() - t0:.2f}s, "
          f"final residual {res.history[-1]:.3e}")


if __name__ == "__main__":
    main()
