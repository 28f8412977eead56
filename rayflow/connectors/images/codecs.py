"""Encoded image bytes: cheap checks of headers, decoding (every frame of a multi-page
file) and encoding with OpenCV, the decode step that turns bad input into dead letters, and
the writer that encodes images for the sinks."""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from rayflow.core.connectors import (
    RunState,
    SinkWriter,
    restored_by_run,
)
from rayflow.core.operators import (
    DeadLetter,
    Logic,
    OperatorSpec,
    Output,
    StepContext,
)
from rayflow.core.records import brief
from rayflow.operators.image.filters import CvLogic
from rayflow.operators.image.tiling import Tile

MiB = 1 << 20
Encoded = bytes | bytearray | memoryview  # an encoded image file's bytes


class BadInput(NamedTuple):
    """Payload of a record the source could not read; :class:`DecodeImage` dead-letters it."""

    reason: str


# -- decoding --------------------------------------------------------------------------------

_PNG_SIG = b"\x89PNG\r\n\x1a\n"
_IMREAD = {"unchanged": -1, "gray": 0, "color": 1}


def png_size(data: Encoded) -> tuple[int, int] | None:
    """(height, width) from a PNG header without decoding, or None if not a PNG."""
    if len(data) >= 24 and data[:8] == _PNG_SIG and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return h, w
    return None


def check_encoded(data: Any, max_pixels: int | None = None) -> str | None:
    """Why ``data`` cannot be a complete image, or None if it may be one (cheap checks)."""
    if isinstance(data, BadInput):
        return data.reason
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return f"not encoded image bytes: {type(data).__name__}"
    if len(data) == 0:
        return "empty file"
    if data[:8] == _PNG_SIG:
        hw = png_size(data)
        if hw is None:
            return "corrupt PNG: no IHDR header"
        if max_pixels is not None and hw[0] * hw[1] > max_pixels:
            return f"oversize image: {hw[1]}x{hw[0]} > max_pixels={max_pixels}"
        if b"IEND" not in data[-12:]:
            return "truncated PNG: no IEND chunk at the end"
    elif data[:2] == b"\xff\xd8" and b"\xff\xd9" not in data[-64:]:
        # libjpeg decodes a truncated JPEG with only a warning: catch it here
        return "truncated JPEG: no end-of-image marker"
    return None


def decode_image(data: Encoded, mode: str = "unchanged", channels: int | None = None,
                 max_pixels: int | None = None, orientation: bool = True) -> np.ndarray:
    """Decode ``data`` with OpenCV (the first frame of a multi-frame file); raise
    ``ValueError`` saying why when it is bad. ``orientation`` applies the EXIF orientation,
    as ``cv2.imread`` does."""
    import cv2

    why = check_encoded(data, max_pixels)
    if why:
        raise ValueError(why)
    img = cv2.imdecode(np.frombuffer(data, np.uint8), imread_flags(mode, orientation))
    if img is None:
        raise ValueError("not an image, or corrupt: OpenCV could not decode it")
    _check_decoded(img, channels, max_pixels)
    return img


def decode_frames(data: Encoded, mode: str = "unchanged", channels: int | None = None,
                  max_pixels: int | None = None, orientation: bool = True) -> list[np.ndarray]:
    """Every frame (page) of ``data``: several for a multi-page TIFF or an animated GIF,
    PNG or WebP, one otherwise. Raises ``ValueError`` as :func:`decode_image` does."""
    import cv2

    if not may_hold_frames(data):
        return [decode_image(data, mode, channels, max_pixels, orientation)]
    why = check_encoded(data, max_pixels)
    if why:
        raise ValueError(why)
    ok, frames = cv2.imdecodemulti(np.frombuffer(data, np.uint8),
                                   imread_flags(mode, orientation))
    if not ok or not frames:
        raise ValueError("not an image, or corrupt: OpenCV could not decode it")
    for f in frames:
        _check_decoded(f, channels, max_pixels)
    return list(frames)


