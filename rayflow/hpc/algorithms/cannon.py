"""Cannon's matrix multiplication as one MPI stage on a ``p x p`` gang.

Usage: ``C = cannon_matmul(a, b, grid=2).to_numpy()``

The initial skew costs nothing here: rank ``(i, j)`` is simply handed the refs of
``A_{i,(i+j) mod p}`` and ``B_{(i+j) mod p,j}`` (:func:`~rayflow.hpc.algorithms.cannon_index.skew_a_source`),
which MPI codes must move with a shift. Then each of the ``p`` rounds sends the A block left
and the B block up *before* the local GEMM, so the transfer overlaps the multiplication, and
receives the next pair after it.
"""

from __future__ import annotations

import numbers
from typing import Any, cast

import numpy as np

from rayflow.hpc.algorithms.cannon_index import grid_side, skew_a_source, skew_b_source
from rayflow.hpc.dataset import BlockDataset, dense_matrix
from rayflow.hpc.stage import mpimap


def _accumulate(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``c += a @ b`` without a temporary product: BLAS GEMM with beta = 1.

    ``c`` is C-ordered, so the GEMM runs on the transposes (``c.T += b.T @ a.T``), which are
    Fortran-ordered views: no copy of any operand when ``a`` and ``b`` are C-contiguous.
    """
    if c.dtype == a.dtype == b.dtype and c.dtype in (np.float32, np.float64) and c.size:
        from scipy.linalg.blas import get_blas_funcs

        gemm = get_blas_funcs("gemm", (c,))
        out = gemm(1.0, b.T, a.T, beta=1.0, c=c.T, overwrite_c=True)
        if out.base is not c:
            c[...] = out.T  # not in place (an unexpected layout): still correct
    else:
        c += a @ b


def cannon_rank(comm, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The rank function: ``C_ij`` from the skewed blocks ``a`` and ``b`` (usable directly).

    Memory per rank: ``C``, the current ``A`` and ``B`` and the next pair (5 blocks). The
    shifts are non-blocking sends straight from the blocks (no copy), started before the GEMM
    so that the transfer overlaps it, and the GEMM accumulates into ``C`` in place.
    """
    p = grid_side(comm.size)
    cart = comm.create_cart((p, p), periods=(True, True))  # the shifts wrap around
    right, left = cart.shift(1, -1)  # A moves left: it goes to ``left``, comes from ``right``
    down, up = cart.shift(0, -1)  # B moves up
    c = np.zeros((a.shape[0], b.shape[1]), dtype=np.result_type(a.dtype, b.dtype))
    for t in range(p):
        last = t == p - 1
        sends = [] if last else [cart.isend(a, left, tag=1), cart.isend(b, up, tag=2)]
        _accumulate(c, a, b)
        if not last:
            a_next = cart.recv(right, tag=1)
            b_next = cart.recv(down, tag=2)
            for req in sends:
                req.wait()
            a, b = a_next, b_next
    return c


def _as_matrix(x: Any, what: str) -> np.ndarray:
    """``x`` as a 2-D numpy array, or a ValueError naming its shape."""
    if hasattr(x, "tocsr"):
        raise ValueError(f"{what} is a scipy.sparse matrix; Cannon multiplies dense blocks "
                         "(pass .toarray())")
    return dense_matrix(x, what)


def _as_grid(x: Any, p: int, what: str) -> BlockDataset:
    if isinstance(x, BlockDataset):
        if x.grid != (p, p):
            raise ValueError(f"{what} has a {x.grid} block grid; Cannon needs ({p}, {p})")
        if x.row_sizes is not None and x.col_sizes is None:
            raise ValueError(f"{what} is a vector dataset of shape {x.shape}; Cannon needs a "
                             "matrix")
        return x
    return BlockDataset.from_numpy(x, (p, p))


def cannon_matmul(
    a: BlockDataset | np.ndarray,
    b: BlockDataset | np.ndarray,
    grid: int | None = None,
    ranks: int | None = None,
    **stage_options: Any,
) -> BlockDataset:
    """``a @ b`` by Cannon's algorithm on a ``grid x grid`` gang.

    Args:
        a: ``m x k`` matrix, numpy or a ``BlockDataset`` on a square grid.
        b: ``k x n`` matrix, same kind; its row split must match ``a``'s column split.
        grid: the grid side ``p`` (``p * p`` ranks); inferred from dataset inputs.
        ranks: alternatively the number of ranks, which must be a perfect square.
        **stage_options: passed to :func:`~rayflow.hpc.stage.mpimap` (gang, backend, ...).

    Returns:
        C as a ``BlockDataset`` on the same grid (``.to_numpy()`` gathers it).

    Raises:
        ValueError: the rank count is not a perfect square, or the shapes do not match.
    """
    if ranks is not None:
        p = grid_side(ranks)
    elif grid is not None:
        if isinstance(grid, bool) or not isinstance(grid, numbers.Integral):
            raise ValueError(f"cannon_matmul: grid must be an int (the grid's side), got "
                             f"{grid!r}")
        p = int(grid)
    elif isinstance(a, BlockDataset):
        p = grid_side(a.num_blocks)
    else:
        p = 1
    if p < 1:
        raise ValueError(f"grid side must be positive, got {p}")
    if not isinstance(a, BlockDataset):
        a = _as_matrix(a, "A")
    if not isinstance(b, BlockDataset):
        b = _as_matrix(b, "B")
    shape_a, shape_b = a.shape, b.shape  # None for a dataset of unknown block sizes
    if shape_a is not None and shape_b is not None and len(shape_a) == len(shape_b) == 2 \
            and shape_a[1] != shape_b[0]:
        raise ValueError(f"shapes {shape_a} and {shape_b} do not multiply")
    A, B = _as_grid(a, p, "A"), _as_grid(b, p, "B")
    if A.col_sizes is not None and B.row_sizes is not None and A.col_sizes != B.row_sizes:
        raise ValueError(f"A's column blocks {A.col_sizes} differ from B's row blocks {B.row_sizes}")
    a_skew = A.take(lambda i, j: skew_a_source(i, j, p))
    b_skew = B.take(lambda i, j: skew_b_source(i, j, p))
    stage_options.setdefault("name", "cannon")
    out = cast(BlockDataset, mpimap(cannon_rank, a_skew, b_skew, **stage_options))  # one output
    return BlockDataset(out.refs, (p, p), A.row_sizes, B.col_sizes, stage=out.stage)
