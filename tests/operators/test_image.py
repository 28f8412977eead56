"""Image filters equal their OpenCV calls; tiled filtering equals whole-image filtering."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from rayflow.core.operators import StepContext
from rayflow.operators.image import (
    ROW_ALIGN_PX,
    BoxFilter,
    Filter2D,
    GaussianBlur,
    Halo,
    MedianBlur,
    SplitTiles,
    StitchTiles,
    cut_tile,
    split_tiles,
    stitch_tiles,
    tile_regions,
)

BORDERS = {"reflect101": cv2.BORDER_REFLECT_101, "reflect": cv2.BORDER_REFLECT,
           "replicate": cv2.BORDER_REPLICATE, "constant": cv2.BORDER_CONSTANT,
           "wrap": cv2.BORDER_WRAP}
RNG = np.random.default_rng(7)


def _image(h: int, w: int, channels: int = 3, dtype=np.uint8) -> np.ndarray:
    shape = (h, w) if channels == 1 else (h, w, channels)
    if dtype == np.uint8:
        return RNG.integers(0, 256, shape, dtype=np.uint8)
    return RNG.random(shape, dtype=np.float32)


SHARPEN = [[0, -1, 0], [-1, 5, -1], [0, -1, 0]]
FRACTIONS = [[0.1, 0.2, 0.1], [0.2, -0.3, 0.2], [0.1, 0.2, 0.1]]


def _photo(h: int, w: int, channels: int = 3, dtype=np.uint8, seed: int = 0) -> np.ndarray:
    """Smooth content like a photo's: slow waves and gradients, a little grain, blurred.

    Neighbouring pixels are close, so a kernel of fractions lands near .5 often, where
    two ways of rounding disagree (noise hides that: it rarely lands there)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    planes = []
    for _ in range(channels):
        a, b, phase = rng.uniform(5, 30, 3)
        planes.append(0.5 + 0.3 * np.sin(yy / a + phase) * np.cos(xx / b) + 0.1 * xx / w
                      + 0.03 * rng.standard_normal((h, w)))
    img = cv2.GaussianBlur(np.dstack(planes).astype(np.float32), (0, 0), 1.5)
    img = img.reshape(h, w, channels) if channels > 1 else img.reshape(h, w)
    if np.dtype(dtype).kind == "f":
        return np.clip(img, 0, 1).astype(dtype)
    top = np.iinfo(dtype).max
    return np.clip(img * top, 0, top).astype(dtype)


def _filters(k: int) -> list:
    """Every filter with window ``k`` and every border it offers."""
    kernel = RNG.random((k, k)).astype(np.float32)
    out = []
    for b in GaussianBlur.supported_borders:
        out.append((GaussianBlur(k, 3.0, 2.0, b),
                    lambda im, b=b: cv2.GaussianBlur(im, (k, k), 3.0, sigmaY=2.0,
                                                     borderType=BORDERS[b])))
    for b in BoxFilter.supported_borders:
        out.append((BoxFilter(k, border=b),
                    lambda im, b=b: cv2.boxFilter(im, -1, (k, k), borderType=BORDERS[b])))
    for b in Filter2D.supported_borders:
        out.append((Filter2D(kernel, border=b),
                    lambda im, b=b: cv2.filter2D(im, -1, kernel, borderType=BORDERS[b])))
    r = k // 2
    for b in MedianBlur.supported_borders:
        def ref(im, b=b):
            if b == "replicate":
                return cv2.medianBlur(im, k)
            return cv2.medianBlur(cv2.copyMakeBorder(im, r, r, r, r, BORDERS[b]), k)[r:-r, r:-r]

        out.append((MedianBlur(k, border=b), ref))
    return out


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("channels", [1, 3])
def test_filters_equal_opencv(k, channels):
    img = _image(41, 67, channels)
    for spec, ref in _filters(k):
        assert np.array_equal(spec.apply(img), ref(img)), spec