def _check_decoded(img: np.ndarray, channels: int | None, max_pixels: int | None) -> None:
    got = 1 if img.ndim == 2 else img.shape[2]
    if channels is not None and got != channels:
        raise ValueError(f"wrong channel count: {got}, expected {channels}")
    if max_pixels is not None and img.shape[0] * img.shape[1] > max_pixels:
        raise ValueError(f"oversize image: {img.shape[1]}x{img.shape[0]} > max_pixels={max_pixels}")


def imread_flags(mode: str, orientation: bool = True) -> int:
    """The ``cv2.imdecode`` flags of a :class:`DecodeImage` mode."""
    if mode not in _IMREAD:
        raise ValueError(f"unknown mode {mode!r}; use one of {sorted(_IMREAD)}")
    if mode == "unchanged":
        # IMREAD_UNCHANGED never applies the EXIF orientation; COLOR | ANYDEPTH | ANYCOLOR
        # keeps depth, channels and alpha as it does, and applies it (as cv2.imread does)
        return 1 | 2 | 4 if orientation else -1
    return _IMREAD[mode] | (0 if orientation else 128)  # 128: IMREAD_IGNORE_ORIENTATION


def may_hold_frames(data: Encoded) -> bool:
    """Whether ``data`` is of a format that can hold several frames: TIFF, GIF, an animated
    PNG (an ``acTL`` chunk before the image data) or an animated WebP. Reads headers only."""
    head = bytes(data[:16])
    if head[:4] in (b"II*\x00", b"MM\x00*") or head[:4] == b"GIF8":
        return True
    if head[:4] == b"RIFF" and head[8:16] == b"WEBPVP8X":
        return len(data) > 20 and bool(data[20] & 0x02)  # the animation flag
    if head[:8] == _PNG_SIG:
        pos = 8
        while pos + 8 <= len(data):
            size, kind = struct.unpack(">I4s", data[pos : pos + 8])
            if kind == b"acTL":
                return True
            if kind in (b"IDAT", b"IEND"):
                return False
            pos += 12 + size
    return False


def frame_key(key: Any, index: int) -> Any:
    """Key of frame ``index`` of a multi-frame image: ``a/scan.tif`` -> ``a/scan-frame1.tif``
    (the extension stays last, so a sink replacing it keeps the frames apart)."""
    if not isinstance(key, str):
        return (key, index)
    root, ext = os.path.splitext(key)
    return f"{root}-frame{index}{ext}"


# (ext, dtype, channels) -> the dtype that format gives back: found by decoding the first
# image of each kind, since OpenCV converts what a format cannot hold to 8 bits with only a
# log line (16-bit to JPEG, float to PNG)
_KEPT_DTYPE: dict[tuple[str, str, int], str] = {}


def check_image_ext(owner: str, ext: Any) -> None:
    """``ext`` names an image format this OpenCV writes (``.png``, ``.jpg`` ...): else a
    ValueError naming ``owner``, before any image meets it."""
    import cv2

    if not (isinstance(ext, str) and ext.startswith(".") and cv2.haveImageWriter("x" + ext)):
        raise ValueError(f"{owner}: ext {ext!r} is not an image format OpenCV writes here; "
                         f"use one such as '.png', '.jpg', '.tiff' or '.webp'")


def encode_image(image: np.ndarray, ext: str = ".png", params: tuple = ()) -> bytes:
    """Encode with OpenCV (``ext`` such as ``.png``); raise ``ValueError`` on failure, and
    when the format cannot hold the image's depth (a 16-bit image as JPEG, a float image as
    PNG), instead of writing it with fewer bits."""
    import cv2

    ok, buf = cv2.imencode(ext, image, list(params))
    if not ok:
        raise ValueError(f"OpenCV could not encode {image.shape} {image.dtype} as {ext}")
    if image.dtype != np.uint8:
        kind = (ext.lower(), image.dtype.str, 1 if image.ndim == 2 else image.shape[2])
        kept = _KEPT_DTYPE.get(kind)
        if kept is None:
            back = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
            kept = _KEPT_DTYPE[kind] = "" if back is None else back.dtype.name
        if kept != image.dtype.name:
            raise ValueError(f"{ext} cannot hold {image.dtype} pixels (OpenCV would write "
                             f"them as {kept or 'something unreadable'}); write .png or .tif "
                             f"for 16 bits, .tif for floats, or convert first")
    return buf.tobytes()


