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

from rayflow.operators.image.filters import BoxFilter, CvLogic, Filter2D, GaussianBlur, MedianBlur
from rayflow.operators.image.tiling import (
    ROW_ALIGN_PX,
    Border,
    Halo,
    Tile,
    crop_halo,
    cut_tile,
    cv_border,
    iter_tiles,
    place_tile,
    split_tiles,
    stitch_tiles,
    tile_regions,
)
from rayflow.operators.image.tiling_ops import SplitTiles, StitchTiles, tile_key

__all__ = ["ROW_ALIGN_PX", "Border", "BoxFilter", "CvLogic", "Filter2D", "GaussianBlur", "Halo",
           "MedianBlur", "SplitTiles", "StitchTiles", "Tile", "crop_halo", "cut_tile",
           "cv_border", "iter_tiles", "place_tile", "split_tiles", "stitch_tiles",
           "tile_key", "tile_regions"]