def test_w1_blur_is_the_papers_call():
    img = _image(50, 50)
    expected = cv2.GaussianBlur(img, (5, 5), 3, sigmaY=3)
    assert np.array_equal(GaussianBlur(5, 3.0, 3.0).apply(img), expected)


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("shape,tile", [((61, 83, 3), 16), ((61, 83, 3), (7, 30)),
                                        ((33, 17), (33, 17)), ((100, 101), 64),
                                        ((29, 31, 3), (9, 4))])
def test_tiled_equals_whole_image_for_every_border(k, shape, tile):
    img = _image(*shape[:2], shape[2] if len(shape) == 3 else 1)
    for spec, _ in _filters(k):
        tiles = split_tiles(img, tile, spec.halo, spec.border, key="img")
        assert len(tiles) == len(tile_regions(img.shape, tile))
        assert all(t.data.shape[:2] == (t.height + spec.halo.top + spec.halo.bottom,
                                        t.width + spec.halo.left + spec.halo.right)
                   for t in tiles)
        out = stitch_tiles([spec.apply_tile(t) for t in reversed(tiles)])
        assert np.array_equal(out, spec.apply(img)), (spec, tile)


def _tiled(spec, img, tile):
    return stitch_tiles([spec.apply_tile(t) for t in split_tiles(img, tile, spec.halo,
                                                                 spec.border)])


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("channels", [1, 3])
def test_filter2d_of_fractions_is_exact_on_smooth_images_even_in_one_tile(dtype, channels):
    # OpenCV rounds the last elements of a row (its scalar tail) differently from the rest:
    # a tile whose row ends elsewhere than the image's got its last columns off by one
    img = _photo(61, 157, channels, dtype)
    for border in Filter2D.supported_borders:
        spec = Filter2D(FRACTIONS, border=border)
        want = cv2.filter2D(img, -1, np.float32(FRACTIONS), borderType=BORDERS[border])
        for tile in [(61, 157), 32, (17, 40), (61, 100)]:
            assert np.array_equal(_tiled(spec, img, tile), want), (border, tile)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
@pytest.mark.parametrize("shape", [(37, 203, 3), (29, 50)])
def test_every_tiled_filter_is_exact_on_smooth_images(dtype, shape):
    # tile grids that end far from the right edge, near it, on it, and one tile that is
    # the whole image; the image is wider than ROW_ALIGN_PX + a tile, so both ways are used
    h, w = shape[:2]
    img = _photo(h, w, shape[2] if len(shape) == 3 else 1, dtype, seed=w)
    kernels = [FRACTIONS, RNG.random((5, 5)) / 12, RNG.random((5, 3)) / 8]
    specs = [s for k in (3, 5) for s, _ in _filters(k)]
    specs += [Filter2D(k, anchor=a, delta=0.3, border=b) for k, a in
              zip(kernels, [(-1, -1), (-1, -1), (0, 1)]) for b in Filter2D.supported_borders]
    assert w > ROW_ALIGN_PX + 40 or w < ROW_ALIGN_PX
    checked = 0
    for spec in specs:
        if isinstance(spec, MedianBlur) and dtype != np.uint8:
            continue  # OpenCV's median of 5 and more takes 8-bit images only
        try:
            want = spec.apply(img)
        except cv2.error:
            continue  # OpenCV refuses this border for float images (wrap)
        for tile in [(h, w), 16, (7, 30), (h, 40)] + ([(5, 1)] if w < ROW_ALIGN_PX else []):
            assert np.array_equal(_tiled(spec, img, tile), want), (spec, tile)
            checked += 1
    assert checked >= 140  # a filter refused silently would shrink this


def test_tiles_narrower_than_the_halo_and_images_narrower_than_the_kernel():
    kernel = RNG.random((7, 7)).astype(np.float32) / 20
    for border in Filter2D.supported_borders:
        spec = Filter2D(kernel, anchor=(1, 5), border=border)  # halo: 1 left, 5 right
        for shape, tile in [((20, 70), (6, 1)), ((20, 70), (6, 3)), ((12, 4), (5, 1)),
                            ((12, 3), 12)]:
            img = _photo(*shape, 1, np.uint8, seed=shape[1])
            want = cv2.filter2D(img, -1, kernel, anchor=(1, 5), borderType=BORDERS[border])
            assert np.array_equal(_tiled(spec, img, tile), want), (border, shape, tile)