@dataclass(frozen=True)
class DecodeImage(OperatorSpec):
    """``(key, bytes)`` → ``(key, image)``; bad input goes to the dead-letter output.

    Each bad record is a dead letter whose ``where`` is the key (file path, the name an
    image was written to Kafka with, or ``topic/partition@offset``) and whose reason says
    what was wrong: empty file, truncated or corrupt data, not an image, wrong channel
    count, oversize, or the source's own :class:`BadInput` reason. Dead letters are counted
    in ``metrics()[step]["dead_letters"]``. Give the step ``on_error="dead_letter"``: under
    the job default (``raise``) the first bad image stops the job, as any step's dead letter
    does.

    Orientation. A phone's JPEG often stores its pixels sideways with an EXIF tag saying how
    to turn them. As ``cv2.imread`` does, the image is turned upright (``orientation=True``),
    in every mode; ``orientation=False`` keeps the stored order.

    Frames. A multi-page TIFF or an animated GIF, PNG or WebP holds several images.
    ``frames="first"`` decodes the first, as ``cv2.imread`` does, and counts the input in
    :attr:`multi_frame_inputs` with a logged warning; ``"all"`` emits every frame, keyed by
    :func:`frame_key` (``scan-frame1.tif``); ``"dead_letter"`` rejects such an input.
    Inputs that may hold frames are decoded in full to count them (TIFF, GIF, animated PNG
    and WebP; plain PNG and JPEG cost nothing extra).

    Args:
        channels: required channel count (1, 3 or 4); None accepts any.
        max_pixels: larger images are dead letters (checked from the PNG header before
            decoding, so a decompression bomb is never expanded).
        mode: ``unchanged`` (keep channels and depth), ``color`` (BGR) or ``gray``.
        orientation: apply the EXIF orientation.
        frames: ``first``, ``all`` or ``dead_letter`` (see above).
        threads: OpenCV threads per instance.

    Example:
        >>> from rayflow.connectors.images import DecodeImage
        >>> DecodeImage(channels=3, max_pixels=4096 * 4096).mode
        'unchanged'
    """

    channels: int | None = None
    max_pixels: int | None = 100_000_000
    mode: Literal["unchanged", "color", "gray"] = "unchanged"
    threads: int | None = 1
    orientation: bool = True
    frames: Literal["first", "all", "dead_letter"] = "first"

    def __post_init__(self) -> None:
        if self.mode not in _IMREAD:
            raise ValueError(f"DecodeImage: unknown mode {self.mode!r}; use one of "
                             f"{sorted(_IMREAD)}")
        if self.frames not in ("first", "all", "dead_letter"):
            raise ValueError(f"DecodeImage: unknown frames {self.frames!r}; use 'first', "
                             f"'all' or 'dead_letter'")
        if self.channels is not None and self.channels not in (1, 2, 3, 4):
            raise ValueError(f"DecodeImage: channels must be 1, 2, 3, 4 or None, got "
                             f"{self.channels!r}")

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _DecodeLogic(ctx, self)


_log = logging.getLogger("rayflow.images")


