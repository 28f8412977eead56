"""Sliding-window image filters and tiling, as stream operators. Pure numpy/OpenCV, no Ray.

Every filter is an operator spec (use it with ``stream.apply``) whose result is
bit-identical to the corresponding OpenCV call on the same image:

    >>> import numpy as np, cv2
    >>> from rayflow.operators.image import GaussianBlur
    >>> img = np.arange(64, dtype=np.uint8).reshape(8, 8)
    >>> blur = GaussianBlur(5, sigma_x=3.0, sigma_y=3.0)
    >>> bool(np.array_equal(blur.apply(img), cv2.GaussianBlur(img, (5, 5), 3.0, sigmaY=3.0)))
    True

A record is an image (``np.ndarray``), a tuple whose second element is the image (the
``(key, image, ...)`` records of :mod:`rayflow.connectors.images`), or a :class:`Tile`.

Tiling. A large image is cut into tiles that carry a halo of ``(window - 1) / 2`` pixels on
each side. Halo pixels inside the image are copied from the neighbours; halo pixels beyond the
image edge are made by the filter's border rule, through ``cv2.borderInterpolate``, exactly as
OpenCV extrapolates when it filters the whole image. Each tile is then self-sufficient: a
filter applied to it (with any border) and cropped to the tile's own region gives the same
pixels as the whole-image filter, so tiles can be filtered in parallel actors and stitched:

    >>> from rayflow.operators.image import split_tiles, stitch_tiles
    >>> tiles = split_tiles(img, tile=(3, 5), halo=blur.halo, border=blur.border)
    >>> out = stitch_tiles([blur.apply_tile(t) for t in tiles])
    >>> bool(np.array_equal(out, blur.apply(img)))
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np

from rayflow.operators.base import Logic, OperatorSpec, Output, StepContext, describe_exception

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


# -- filters ---------------------------------------------------------------------------------

def _pair(k: int | tuple[int, int]) -> tuple[int, int]:
    """(width, height) of a window, OpenCV's order."""
    w, h = (k, k) if isinstance(k, int) else k
    return int(w), int(h)


@dataclass(frozen=True)
class _Filter(OperatorSpec):
    """Base of the window filters: one image in, one image of the same shape out."""

    # Subclasses declare ``border`` and ``threads`` (OpenCV threads per instance; 1 = one
    # core per operator instance) after their own fields, so positional arguments read
    # naturally: ``GaussianBlur(5, 3.0, 3.0)``.
    supported_borders: ClassVar[tuple] = _LINEAR_BORDERS

    def __post_init__(self) -> None:
        if self.border not in self.supported_borders:  # type: ignore[attr-defined]  # (a subclass field)
            raise ValueError(
                f"{type(self).__name__}: border {self.border!r} is not supported; "  # type: ignore[attr-defined]  # (a subclass field)
                f"use one of {list(self.supported_borders)}"
            )

    @property
    def window(self) -> tuple[int, int]:
        """(height, width) of the window: ``ksize`` (int, or OpenCV's (width, height))."""
        w, h = _pair(self.ksize)  # type: ignore[attr-defined]  # (a subclass field)
        return h, w

    @property
    def halo(self) -> Halo:
        return Halo.of_window(*self.window)

    def apply(self, image: np.ndarray) -> np.ndarray:
        """Filter a whole image (the OpenCV call)."""
        raise NotImplementedError

    def row_tail_sensitive(self, dtype: np.dtype) -> bool:
        """Whether OpenCV's result for a pixel of this dtype depends on where the pixel sits
        in its row (vector body or scalar tail; see :func:`filter_tile_rows_aligned`)."""
        return np.dtype(dtype).kind == "f"

    def apply_tile(self, tile: Tile) -> Tile:
        """Filter a tile cut with this filter's halo and border, and drop the halo."""
        if tile.halo != self.halo:
            raise ValueError(f"tile halo {tuple(tile.halo)} != filter halo {tuple(self.halo)}")
        if self.row_tail_sensitive(tile.data.dtype):
            region = filter_tile_rows_aligned(self.apply, tile, self.border)  # type: ignore[attr-defined]  # (a subclass field)
            return tile._replace(data=region, halo=Halo(0, 0, 0, 0))
        # The halo already holds the right border pixels; BORDER_ISOLATED-like behaviour at
        # the tile edge does not matter because those pixels are cropped away.
        return crop_halo(tile._replace(data=self.apply(np.ascontiguousarray(tile.data))))

    def __call__(self, record: Any) -> Any:
        """Filter one record: an image, a ``(key, image, ...)`` tuple or a :class:`Tile`."""
        if isinstance(record, Tile):
            return self.apply_tile(record)
        if isinstance(record, np.ndarray):
            return self.apply(record)
        if isinstance(record, tuple) and len(record) >= 2 and isinstance(record[1], np.ndarray):
            return (record[0], self.apply(record[1]), *record[2:])
        raise TypeError(f"expected an image, a (key, image) tuple or a Tile, got "
                        f"{type(record).__name__}")

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _FilterLogic(ctx, self)