def test_asymmetric_anchor_and_other_dtypes():
    kernel = RNG.random((5, 3)).astype(np.float32)
    spec = Filter2D(kernel, anchor=(0, 1), border="reflect")
    assert spec.halo == Halo(1, 3, 0, 2)
    img16 = RNG.integers(0, 65536, (45, 38), dtype=np.uint16)
    out = stitch_tiles([spec.apply_tile(t) for t in split_tiles(img16, 10, spec.halo, "reflect")])
    assert np.array_equal(out, spec.apply(img16))
    assert np.array_equal(spec.apply(img16), cv2.filter2D(img16, -1, kernel, anchor=(0, 1),
                                                          borderType=cv2.BORDER_REFLECT))
    # float images too: each row of a tile ends where the whole image's rows end, or far
    # enough past the tile that OpenCV's scalar tail misses it
    img = _image(45, 38, 1, np.float32)
    out = stitch_tiles([spec.apply_tile(t) for t in split_tiles(img, 10, spec.halo, "reflect")])
    assert np.array_equal(out, spec.apply(img))


@pytest.mark.parametrize("border", list(BORDERS))
def test_cut_tile_matches_copy_make_border(border):
    img = _image(12, 9, 3)
    h = 3
    padded = cv2.copyMakeBorder(img, h, h, h, h, BORDERS[border], value=0)
    for y0, y1, x0, x1 in tile_regions(img.shape, 4):
        tile = cut_tile(img, y0, y1, x0, x1, Halo(h, h, h, h), border)
        assert np.array_equal(tile, padded[y0 : y1 + 2 * h, x0 : x1 + 2 * h])


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="odd"):
        GaussianBlur(4, 1.0)
    with pytest.raises(ValueError, match="not supported"):
        BoxFilter(3, border="wrap")
    with pytest.raises(ValueError, match="border"):
        GaussianBlur(5, border="mirror")
    with pytest.raises(ValueError, match="2-D"):
        Filter2D([1.0, 2.0])


def test_filter_logic_keeps_keys_and_dead_letters_bad_records():
    blur = GaussianBlur(5, 3.0, 3.0)
    logic = blur.build(StepContext("blur", 0, 1))
    logic.open()
    img = _image(20, 20)
    items = [("a.png", img), ("b.png", "not an image"), img]
    out = logic.process(items, np.array([1.0, 2.0, 3.0]))
    assert [r[0] for r in out.items[:1]] == ["a.png"]
    assert np.array_equal(out.items[0][1], blur.apply(img))
    assert np.array_equal(out.items[1], blur.apply(img))
    assert out.event_times.tolist() == [1.0, 3.0]
    assert len(out.dead) == 1 and out.dead[0].where == "b.png"
    assert "TypeError" in out.dead[0].reason


def test_split_and_stitch_logic():
    blur = GaussianBlur(7, 2.0, 2.0, "constant")
    ctx = StepContext("s", 0, 1)
    a, b = _image(50, 40), _image(30, 70, 1)
    split = SplitTiles(blur, 16).build(ctx)
    tiles = split.process([("a", a), ("b", b)], np.array([5.0, 6.0])).items
    filtered = blur.build(ctx).process(tiles[::-1], None).items
    stitch = StitchTiles().build(ctx)
    got = stitch.process(filtered[:3], None)
    assert got.items == []
    got = stitch.process(filtered[3:], None)
    assert {k for k, _ in got.items} == {"a", "b"}
    for key, img in got.items:
        assert np.array_equal(img, blur.apply(a if key == "a" else b))
    assert stitch.on_end() is None
    stitch.process(tiles[:1], None)
    end = stitch.on_end()
    assert len(end.dead) == 1 and "missing" in end.dead[0].reason