class _DecodeLogic(CvLogic):

    def __init__(self, ctx: StepContext, spec: DecodeImage):
        super().__init__(ctx, spec)
        self.multi_frame_inputs = 0

    def _decode(self, key: Any, data: Any) -> list[tuple[Any, np.ndarray]]:
        spec = self.spec
        if not (isinstance(data, (bytes, bytearray, memoryview)) and may_hold_frames(data)):
            return [(key, decode_image(data, spec.mode, spec.channels, spec.max_pixels,
                                       spec.orientation))]
        frames = decode_frames(data, spec.mode, spec.channels, spec.max_pixels,
                               spec.orientation)
        if len(frames) == 1:
            return [(key, frames[0])]
        if spec.frames == "dead_letter":
            raise ValueError(f"{len(frames)} frames in one file (frames='dead_letter'; "
                             f"'first' or 'all' decodes it)")
        if spec.frames == "all":
            return [(frame_key(key, i), f) for i, f in enumerate(frames)]
        self.multi_frame_inputs += 1
        if self.multi_frame_inputs & (self.multi_frame_inputs - 1) == 0:  # 1, 2, 4, 8, ...
            _log.warning("%s[%d]: %r holds %d frames; only the first is decoded "
                         "(frames='all' emits every one); %d such input(s) so far",
                         self.ctx.step_id, self.ctx.instance, key, len(frames),
                         self.multi_frame_inputs)
        return [(key, frames[0])]  # what cv2.imdecode gives

    def process(self, items, event_times):
        out, times, dead = [], [], []
        for i, rec in enumerate(items):
            key, data = (rec[0], rec[1]) if isinstance(rec, tuple) and len(rec) >= 2 \
                else (None, rec)
            try:
                got = self._decode(key, data)
            except Exception as exc:  # noqa: BLE001 - OpenCV errors too: the stream goes on
                reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
                dead.append(self.dead(reason, key, "" if key is None else str(key)))
                continue
            out.extend(got)
            if event_times is not None:
                times.extend([event_times[i]] * len(got))
        if event_times is not None:
            event_times = np.asarray(times, dtype=event_times.dtype)
        return Output(out, event_times, dead)


# -- encoding for the sinks -----------------------------------------------------------------

def _key_image(rec: Any, n: int, instance: int = 0) -> tuple[Any, np.ndarray]:
    """``(key, image)`` of a record; an image without a key is named by the sink instance
    and its number there (``image-<instance>-<n>``, as Flink names part files), so that two
    instances never give two images one name."""
    if isinstance(rec, Tile):
        return rec.key, rec.data
    if isinstance(rec, tuple) and len(rec) >= 2:
        return rec[0], rec[1]
    return f"image-{instance}-{n:08d}", rec


class _EncodingWriter(SinkWriter):
    """Encodes each image; subclasses decide what happens to the bytes."""

    def __init__(self, ctx: StepContext, ext: str, params: tuple, threads: int | None,
                 resume_state: Any = None):
        self.ctx, self.ext, self.params = ctx, ext, tuple(params)
        self.images = self.bytes = 0
        # a recovery of this run counts on from the checkpoint, so a replayed image without
        # a key gets the name it had
        for images, nbytes in restored_by_run(resume_state, ctx):
            self.images += images
            self.bytes += nbytes
        if threads is not None:
            import cv2

            cv2.setNumThreads(threads)

    def write(self, items, event_times, in_time):
        dead = []
        for rec in items:
            key, img = _key_image(rec, self.images, self.ctx.instance)
            try:
                data = encode_image(img, self.ext, self.params)
                self.deliver(key, data)
            except Exception as exc:  # noqa: BLE001 - one bad image must not stop the sink
                dead.append(DeadLetter(self.ctx.step_id, self.ctx.instance,
                                       f"{type(exc).__name__}: {exc}", brief(key), str(key)))
                continue
            self.images += 1
            self.bytes += len(data)
        return dead

    def deliver(self, key: Any, data: bytes) -> None:
        raise NotImplementedError

    def snapshot(self, checkpoint_id: int) -> RunState:
        self.flush()
        return self.delivered()

    def delivered(self) -> RunState:
        """What this run delivered (the images and bytes), as the snapshot keeps it."""
        return RunState(self.ctx.run_id, (self.images, self.bytes))

    def result(self) -> list[dict]:
        return [{"instance": self.ctx.instance, "images": self.images, "bytes": self.bytes}]
