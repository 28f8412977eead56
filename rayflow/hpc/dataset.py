"""Block datasets: a matrix or vector as a grid of blocks in Ray's object store.

Usage: ``A = BlockDataset.from_numpy(a, grid=(2, 2)); a2 = A.to_numpy()``

Block ``(i, j)`` is one object ref; the refs are kept row-major, which is also the rank order
of an MPI stage over the dataset. Blocks follow ``numpy.array_split`` sizes, so any size splits
without padding. A block may be a numpy array or a ``scipy.sparse`` matrix (CSR row blocks
for CG). The refs are owned by the driver (``ray.put`` here, actor-call return values in
stages, task returns in :meth:`BlockDataset.from_function`), so they outlive the actors that
computed them and a failed stage can re-run from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayflow.hpc.algorithms.cannon_index import offsets, split_sizes


def _ray():
    """Ray, started (the embedded local instance) if nothing started it yet."""
    from rayflow._raycontext import ensure_ray_default

    return ensure_ray_default()


def _grid(grid: Any, what: str = "grid") -> tuple[int, int]:
    """``p`` or ``(rows, cols)`` as a pair of positive ints, or a ValueError naming it."""
    pair = (grid, 1) if isinstance(grid, (int, np.integer)) else tuple(grid) if isinstance(
        grid, (tuple, list)) else None
    if (pair is None or len(pair) != 2
            or not all(isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g >= 1
                       for g in pair)):
        raise ValueError(f"{what} must be p or (rows, cols) of positive ints, got {grid!r}")
    return int(pair[0]), int(pair[1])


def _as_block_source(array: Any) -> Any:
    """``array`` as a 1-D or 2-D numpy array or a CSR matrix (any scipy.sparse format)."""
    if hasattr(array, "tocsr"):  # scipy.sparse: COO and DIA cannot be sliced, CSR can
        if getattr(array, "ndim", 2) != 2:
            return np.asarray(array.toarray())
        return array.tocsr()
    try:
        arr = np.asarray(array)
    except ValueError as err:  # ragged nested lists
        raise ValueError(f"BlockDataset.from_numpy: input is not an array: {err}") from None
    if arr.ndim not in (1, 2):
        raise ValueError(
            "BlockDataset.from_numpy takes a 1-D or 2-D array or a scipy.sparse matrix, "
            f"got shape {arr.shape}"
        )
    return arr


def _make_block(fn, i, j, r0, r1, c0, c1, dtype):
    block = fn(i, j, slice(r0, r1), slice(c0, c1))
    return block if dtype is None else np.asarray(block, dtype=dtype)


_remote_make_block = None


def _remote_block_task():
    global _remote_make_block
    if _remote_make_block is None:
        _remote_make_block = _ray().remote(num_cpus=1)(_make_block)
    return _remote_make_block


def dense_matrix(x: Any, what: str) -> np.ndarray:
    """``x`` (an array or nested lists) as a 2-D numeric numpy array, or a ValueError that
    names ``what`` and its shape."""
    try:
        arr = np.asarray(x)
    except ValueError as err:  # ragged lists
        raise ValueError(f"{what} is not a matrix: {err}") from None
    if arr.ndim != 2:
        raise ValueError(f"{what} must be a 2-D matrix, got shape {arr.shape}")
    if arr.dtype.kind not in "biufc":
        raise ValueError(f"{what} must hold numbers, got dtype {arr.dtype}")
    return arr


@dataclass(frozen=True)
class BlockDataset:
    """A grid of blocks in the object store.

    Attributes:
        refs: object refs of the blocks, row-major.
        grid: ``(block rows, block columns)``.
        row_sizes: rows per block row (``None`` when unknown, e.g. stage outputs).
        col_sizes: columns per block column (``None`` when unknown or for vectors).
        stage: the :class:`~rayflow.hpc.stage.StageInfo` of the stage that produced it.
    """

    refs: tuple
    grid: tuple[int, int]
    row_sizes: tuple[int, ...] | None = None
    col_sizes: tuple[int, ...] | None = None
    stage: Any = field(default=None, compare=False)

    def __post_init__(self):
        if len(self.refs) != self.grid[0] * self.grid[1]:
            raise ValueError(f"{len(self.refs)} refs do not fill a {self.grid} grid")

    # ------------------------------------------------------------ construction
    @classmethod
    def from_numpy(cls, array, grid: int | Sequence[int]) -> BlockDataset:
        """Split ``array`` (1-D, 2-D or scipy.sparse) into a grid and put the blocks.

        Args:
            array: the data: a numpy array (or nested lists), 1-D or 2-D, or a scipy.sparse
                matrix of any format (stored as CSR blocks). A 1-D array is split in ``grid``
                pieces (a ``(p, 1)`` grid).
            grid: ``p`` or ``(rows, cols)``; for 1-D data an int.

        Raises:
            ValueError: the input is not 1-D or 2-D, or the grid does not fit it.
        """
        array = _as_block_source(array)
        gr, gc = _grid(grid)
        ndim = array.ndim
        if ndim == 1 and gc != 1:
            raise ValueError(f"a 1-D array (shape {array.shape}) splits into a (p, 1) grid, "
                             f"not ({gr}, {gc})")
        ray = _ray()
        rs = split_sizes(array.shape[0], gr)
        ro = offsets(rs)
        if ndim == 1:
            refs = [ray.put(np.ascontiguousarray(array[ro[i] : ro[i + 1]])) for i in range(gr)]
            return cls(tuple(refs), (gr, 1), tuple(rs), None)
        cs = split_sizes(array.shape[1], gc)
        co = offsets(cs)
        refs = []
        for i in range(gr):
            for j in range(gc):
                blk = array[ro[i] : ro[i + 1], co[j] : co[j + 1]]
                refs.append(ray.put(blk if hasattr(blk, "tocsr") else np.ascontiguousarray(blk)))
        return cls(tuple(refs), (gr, gc), tuple(rs), tuple(cs))

    @classmethod
    def from_function(
        cls,
        fn: Callable[[int, int, slice, slice], Any],
        shape: Sequence[int],
        grid: int | Sequence[int],
        dtype: Any = None,
    ) -> BlockDataset:
        """Build each block in a Ray task, so the whole matrix never exists on the driver.

        Args:
            fn: ``fn(i, j, rows, cols) -> block`` for grid position ``(i, j)`` covering global
                ``rows`` and ``cols`` (slices); for vectors ``j`` is 0 and ``cols`` is
                ``slice(0, 1)``.
            shape: the global shape, ``(n,)`` or ``(m, n)``.
            grid: ``p`` or ``(rows, cols)``.
            dtype: cast blocks to this dtype (``None`` keeps what ``fn`` returns).
        """
        gr, gc = _grid(grid)
        shape = tuple(shape)
        if len(shape) not in (1, 2) or not all(
                isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
            raise ValueError(f"shape must be (n,) or (m, n) of non-negative ints, got {shape!r}")
        if len(shape) == 1 and gc != 1:
            raise ValueError(f"a vector of shape {shape} splits into a (p, 1) grid, not {grid!r}")
        rs = split_sizes(shape[0], gr)
        ro = offsets(rs)
        cs = split_sizes(shape[1], gc) if len(shape) == 2 else [1]
        co = offsets(cs)
        task = _remote_block_task()
        refs = [
            task.remote(fn, i, j, ro[i], ro[i + 1], co[j], co[j + 1], dtype)
            for i in range(gr)
            for j in range(gc)
        ]
        return cls(tuple(refs), (gr, gc), tuple(rs), tuple(cs) if len(shape) == 2 else None)

    # ----------------------------------------------------------------- access
    @property
    def num_blocks(self) -> int:
        return len(self.refs)

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The global shape when the block sizes are known."""
        if self.row_sizes is None:
            return None
        if self.col_sizes is None:
            return (sum(self.row_sizes),)
        return (sum(self.row_sizes), sum(self.col_sizes))

    def block(self, i: int, j: int = 0):
        """The object ref of block ``(i, j)``."""
        return self.refs[i * self.grid[1] + j]

    def take(self, source: Callable[[int, int], tuple[int, int]]) -> BlockDataset:
        """A dataset whose block ``(i, j)`` is this dataset's block ``source(i, j)``.

        No data moves: only refs are rearranged (Cannon's initial skew is done this way).
        """
        gr, gc = self.grid
        refs = tuple(self.block(*source(i, j)) for i in range(gr) for j in range(gc))
        return BlockDataset(refs, self.grid, None, None)

    def blocks(self) -> list[Any]:
        """Fetch every block (row-major) to the driver."""
        return _ray().get(list(self.refs))

    def to_numpy(self):
        """Gather the blocks into one array (a scipy.sparse matrix when blocks are sparse)."""
        blocks = self.blocks()
        gr, gc = self.grid
        rows = [blocks[i * gc : (i + 1) * gc] for i in range(gr)]
        if any(hasattr(b, "tocsr") for b in blocks):
            import scipy.sparse as sp

            return sp.bmat(rows, format="csr")
        if all(np.ndim(b) == 1 for b in blocks):
            return np.concatenate(blocks)
        return np.block([[np.asarray(b) for b in row] for row in rows])