class CvLogic(Logic):
    """Logic of an OpenCV step: holds its spec and pins OpenCV's threads (``spec.threads``)
    when the instance opens, so parallel instances do not oversubscribe the cores."""

    def __init__(self, ctx: StepContext, spec: Any):
        super().__init__(ctx)
        self.spec = spec

    def open(self) -> None:
        if self.spec.threads is not None:
            import cv2

            cv2.setNumThreads(self.spec.threads)


class _FilterLogic(CvLogic):

    def process(self, items, event_times):
        spec, out, dead, keep = self.spec, [], [], []
        for i, rec in enumerate(items):
            try:
                out.append(spec(rec))
                keep.append(i)
            except Exception as exc:  # noqa: BLE001 - a bad image must not stop the stream
                dead.append(self.dead(describe_exception(exc), _label(rec), _where(rec)))
        if dead and event_times is not None:
            event_times = event_times[keep]
        return Output(out, event_times, dead)


def _label(rec: Any) -> Any:
    """A small stand-in for a record in a dead letter (never the pixels)."""
    if isinstance(rec, Tile):
        return f"tile {rec.index}/{rec.count} of {rec.key!r}"
    if isinstance(rec, np.ndarray):
        return f"array{rec.shape} {rec.dtype}"
    if isinstance(rec, tuple) and rec:
        return rec[0]
    return rec


def _where(rec: Any) -> str:
    if isinstance(rec, Tile):
        return str(rec.key)
    if isinstance(rec, tuple) and rec and isinstance(rec[0], str):
        return rec[0]
    return ""


@dataclass(frozen=True)
class GaussianBlur(_Filter):
    """``cv2.GaussianBlur(image, ksize, sigma_x, sigmaY=sigma_y, borderType=border)``.

    Args:
        ksize: odd window size, int or (width, height).
        sigma_x: standard deviation in x (0: derived from ``ksize``, as OpenCV does).
        sigma_y: standard deviation in y (0: same as ``sigma_x``).
        border: ``reflect101`` (OpenCV's default), ``reflect``, ``replicate``, ``constant``
            (zeros) or ``wrap``.
        threads: OpenCV threads in each instance (None: leave OpenCV's setting).

    Example (W1's blur):
        >>> from rayflow.operators.image import GaussianBlur
        >>> blur = GaussianBlur(5, sigma_x=3.0, sigma_y=3.0)
        >>> blur.halo
        Halo(top=2, bottom=2, left=2, right=2)
    """

    ksize: int | tuple[int, int] = 5
    sigma_x: float = 0.0
    sigma_y: float = 0.0
    border: Border = "reflect101"
    threads: int | None = 1
    supported_borders: ClassVar[tuple] = (*_LINEAR_BORDERS, "wrap")

    def __post_init__(self) -> None:
        super().__post_init__()
        w, h = _pair(self.ksize)
        if w < 1 or h < 1 or w % 2 == 0 or h % 2 == 0:
            raise ValueError(f"GaussianBlur: ksize must be odd and positive, got {self.ksize!r}")

    def apply(self, image: np.ndarray) -> np.ndarray:
        import cv2

        return cv2.GaussianBlur(image, _pair(self.ksize), self.sigma_x, sigmaY=self.sigma_y,
                                borderType=cv_border(self.border))


