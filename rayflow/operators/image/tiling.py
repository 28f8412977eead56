"""Tiles with halos: cut an image into tiles that each carry the pixels a window filter
needs around them (the border rule beyond the image's edge, as OpenCV extrapolates), and
stitch the filtered tiles back. Pure numpy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

import numpy as np

Border = Literal["reflect101", "reflect", "replicate", "constant", "wrap"]

# OpenCV's constants, spelled out so that this module imports without cv2 until it is used.
_CV_BORDER = {"constant": 0, "replicate": 1, "reflect": 2, "wrap": 3, "reflect101": 4}
_LINEAR_BORDERS = ("reflect101", "reflect", "replicate", "constant")


def cv_border(border: Border) -> int:
    """The ``cv2.BORDER_*`` constant of a border name."""
    try:
        return _CV_BORDER[border]
    except KeyError:
        raise ValueError(f"unknown border {border!r}; use one of {sorted(_CV_BORDER)}") from None


class Halo(NamedTuple):
    """Extra pixels a window needs on each side of the pixel it computes."""

    top: int
    bottom: int
    left: int
    right: int

    @classmethod
    def of_window(cls, height: int, width: int, anchor: tuple[int, int] = (-1, -1)) -> Halo:
        """Halo of a ``height`` × ``width`` window with ``anchor`` (x, y); -1 = centre."""
        ax = width // 2 if anchor[0] < 0 else anchor[0]
        ay = height // 2 if anchor[1] < 0 else anchor[1]
        return cls(ay, height - 1 - ay, ax, width - 1 - ax)


class Tile(NamedTuple):
    """One tile of an image, with its halo.

    A NamedTuple (not a class) so that the runtime's byte estimate of a batch sees ``data``.

    Attributes:
        key: the image the tile belongs to.
        index: tile number in row-major order; ``count`` tiles make the image.
        count: number of tiles of the image.
        y, x: top-left corner of the tile's own region in the image.
        height, width: size of the tile's own region.
        shape: the whole image's shape.
        halo: halo pixels around the region held in ``data`` (all zero once filtered).
        data: pixels of the region plus the halo.
    """

    key: Any
    index: int  # type: ignore[assignment]  # a field named like tuple.index: a tile's place
    count: int  # type: ignore[assignment]  # and tuple.count: the tiles of its image
    y: int
    x: int
    height: int
    width: int
    shape: tuple
    halo: Halo
    data: np.ndarray


# -- tiling ----------------------------------------------------------------------------------

def _grid(size: int, step: int) -> list[tuple[int, int]]:
    return [(lo, min(size, lo + step)) for lo in range(0, size, step)]


def _source_index(lo: int, hi: int, size: int, border: Border) -> np.ndarray:
    """Source indices of positions ``lo..hi-1`` (some outside ``0..size-1``) under ``border``;
    -1 where the border is a constant."""
    import cv2

    idx = np.arange(lo, hi)
    out = idx.copy()
    outside = (idx < 0) | (idx >= size)
    if outside.any():
        b = cv_border(border)
        out[outside] = [cv2.borderInterpolate(int(p), size, b) for p in idx[outside]]
    return out


def cut_tile(image: np.ndarray, y0: int, y1: int, x0: int, x1: int, halo: Halo,
             border: Border = "reflect101", value: float = 0.0) -> np.ndarray:
    """Pixels of ``image[y0:y1, x0:x1]`` plus ``halo``, extrapolated by ``border`` beyond
    the image edge as OpenCV's filters do. Works on any array that supports slicing
    (a ``np.memmap`` reads only the rows it needs)."""
    h, w = image.shape[:2]
    rows = _source_index(y0 - halo.top, y1 + halo.bottom, h, border)
    cols = _source_index(x0 - halo.left, x1 + halo.right, w, border)
    if _contiguous(rows) and _contiguous(cols):
        # the common, interior case: one slice (a memmap reads only these rows)
        return np.array(image[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1])
    out = np.asarray(image[np.ix_(np.maximum(rows, 0), np.maximum(cols, 0))])
    if (rows < 0).any() or (cols < 0).any():
        out[rows < 0] = value
        out[:, cols < 0] = value
    return out


def _contiguous(idx: np.ndarray) -> bool:
    return bool(idx[0] >= 0 and idx[-1] - idx[0] == len(idx) - 1 and (np.diff(idx) == 1).all())


def tile_regions(shape: tuple, tile: int | tuple[int, int]) -> list[tuple[int, int, int, int]]:
    """``(y0, y1, x0, x1)`` of each tile of an image of ``shape``, row-major.

    ``tile`` is the tile size (an int for square tiles, or (height, width)).
    """
    th, tw = (tile, tile) if isinstance(tile, int) else tile
    if th < 1 or tw < 1:
        raise ValueError(f"tile size must be positive, got {tile!r}")
    return [(y0, y1, x0, x1) for y0, y1 in _grid(shape[0], th) for x0, x1 in _grid(shape[1], tw)]


def iter_tiles(image: np.ndarray, tile: int | tuple[int, int], halo: Halo,
               border: Border = "reflect101", key: Any = None,
               value: float = 0.0) -> Iterator[Tile]:
    """Yield the tiles of ``image`` with ``halo``, one at a time (see :func:`split_tiles`)."""
    regions = tile_regions(image.shape, tile)
    for i, (y0, y1, x0, x1) in enumerate(regions):
        data = cut_tile(image, y0, y1, x0, x1, halo, border, value)
        yield Tile(key, i, len(regions), y0, x0, y1 - y0, x1 - x0, tuple(image.shape), halo, data)


def split_tiles(image: np.ndarray, tile: int | tuple[int, int], halo: Halo | int,
                border: Border = "reflect101", key: Any = None,
                value: float = 0.0) -> list[Tile]:
    """Cut ``image`` into tiles of ``tile`` pixels with ``halo`` pixels around each.

    Args:
        image: H × W or H × W × C array.
        tile: tile size, int or (height, width); edge tiles are smaller.
        halo: a :class:`Halo`, or an int for the same halo on every side.
        border: how pixels beyond the image edge are made (the filter's border).
        key: the image's key, copied into every tile.
        value: the constant of the ``constant`` border.
    """
    if isinstance(halo, int):
        halo = Halo(halo, halo, halo, halo)
    return list(iter_tiles(image, tile, halo, border, key, value))


def crop_halo(tile: Tile) -> Tile:
    """The tile without its halo."""
    h = tile.halo
    data = tile.data[h.top : h.top + tile.height, h.left : h.left + tile.width]
    return tile._replace(data=data, halo=Halo(0, 0, 0, 0))


def stitch_tiles(tiles: list[Tile], out: np.ndarray | None = None) -> np.ndarray:
    """Put filtered tiles (halo cropped or not) back into one image."""
    if not tiles:
        raise ValueError("no tiles to stitch")
    first = tiles[0]
    if out is None:
        out = np.empty(first.shape, dtype=first.data.dtype)
    for t in tiles:
        place_tile(out, t)
    return out


def place_tile(out: np.ndarray, tile: Tile) -> None:
    """Write ``tile``'s own region (without halo) into ``out``."""
    t = crop_halo(tile) if any(tile.halo) else tile
    out[t.y : t.y + t.height, t.x : t.x + t.width] = t.data


# -- rows aligned with the whole image's ------------------------------------------------------

# OpenCV computes each row of a filter's output in a vector loop and finishes the last
# ``n mod L`` elements (n elements per row, L lanes per vector) in scalar code. For some
# filters the two round differently (a fused multiply-add against a multiply then an add),
# so a pixel's value depends on its distance from the end of the row it was computed in.
# Every vector width OpenCV dispatches to (SSE to AVX-512: 4 to 16 lanes of 32 bits) divides
# 64, so rows whose ends are 64 elements apart, or a row that ends 64 elements or more past
# the pixel, give every pixel the code path it has in the whole image.
ROW_ALIGN_PX = 64


def filter_tile_rows_aligned(apply: Any, tile: Tile, border: Border) -> np.ndarray:
    """``apply`` on ``tile`` so that each pixel of the tile's own region is computed by the
    same code path as in ``apply(whole image)``; returns the region (halo dropped).

    A tile that ends at least :data:`ROW_ALIGN_PX` pixels before the image's right edge is
    padded on the right (with copies of its last column, which no pixel of the region
    reads), so the scalar tail of each row falls outside the region, as in the whole image.
    A tile nearer the edge is filtered in a row that starts at a multiple of
    ``ROW_ALIGN_PX`` and ends where the image ends, with OpenCV extrapolating the image's
    own border there: its rows' tails then fall on the same pixels as the whole image's.
    The border pixels OpenCV reads for that are filled in from the tile's halo, which holds
    the image's true border, so a tile narrower than the halo is exact too.
    """
    import cv2

    data, h = tile.data, tile.halo
    width = tile.shape[1]
    x0, x1 = tile.x, tile.x + tile.width
    lo, hi = x0 - h.left, x1 + h.right  # image columns of data[:, 0] and past data[:, -1]
    rows = slice(h.top, h.top + tile.height)
    if width - x1 >= ROW_ALIGN_PX:
        padded = cv2.copyMakeBorder(np.ascontiguousarray(data), 0, 0, 0, ROW_ALIGN_PX,
                                    cv2.BORDER_REPLICATE)
        return apply(padded)[rows, h.left : h.left + tile.width]
    row, start = _row_to_edge(data, lo, hi, width, cv_border(border))
    return apply(row)[rows, x0 - start : x1 - start]


def _row_to_edge(data: np.ndarray, lo: int, hi: int, width: int,
                 border: int) -> tuple[np.ndarray, int]:
    """``data`` (image columns ``lo..hi-1``) placed in a row of image columns
    ``start..width-1`` with ``start`` a multiple of :data:`ROW_ALIGN_PX`, and the columns that
    OpenCV's ``border`` reads beyond the row's end set so that it extrapolates the image's
    true border (held in ``data`` past column ``width - 1``). Reflecting borders read
    columns the row holds already; ``wrap`` reads the row's first columns, which are free
    once the row starts at least as many columns before ``lo`` as the halo beyond the edge."""
    import cv2

    beyond = max(hi - width, 0)  # halo columns past the image's right edge
    real_end = min(hi, width)
    start = lo - lo % ROW_ALIGN_PX
    for _ in range(4):
        n = width - start
        row = np.zeros((data.shape[0], n, *data.shape[2:]), data.dtype)
        row[:, lo - start : real_end - start] = data[:, : real_end - lo]
        filled = np.zeros(n, bool)
        filled[lo - start : real_end - start] = True
        ok = True
        for j in range(beyond):
            pos = cv2.borderInterpolate(n + j, n, border)
            if pos < 0:  # a constant border: OpenCV's zeros are the image's
                continue
            want = data[:, width + j - lo]
            if filled[pos] and not np.array_equal(row[:, pos], want):
                ok = False  # it would overwrite a pixel the region reads: start earlier
                break
            row[:, pos], filled[pos] = want, True
        if ok:
            return row, start
        start -= ROW_ALIGN_PX
    raise RuntimeError(f"no row start lets OpenCV extrapolate the border of image columns "
                       f"{lo}..{hi - 1} of {width}")  # unreachable for halos under 3 x 64
