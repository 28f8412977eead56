"""Image filters equal their OpenCV calls; tiled filtering equals whole-image filtering."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from rayflow.operators.base import StepContext
from rayflow.operators.image import (
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


def test_asymmetric_anchor_and_other_dtypes():
    kernel = RNG.random((5, 3)).astype(np.float32)
    spec = Filter2D(kernel, anchor=(0, 1), border="reflect")
    assert spec.halo == Halo(1, 3, 0, 2)
    img16 = RNG.integers(0, 65536, (45, 38), dtype=np.uint16)
    out = stitch_tiles([spec.apply_tile(t) for t in split_tiles(img16, 10, spec.halo, "reflect")])
    assert np.array_equal(out, spec.apply(img16))
    assert np.array_equal(spec.apply(img16), cv2.filter2D(img16, -1, kernel, anchor=(0, 1),
                                                          borderType=cv2.BORDER_REFLECT))
    # float images: OpenCV's SIMD and scalar paths round differently at a row's tail, so a
    # tile can differ from the whole image in the last bit (documented; integers are exact)
    img = _image(45, 38, 1, np.float32)
    out = stitch_tiles([spec.apply_tile(t) for t in split_tiles(img, 10, spec.halo, "reflect")])
    np.testing.assert_allclose(out, spec.apply(img), rtol=1e-6, atol=0)


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