@dataclass(frozen=True)
class BoxFilter(_Filter):
    """``cv2.boxFilter(image, -1, ksize, normalize=normalize, borderType=border)``
    (``normalize=True`` is ``cv2.blur``).

    Example:
        >>> from rayflow.operators.image import BoxFilter
        >>> BoxFilter(3).window
        (3, 3)
    """

    ksize: int | tuple[int, int] = 3
    normalize: bool = True
    border: Border = "reflect101"
    threads: int | None = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        w, h = _pair(self.ksize)
        if w < 1 or h < 1:
            raise ValueError(f"BoxFilter: ksize must be positive, got {self.ksize!r}")

    def apply(self, image: np.ndarray) -> np.ndarray:
        import cv2

        return cv2.boxFilter(image, -1, _pair(self.ksize), normalize=self.normalize,
                             borderType=cv_border(self.border))


@dataclass(frozen=True)
class MedianBlur(_Filter):
    """``cv2.medianBlur(image, ksize)``, with a choice of border.

    OpenCV's median filter has no border parameter: it replicates the edge. ``replicate``
    (the default here) is that exact call; any other border pads the image once with
    ``cv2.copyMakeBorder`` and crops the result, which is how OpenCV users get it.

    Example:
        >>> from rayflow.operators.image import MedianBlur
        >>> MedianBlur(5).halo
        Halo(top=2, bottom=2, left=2, right=2)
    """

    ksize: int = 3
    border: Border = "replicate"
    threads: int | None = 1
    supported_borders: ClassVar[tuple] = (*_LINEAR_BORDERS, "wrap")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ksize < 3 or self.ksize % 2 == 0:
            raise ValueError(f"MedianBlur: ksize must be odd and >= 3, got {self.ksize!r}")

    def row_tail_sensitive(self, dtype: np.dtype) -> bool:
        return False  # a median compares, it does not round

    def apply(self, image: np.ndarray) -> np.ndarray:
        import cv2

        if self.border == "replicate":
            return cv2.medianBlur(image, self.ksize)
        r = self.ksize // 2
        padded = cv2.copyMakeBorder(image, r, r, r, r, cv_border(self.border), value=0)
        return cv2.medianBlur(padded, self.ksize)[r:-r, r:-r]


@dataclass(frozen=True)
class Filter2D(_Filter):
    """``cv2.filter2D(image, -1, kernel, anchor=anchor, delta=delta, borderType=border)``.

    Args:
        kernel: the 2-D kernel (a list of rows or an array; stored as a float32 tuple so the
            spec stays hashable and picklable).
        anchor: (x, y) of the kernel's anchor; (-1, -1) is the centre.
        delta: added to every result.

    Kernels of 11 × 11 and more make OpenCV switch to a DFT, whose rounding differs between
    a tile and the whole image; tiling is exact for smaller kernels.

    Example (a 3 × 3 sharpen):
        >>> from rayflow.operators.image import Filter2D
        >>> Filter2D([[0, -1, 0], [-1, 5, -1], [0, -1, 0]]).window
        (3, 3)
    """

    kernel: Any = ((1.0,),)
    anchor: tuple[int, int] = (-1, -1)
    delta: float = 0.0
    border: Border = "reflect101"
    threads: int | None = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        k = np.asarray(self.kernel, dtype=np.float32)
        if k.ndim != 2 or k.size == 0:
            raise ValueError(f"Filter2D: kernel must be a non-empty 2-D array, got shape {k.shape}")
        object.__setattr__(self, "kernel", tuple(map(tuple, k.tolist())))

    @property
    def kernel_array(self) -> np.ndarray:
        return np.asarray(self.kernel, dtype=np.float32)

    @property
    def window(self) -> tuple[int, int]:
        return len(self.kernel), len(self.kernel[0])

    @property
    def halo(self) -> Halo:
        return Halo.of_window(*self.window, anchor=self.anchor)

    def row_tail_sensitive(self, dtype: np.dtype) -> bool:
        # a kernel of fractions on integer images: the vector body rounds with a fused
        # multiply-add, the scalar tail does not, and the result can differ by 1
        return True

    def apply(self, image: np.ndarray) -> np.ndarray:
        import cv2

        return cv2.filter2D(image, -1, self.kernel_array, anchor=tuple(self.anchor),
                            delta=self.delta, borderType=cv_border(self.border))


