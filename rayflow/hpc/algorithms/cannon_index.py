"""Index algebra of Cannon's algorithm and of block grids, without Ray.

Usage: ``sizes = split_sizes(1000, 3); src = skew_a_source(i, j, p)``

A matrix of ``n`` rows split over ``p`` block rows gets ``split_sizes(n, p)`` rows per block:
the first ``n mod p`` blocks hold one row more (``numpy.array_split``'s rule), so ragged sizes
need no padding.

On a ``p x p`` periodic grid, rank ``(i, j)`` computes ``C_ij = sum_k A_ik B_kj``. Cannon's
schedule makes every rank use the same ``k`` at round ``t``:

.. math::

    k(i, j, t) = (i + j + t) \\bmod p

so rank ``(i, j)`` starts with ``A_{i,k(i,j,0)}`` (A skewed left by ``i``) and
``B_{k(i,j,0),j}`` (B skewed up by ``j``), and after each round passes its A block to the
left neighbour ``(i, j-1)`` and its B block to the upper neighbour ``(i-1, j)``. Because the
inner index ``k`` is the same for A's column split and B's row split, ragged blocks always
have matching inner dimensions.

>>> split_sizes(10, 3)
[4, 3, 3]
>>> [skew_a_source(1, j, 3) for j in range(3)]
[(1, 1), (1, 2), (1, 0)]
>>> sorted(inner_index(1, 2, t, 3) for t in range(3))
[0, 1, 2]
"""

from __future__ import annotations

import math


def split_sizes(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` near-equal consecutive pieces of ``n`` items (larger pieces first)."""
    if parts <= 0:
        raise ValueError(f"parts must be positive, got {parts}")
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    q, rem = divmod(n, parts)
    return [q + 1 if i < rem else q for i in range(parts)]


def offsets(sizes: list[int]) -> list[int]:
    """Start offsets of consecutive pieces, plus the total at the end.

    >>> offsets([4, 3, 3])
    [0, 4, 7, 10]
    """
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def grid_side(num_ranks: int) -> int:
    """The side ``p`` of a square grid of ``num_ranks`` ranks.

    Raises:
        ValueError: ``num_ranks`` is not a perfect square (Cannon needs a ``p x p`` grid).
    """
    p = math.isqrt(num_ranks) if num_ranks > 0 else 0
    if p * p != num_ranks or p == 0:
        lo = max(1, math.isqrt(max(num_ranks, 1)))
        raise ValueError(
            f"Cannon's algorithm needs a square number of ranks (p x p grid), got {num_ranks}; "
            f"use {lo * lo} or {(lo + 1) ** 2}"
        )
    return p


def inner_index(i: int, j: int, t: int, p: int) -> int:
    """The inner block index ``k`` used by rank ``(i, j)`` at round ``t``."""
    return (i + j + t) % p


def skew_a_source(i: int, j: int, p: int) -> tuple[int, int]:
    """Block of A that rank ``(i, j)`` holds after the initial skew (A shifted left by ``i``)."""
    return i, inner_index(i, j, 0, p)


def skew_b_source(i: int, j: int, p: int) -> tuple[int, int]:
    """Block of B that rank ``(i, j)`` holds after the initial skew (B shifted up by ``j``)."""
    return inner_index(i, j, 0, p), j


def shift(i: int, j: int, di: int, dj: int, p: int) -> tuple[int, int]:
    """Position ``(i + di, j + dj)`` on a periodic ``p x p`` grid."""
    return (i + di) % p, (j + dj) % p


def cannon_schedule(i: int, j: int, p: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (A block, B block) pairs that rank ``(i, j)`` multiplies, round by round.

    >>> cannon_schedule(0, 1, 2)
    [((0, 1), (1, 1)), ((0, 0), (0, 1))]
    """
    return [((i, inner_index(i, j, t, p)), (inner_index(i, j, t, p), j)) for t in range(p)]
