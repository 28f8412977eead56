"""Sliding-window filters as operator specs (Gaussian, box, median, any kernel), each
bit-identical to its OpenCV call, on whole images or tiles. Pure: OpenCV, no Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rayflow.core.operators import Logic, OperatorSpec, Output, StepContext, describe_exception
from rayflow.operators.image.tiling import (
    _LINEAR_BORDERS,
    Border,
    Halo,
    Tile,
    crop_halo,
    cv_border,
    filter_tile_rows_aligned,
)


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