# -- tiling operators ------------------------------------------------------------------------

@dataclass(frozen=True)
class SplitTiles(OperatorSpec):
    """Cut each ``(key, image)`` record into :class:`Tile` records for ``filter``.

    Use with ``stream.apply("split", SplitTiles(blur, 512))``, then the filter at any
    parallelism (``.rebalance().apply("blur", blur, parallelism=4)``), then
    ``.key_by(tile_key).apply("stitch", StitchTiles())``.
    """

    filter: _Filter
    tile: int | tuple[int, int] = 512

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _SplitLogic(ctx, self)


class _SplitLogic(Logic):
    def __init__(self, ctx: StepContext, spec: SplitTiles):
        super().__init__(ctx)
        self.spec = spec

    def process(self, items, event_times):
        f, out, times, dead = self.spec.filter, [], [], []
        for i, rec in enumerate(items):
            key, image = (rec[0], rec[1]) if isinstance(rec, tuple) else (None, rec)
            try:
                tiles = split_tiles(image, self.spec.tile, f.halo, f.border, key)
            except Exception as exc:  # noqa: BLE001
                dead.append(self.dead(describe_exception(exc), _label(rec), _where(rec)))
                continue
            out.extend(tiles)
            if event_times is not None:
                times.extend([event_times[i]] * len(tiles))
        return Output(out, None if event_times is None else np.asarray(times), dead)


def tile_key(tile: Tile) -> Any:
    """Partition key of a tile: its image (use with ``key_by`` before :class:`StitchTiles`)."""
    return tile.key


@dataclass(frozen=True)
class StitchTiles(OperatorSpec):
    """Collect the tiles of each image and emit ``(key, image)`` once all have arrived.

    Holds one output buffer per image in progress; put ``key_by(tile_key)`` before it when
    it runs at parallelism > 1, so all tiles of an image meet in one instance.
    """

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _StitchLogic(ctx)


class _StitchLogic(Logic):
    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.partial: dict[Any, list] = {}  # key -> [buffer, tiles left, earliest event time]

    def process(self, items, event_times):
        out, times = [], []
        for i, t in enumerate(items):
            entry = self.partial.get(t.key)
            if entry is None:
                entry = self.partial[t.key] = [np.empty(t.shape, t.data.dtype), t.count, np.inf]
            place_tile(entry[0], t)
            entry[1] -= 1
            if event_times is not None:
                entry[2] = min(entry[2], event_times[i])
            if entry[1] == 0:
                del self.partial[t.key]
                out.append((t.key, entry[0]))
                times.append(entry[2])
        return Output(out, None if event_times is None else np.asarray(times))

    def on_end(self) -> Output | None:
        if not self.partial:
            return None
        dead = [self.dead(f"{left} tile(s) missing at end of stream", key, str(key))
                for key, (_, left, _) in self.partial.items()]
        self.partial.clear()
        return Output([], None, dead)
