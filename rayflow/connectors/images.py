"""Image sources and sinks, and the decode step that turns bad input into dead letters.

Records. Sources emit ``(key, payload)`` tuples: ``key`` names where the image came from (a
file path; through Kafka, the key the image was written with, or ``topic/partition@offset``
for a message without rayflow's chunk header) and ``payload`` is the encoded image (``bytes``), a
decoded image (``np.ndarray``, the synthetic source) or a :class:`BadInput` when the source
already knows the input is bad (an unreadable or oversize file, an incomplete chunked image).
:class:`DecodeImage` turns ``(key, bytes)`` into ``(key, image)`` and sends everything it cannot
decode (corrupt, truncated, empty, not an image, wrong channel count, oversize) to the
dead-letter output with the key and the reason; the stream goes on and each is counted.
Tuples (not objects) keep the runtime's byte estimate of a batch exact, so channels bound
images in flight by their size.

The W1 pipeline (read PNG files, blur, encode PNG and drop):

    >>> import rayflow as rf
    >>> from rayflow.connectors.images import DecodeImage, DirectorySource, PngDiscardSink
    >>> from rayflow.operators.image import GaussianBlur
    >>> flow = rf.Dataflow("w1")
    >>> (flow.source("read", DirectorySource("/tmp/images", pattern="*.png"))
    ...      .apply("decode", DecodeImage(channels=3), on_error="dead_letter")
    ...      .apply("blur", GaussianBlur(5, 3.0, 3.0))
    ...      .sink("write", PngDiscardSink()))

Kafka's default message limit is 1 MB. :class:`KafkaImageSink` splits a larger encoded image
into chunks (each under ``chunk_bytes``, keyed by image so they share a partition), and
:class:`KafkaImageSource` puts them back together; with ``chunking=False`` a large image is a
dead letter naming the limit, never a silent drop.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import struct
import time
import uuid
from collections import OrderedDict, deque
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from rayflow.batches import brief
from rayflow.connectors.base import (
    SinkSpec,
    SinkWriter,
    SourceReader,
    SourceSpec,
    SplitEnumerator,
    guided_chunk,
)
from rayflow.operators.base import (
    DeadLetter,
    Logic,
    OperatorSpec,
    Output,
    Rescaled,
    StepContext,
)
from rayflow.operators.image import CvLogic, Halo, Tile, cut_tile, place_tile, tile_regions

MiB = 1 << 20


class BadInput(NamedTuple):
    """Payload of a record the source could not read; :class:`DecodeImage` dead-letters it."""

    reason: str


# -- sources ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class DirectorySource(SourceSpec):
    """Files of a directory as ``(path, bytes)`` records, in name order.

    Under the runtime the files are handed out on request by the step's
    :class:`~rayflow.connectors.base.SplitEnumerator` (as Flink's FileSource does): in
    guided chunks, large at first and one file at the end, so parallel readers finish
    together even when one runs slower. Without an enumerator (a reader built on its own)
    instance ``i`` of ``n`` reads every ``n``-th file. With ``watch=True`` the directory is
    scanned again every ``poll_interval_s`` (until the job is stopped); a file is read once
    its size and modification time have not changed for ``settle_s``, so half-written files
    are not read.

    Args:
        path: the directory.
        pattern: glob on file names (``*.png``), or several (``("*.png", "*.jpg")``): a
            file matching any is read. Globs match case as the file system spells it.
            Without ``watch``, a directory where no file matches is an error.
        watch: keep watching for new files instead of ending after the first scan.
        poll_interval_s: time between scans when watching.
        settle_s: how long a new file must stay unchanged before it is read (watching only).
        max_batch_bytes: stop filling a batch once this many bytes were read, so a batch of
            large images stays small whatever ``batch_size`` says.
        max_file_bytes: larger files are not read; they become a :class:`BadInput`.
        recursive: scan subdirectories too.
    """

    path: str
    pattern: str | tuple[str, ...] = "*"
    watch: bool = False
    poll_interval_s: float = 0.5
    settle_s: float = 0.5
    max_batch_bytes: int = 4 * MiB
    max_file_bytes: int | None = 256 * MiB
    recursive: bool = False

    def __post_init__(self) -> None:
        pats = (self.pattern,) if isinstance(self.pattern, str) else self.pattern
        if not isinstance(pats, (tuple, list)) or not pats or \
                not all(isinstance(p, str) and p for p in pats):
            raise ValueError(f"DirectorySource: pattern must be a glob or a list of globs, "
                             f"got {self.pattern!r}")
        object.__setattr__(self, "pattern", pats[0] if len(pats) == 1 else tuple(pats))

    @property
    def patterns(self) -> tuple[str, ...]:
        return (self.pattern,) if isinstance(self.pattern, str) else self.pattern

    def matches(self, name: str) -> bool:
        """Whether a file name matches the source's pattern(s)."""
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        return _DirectoryReader(self, ctx, resume_state)

    def enumerator(self, parallelism: int, restored: list[Any]) -> SplitEnumerator | None:
        if parallelism == 1:
            return None  # nothing to balance: the one reader scans for itself
        return _FileEnumerator(self, parallelism, _finished(restored))


def _finished(states: Any) -> set[str]:
    """Files finished according to resume states: one instance's list, a :class:`Rescaled`
    (every old instance's), or a list of such lists."""
    if isinstance(states, Rescaled):
        states = states.handles
    elif states and isinstance(states[0], str):
        return set(states)
    return {name for s in states or () if s for name in s}


class _Scanner:
    """Finds a :class:`DirectorySource`'s files once each, in name order; when watching,
    only after they have settled. ``mine(name, position)`` filters (a static split)."""

    def __init__(self, spec: DirectorySource, skip: set[str], mine: Any = None):
        self.spec, self.root, self.mine = spec, Path(spec.path), mine
        if not self.root.is_dir():
            raise ValueError(f"DirectorySource: {spec.path!r} is not a directory")
        self.seen = set(skip)  # finished or handed out already
        self.settling: dict[str, tuple[int, int, float]] = {}  # path -> (size, mtime, since)
        self.last_scan = -1e9
        self.scanned_once = False

    def due(self) -> bool:
        return time.monotonic() - self.last_scan >= self.spec.poll_interval_s

    def _names(self) -> list[str]:
        match = self.spec.matches
        if self.spec.recursive:
            return sorted(str(p) for p in self.root.rglob("*") if match(p.name) and p.is_file())
        with os.scandir(self.root) as it:
            return sorted(e.path for e in it if match(e.name) and e.is_file())

    def scan(self) -> list[str]:
        """The files not seen before (and, watching, settled since the first scan)."""
        now = time.monotonic()
        self.last_scan = now
        names = self._names()
        if not names and not self.scanned_once and not self.spec.watch:
            where = "or below " if self.spec.recursive else ""
            pats = " or ".join(repr(p) for p in self.spec.patterns)
            raise ValueError(f"DirectorySource: no file in {where}{self.spec.path!r} matches "
                             f"{pats}")
        out = []
        for pos, name in enumerate(names):
            if name in self.seen or (self.mine is not None and not self.mine(name, pos)):
                continue
            if self.spec.watch and self.scanned_once:
                try:
                    st = os.stat(name)
                except OSError:
                    continue
                sig = (st.st_size, st.st_mtime_ns)
                prev = self.settling.get(name)
                if prev is None or prev[:2] != sig:
                    self.settling[name] = (*sig, now)
                    continue
                if now - prev[2] < self.spec.settle_s:
                    continue
                self.settling.pop(name, None)
            self.seen.add(name)
            out.append(name)
        self.scanned_once = True
        return out


class _FileEnumerator(SplitEnumerator):
    """The files of a :class:`DirectorySource` in guided chunks (see
    :func:`~rayflow.connectors.base.guided_chunk`). The first scan happens at the first
    request, where the enumerator lives."""

    def __init__(self, spec: DirectorySource, parallelism: int, finished: set[str]):
        self.spec, self.parallelism = spec, parallelism
        self.scanner = _Scanner(spec, finished)
        self.queue: deque[str] = deque()

    def assign(self, instance: int) -> list[str] | None:
        if not self.scanner.scanned_once or (self.spec.watch and self.scanner.due()):
            self.queue.extend(self.scanner.scan())
        if not self.queue:
            return [] if self.spec.watch else None
        n = guided_chunk(len(self.queue), self.parallelism)
        return [self.queue.popleft() for _ in range(n)]


class _DirectoryReader(SourceReader):
    def __init__(self, spec: DirectorySource, ctx: StepContext, resume_state: Any):
        # the link to the step's enumerator; not named ``splits``, which a reader defines
        # as a method naming the splits it reads (event time is tracked per split)
        self.spec, self.split_client = spec, ctx.splits
        finished = _finished(resume_state)
        if self.split_client is not None and isinstance(resume_state, Rescaled) and ctx.instance:
            finished = set()  # instance 0 carries every old instance's files on
        self.done: set[str] = finished
        self.queue: deque[str] = deque()
        self.pending: Any = None  # a Future of the enumerator's next assignment
        self.no_more = False  # the enumerator has nothing left, ever
        self.ask_after = 0.0  # watching, nothing new: ask again after this monotonic time
        self.scanner = None
        if self.split_client is None:
            k, n = ctx.instance, ctx.parallelism
            if spec.watch:
                import zlib  # positions shift as files arrive: split by a stable hash

                def mine(name, pos):
                    return zlib.crc32(name.encode()) % n == k
            else:
                def mine(name, pos):
                    return pos % n == k
            self.scanner = _Scanner(spec, finished, mine)
            self.queue.extend(self.scanner.scan())
        else:
            self.pending = self.split_client.request()  # the first files, while the job starts

    def _refill(self, timeout_s: float) -> None:
        if self.scanner is not None:  # static split
            if self.spec.watch:
                wait = self.scanner.last_scan + self.spec.poll_interval_s - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, timeout_s))
                if self.scanner.due():
                    self.queue.extend(self.scanner.scan())
            return
        if self.no_more:
            return
        if self.pending is None:
            wait = self.ask_after - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, timeout_s))
                if time.monotonic() < self.ask_after:
                    return
            self.pending = self.split_client.request()
        try:
            got = self.pending.result(timeout=max(timeout_s, 0.0))
        except FutureTimeout:
            return
        self.pending = None
        if got is None:
            self.no_more = True
        elif not got:
            self.ask_after = time.monotonic() + self.spec.poll_interval_s
        self.queue.extend(got or ())

    def poll(self, max_records, timeout_s):
        if not self.queue:
            self._refill(timeout_s)
        if not self.queue:
            return None
        out, total = [], 0
        limit = self.spec.max_file_bytes
        while self.queue and len(out) < max_records and total < self.spec.max_batch_bytes:
            name = self.queue.popleft()
            self.done.add(name)
            try:
                size = os.path.getsize(name)
                if limit is not None and size > limit:
                    out.append((name, BadInput(f"oversize file: {size} bytes > "
                                               f"max_file_bytes={limit}")))
                    continue
                with open(name, "rb") as f:
                    data = f.read()
            except OSError as exc:
                out.append((name, BadInput(f"unreadable file: {exc.strerror or exc}")))
                continue
            out.append((name, data))
            total += len(data)
        if self.split_client is not None and self.pending is None and not self.no_more and \
                len(self.queue) < len(out):
            self.pending = self.split_client.request()  # the next batch may need more: ask now
        return out, None

    @property
    def exhausted(self) -> bool:
        if self.queue:
            return False
        return self.no_more if self.scanner is None else not self.spec.watch

    def snapshot(self) -> list[str]:
        return sorted(self.done)


def synthetic_image(i: int, height: int, width: int, channels: int = 3,
                    seed: int = 0) -> np.ndarray:
    """A deterministic test image: smooth gradients plus noise (codec cost like a photo's).

    Image ``i`` differs from image ``i + 1``; the same ``(i, seed)`` gives the same pixels.
    """
    rng = np.random.default_rng((seed, i))
    yy = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    xx = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    base = (yy * 0.6 + xx * 0.4 + (i * 37) % 256) % 256
    shape = (height, width) if channels == 1 else (height, width, channels)
    noise = rng.integers(0, 48, shape, dtype=np.uint8)
    img = base if channels == 1 else np.repeat(base[:, :, None], channels, axis=2)
    return (img.astype(np.uint8) + noise).astype(np.uint8)


def _size(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


@dataclass(frozen=True)
class SyntheticImageSource(SourceSpec):
    """``count`` synthetic images of ``size`` pixels as ``(key, image)`` records.

    Args:
        count: number of images over all instances.
        size: side (int) or (height, width).
        channels: 1 (gray) or 3 (BGR) or 4.
        encode: an extension such as ``".png"`` to emit encoded ``bytes`` instead of arrays
            (then decode downstream, like a file source).
        seed: changes every image.
        max_batch_bytes: bytes per batch at most (see :class:`DirectorySource`).
    """

    count: int
    size: int | tuple[int, int] = 100
    channels: int = 3
    encode: str | None = None
    seed: int = 0
    max_batch_bytes: int = 4 * MiB

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        return _SyntheticReader(self, ctx, int(resume_state or 0))


class _SyntheticReader(SourceReader):
    def __init__(self, spec: SyntheticImageSource, ctx: StepContext, done: int):
        self.spec, self.mine = spec, range(ctx.instance, spec.count, ctx.parallelism)
        self.done = done

    def poll(self, max_records, timeout_s):
        spec = self.spec
        h, w = _size(spec.size)
        out, total = [], 0
        while self.done < len(self.mine) and len(out) < max_records \
                and total < spec.max_batch_bytes:
            i = self.mine[self.done]
            img = synthetic_image(i, h, w, spec.channels, spec.seed)
            payload: Any = img
            if spec.encode:
                payload = encode_image(img, spec.encode)
            out.append((f"synthetic-{i:06d}{spec.encode or ''}", payload))
            total += len(payload) if isinstance(payload, bytes) else img.nbytes
            self.done += 1
        return (out, None) if out else None

    @property
    def exhausted(self) -> bool:
        return self.done >= len(self.mine)

    def snapshot(self) -> int:
        return self.done


def write_image_set(directory: str | Path, count: int, size: int | tuple[int, int],
                    channels: int = 3, ext: str = ".png", seed: int = 0) -> list[Path]:
    """Write ``count`` synthetic images to ``directory`` (for benchmarks and tests)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    h, w = _size(size)
    paths = []
    for i in range(count):
        p = d / f"img-{i:06d}{ext}"
        p.write_bytes(encode_image(synthetic_image(i, h, w, channels, seed), ext))
        paths.append(p)
    return paths


# -- decoding --------------------------------------------------------------------------------

_PNG_SIG = b"\x89PNG\r\n\x1a\n"
_IMREAD = {"unchanged": -1, "gray": 0, "color": 1}


def png_size(data: bytes) -> tuple[int, int] | None:
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


def decode_image(data: bytes, mode: str = "unchanged", channels: int | None = None,
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


def decode_frames(data: bytes, mode: str = "unchanged", channels: int | None = None,
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


def may_hold_frames(data: bytes) -> bool:
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


# -- sinks -----------------------------------------------------------------------------------

def _key_image(rec: Any, n: int) -> tuple[Any, np.ndarray]:
    if isinstance(rec, Tile):
        return rec.key, rec.data
    if isinstance(rec, tuple) and len(rec) >= 2:
        return rec[0], rec[1]
    return f"image-{n:08d}", rec


class _EncodingWriter(SinkWriter):
    """Encodes each image; subclasses decide what happens to the bytes."""

    def __init__(self, ctx: StepContext, ext: str, params: tuple, threads: int | None):
        self.ctx, self.ext, self.params = ctx, ext, tuple(params)
        self.images = self.bytes = 0
        if threads is not None:
            import cv2

            cv2.setNumThreads(threads)

    def write(self, items, event_times, in_time):
        dead = []
        for rec in items:
            key, img = _key_image(rec, self.images)
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

    def result(self) -> list[dict]:
        return [{"instance": self.ctx.instance, "images": self.images, "bytes": self.bytes}]


@dataclass(frozen=True)
class PngDiscardSink(SinkSpec):
    """The paper's ``/dev/null.png``: encode every image as PNG and drop the bytes.

    ``job.collect(step)`` returns one ``{"instance", "images", "bytes"}`` dict per instance.

    Example:
        >>> from rayflow.connectors.images import PngDiscardSink
        >>> PngDiscardSink().ext
        '.png'
    """

    params: tuple = ()
    threads: int | None = 1
    ext: str = ".png"

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        return _DiscardEncodedWriter(ctx, self.ext, self.params, self.threads)


class _DiscardEncodedWriter(_EncodingWriter):
    def deliver(self, key, data):
        pass


@dataclass(frozen=True)
class DirectorySink(SinkSpec):
    """Encode each ``(key, image)`` and write it under ``path``, keeping the key's relative
    path, with its extension replaced by ``ext``: key ``/in/a/shot.jpg`` with
    ``relative_to="/in"`` is written to ``path/a/shot.png``.

    Without ``relative_to``, a relative key (``a/shot.jpg``) keeps its folders and an absolute
    one keeps its file name only. Never an overwrite: an output name already written with
    other bytes (``photo.png`` and ``photo.jpg`` both become ``photo.png``; or a file left by
    an earlier run) makes the second image a dead letter naming both; the same bytes again
    (a record replayed after a restore) are not. A key that leaves ``path`` (``..``), or
    an absolute key outside ``relative_to``, is a dead letter too.

    Files appear atomically (written to a temporary name, then linked into place), so a
    :class:`DirectorySource` watching ``path`` never reads half a file.

    Args:
        path: the output directory (created if missing).
        ext: encoding and extension of every file (``.png``).
        params: ``cv2.imencode`` parameters.
        relative_to: the directory the keys are paths in (the source's ``path``).
        threads: OpenCV threads per instance.
    """

    path: str
    ext: str = ".png"
    params: tuple = ()
    threads: int | None = 1
    relative_to: str | None = None

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        Path(self.path).mkdir(parents=True, exist_ok=True)
        return _DirectoryWriter(ctx, self)

    def output_name(self, key: Any, n: int = 0) -> Path:
        """The path (relative to ``path``) that the image keyed ``key`` is written to;
        ``ValueError`` if the key has no place under ``path``."""
        if not isinstance(key, str) or not key:
            return Path(f"image-{n:08d}{self.ext}")
        p = Path(key)
        if self.relative_to is not None and p.is_absolute():
            try:
                p = Path(os.path.abspath(p)).relative_to(os.path.abspath(self.relative_to))
            except ValueError:
                raise ValueError(f"key {key!r} is not under relative_to="
                                 f"{self.relative_to!r}") from None
        elif p.is_absolute():
            p = Path(p.name)
        if ".." in p.parts or not p.name or p.name in (".", ".."):
            raise ValueError(f"key {key!r} names no file inside the output directory")
        return p.with_suffix(self.ext) if p.suffix else p.with_name(p.name + self.ext)


class _DirectoryWriter(_EncodingWriter):
    def __init__(self, ctx: StepContext, spec: DirectorySink):
        super().__init__(ctx, spec.ext, spec.params, spec.threads)
        self.spec, self.dir = spec, Path(spec.path)
        self.written: dict[Path, Any] = {}  # output name -> the key written there

    def deliver(self, key, data):
        rel = self.spec.output_name(key, self.images)
        other = self.written.get(rel)
        if other is not None and other != key:
            raise FileExistsError(f"{str(rel)!r} was already written by {other!r}; {key!r} "
                                  f"is not written over it")
        final = self.dir / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{self.ctx.instance}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        try:
            try:
                os.link(tmp, final)  # fails if the name exists: never replaces a file
            except FileExistsError:
                if final.read_bytes() == data:
                    return  # the same image again (a replay after a restore)
                raise FileExistsError(f"{str(rel)!r} exists with other content; {key!r} "
                                      f"is not written over it") from None
            except OSError as exc:  # a file system without hard links
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                if final.exists():
                    raise FileExistsError(f"{str(rel)!r} exists; {key!r} is not written "
                                          f"over it") from None
                os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        self.written[rel] = key


# -- Kafka: chunked images -------------------------------------------------------------------

# Chunk header: magic, image id, chunk index, chunk count, total bytes, key length; then key.
_MAGIC = b"RFI1"
_HEADER = struct.Struct(">4s16sIIQH")


_MAX_KEY_BYTES = 1024


def _key_bytes(key: str) -> bytes:
    kb = key.encode()
    if len(kb) > _MAX_KEY_BYTES:
        raise ValueError(f"image key of {len(kb)} bytes is longer than the {_MAX_KEY_BYTES} "
                         f"a chunk header holds: {key[:80]!r}...")
    return kb


def chunk_image(data: bytes, key: str, chunk_bytes: int) -> list[bytes]:
    """Split an encoded image into Kafka messages of at most ``chunk_bytes`` bytes each; each
    carries ``key`` (at most 1024 bytes), which :class:`KafkaImageSource` gives the image."""
    kb = _key_bytes(key)
    room = chunk_bytes - _HEADER.size - len(kb)
    if room <= 0:
        raise ValueError(f"chunk_bytes={chunk_bytes} leaves no room for data")
    count = max(1, -(-len(data) // room))
    image_id = uuid.uuid4().bytes
    return [_HEADER.pack(_MAGIC, image_id, i, count, len(data), len(kb)) + kb
            + data[i * room : (i + 1) * room] for i in range(count)]


def chunk_message_key(message: bytes) -> bytes:
    """Kafka key of a chunk: its image id, so every chunk of an image shares a partition."""
    return message[4:20] if message[:4] == _MAGIC else b""


@dataclass(frozen=True)
class KafkaImageSink(SinkSpec):
    """Encode each ``(key, image)`` and write it to a Kafka topic, chunked when large.

    Args:
        topic, bootstrap, client, options: as for :class:`rayflow.KafkaSink`.
        ext: encoding (``.png``).
        chunk_bytes: largest message written; keep it under the broker's
            ``message.max.bytes`` (1 MB by default).
        chunking: False writes each image as one message; an image over ``chunk_bytes``
            is then a dead letter naming the limit.
    """

    topic: str
    bootstrap: str | None = None
    ext: str = ".png"
    params: tuple = ()
    chunk_bytes: int = 900_000
    chunking: bool = True
    client: Literal["kafka-python", "confluent"] = "kafka-python"
    options: dict = field(default_factory=dict)
    threads: int | None = 1

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        from rayflow.connectors.kafka import KafkaSink

        inner = KafkaSink(self.topic, bootstrap=self.bootstrap, key=chunk_message_key,
                          max_message_bytes=self.chunk_bytes, client=self.client,
                          options=self.options).build(ctx)
        return _KafkaImageWriter(ctx, self, inner)


class _KafkaImageWriter(_EncodingWriter):
    def __init__(self, ctx, spec: KafkaImageSink, inner: SinkWriter):
        super().__init__(ctx, spec.ext, spec.params, spec.threads)
        self.spec, self.inner, self.pending = spec, inner, []

    def deliver(self, key, data):
        spec = self.spec
        if spec.chunking:
            self.pending.extend(chunk_image(data, str(key), spec.chunk_bytes))
            return
        kb = _key_bytes(str(key))
        msg = _HEADER.pack(_MAGIC, uuid.uuid4().bytes, 0, 1, len(data), len(kb)) + kb + data
        if len(msg) > spec.chunk_bytes:
            raise ValueError(f"encoded image of {len(msg)} bytes exceeds the Kafka message "
                             f"limit chunk_bytes={spec.chunk_bytes}; enable chunking")
        self.pending.append(msg)

    def write(self, items, event_times, in_time):
        dead = super().write(items, event_times, in_time)
        if self.pending:
            dead = dead + list(self.inner.write(self.pending, None, in_time) or ())
            self.pending = []
        return dead

    def flush(self):
        self.inner.flush()

    def close(self):
        self.inner.close()


@dataclass(frozen=True)
class KafkaImageSource(SourceSpec):
    """Encoded images from a Kafka topic as ``(key, bytes)`` records.

    Messages written by :class:`KafkaImageSink` are reassembled from their chunks and keep
    the key they were written with (a file name, say); any other message is taken as one
    whole encoded image, keyed by its position ``topic/partition@offset``. An image whose
    chunks do not all arrive (the topic ends, or more than ``max_pending_bytes`` of partial
    images pile up) becomes a :class:`BadInput` record, so :class:`DecodeImage`
    dead-letters it; the reason names the offset of its first chunk.

    Checkpoints. A checkpoint taken while an image is partly read stores the offset of the
    image's first chunk, not the offset read up to, and the offsets after it that were
    already delivered (as ranges). A restored source reads from there again, rebuilds the
    partial image and skips what it had delivered: each image is emitted once, and the
    checkpoint stays a few numbers per partition instead of holding image bytes.

    Args:
        topic, bootstrap, start, bounded, client, options: as for :class:`rayflow.KafkaSource`.
        max_image_bytes: a chunked image announcing more bytes is rejected.
        max_pending_bytes: bytes of partial images held at most.
    """

    topic: str
    bootstrap: str | None = None
    start: Literal["earliest", "latest", "committed"] = "earliest"
    group_id: str | None = None
    bounded: bool = False
    client: Literal["kafka-python", "confluent"] = "kafka-python"
    options: dict = field(default_factory=dict)
    max_image_bytes: int = 256 * MiB
    max_pending_bytes: int = 512 * MiB

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        from rayflow.connectors.kafka import KafkaSource

        offsets, skip = _split_resume_state(resume_state)
        inner = KafkaSource(self.topic, bootstrap=self.bootstrap, start=self.start,
                            group_id=self.group_id, bounded=self.bounded, client=self.client,
                            options=self.options, with_metadata=True).build(ctx, offsets)
        return _KafkaImageReader(self, inner, skip)


def _split_resume_state(state: Any) -> tuple[Any, dict[int, list[tuple[int, int]]]]:
    """The inner Kafka reader's offsets and the delivered ranges of a checkpoint of
    :class:`KafkaImageSource` (one instance's, or a :class:`Rescaled` of every old one's)."""
    def one(s: Any) -> tuple[Any, dict]:
        if isinstance(s, dict) and set(s) == {"offsets", "skip"}:
            return s["offsets"], {int(p): [tuple(r) for r in rs] for p, rs in s["skip"].items()}
        return s, {}  # bare offsets

    if isinstance(state, Rescaled):
        parts = [one(h) for h in state.handles]
        skip = {p: rs for _, s in parts for p, rs in s.items()}  # partitions are disjoint
        return Rescaled(tuple(o for o, _ in parts), state.old_parallelism), skip
    return one(state)


class _Partial:
    __slots__ = ("key", "where", "partition", "first", "count", "total", "parts", "offsets",
                 "size", "event_time")

    def __init__(self, key: str, where: str, partition: int, first: int, count: int,
                 total: int):
        self.key, self.where, self.count, self.total = key, where, count, total
        self.partition, self.first = partition, first
        self.parts: dict[int, bytes] = {}
        self.offsets: list[int] = []
        self.size = 0
        self.event_time = 0.0


def _ranges(offsets: Any, ranges: Any = ()) -> list[tuple[int, int]]:
    """Offsets and ``[start, end)`` ranges as sorted, merged ``[start, end)`` runs."""
    out: list[tuple[int, int]] = []
    for a, b in sorted([(o, o + 1) for o in set(offsets)] + [tuple(r) for r in ranges]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class _KafkaImageReader(SourceReader):
    def __init__(self, spec: KafkaImageSource, inner: Any,
                 skip: dict[int, list[tuple[int, int]]] | None = None):
        self.spec, self.inner = spec, inner
        self.partial: OrderedDict[bytes, _Partial] = OrderedDict()
        self.pending_bytes = 0
        self.flushed = False
        # partition -> offsets delivered since its oldest partial image's first chunk
        self.done: dict[int, list[int]] = {}
        # partition -> [start, end) offset ranges delivered before the restored checkpoint
        self.skip = {p: sorted(rs) for p, rs in (skip or {}).items() if rs}

    def _skipped(self, p: int, off: int) -> bool:
        ranges = self.skip.get(p)
        while ranges and ranges[0][1] <= off:
            ranges.pop(0)
        return bool(ranges) and ranges[0][0] <= off

    def _delivered(self, p: int, offsets: list[int]) -> None:
        if any(part.partition == p for part in self.partial.values()):
            self.done.setdefault(p, []).extend(offsets)
        else:
            self.done.pop(p, None)  # nothing partial: the committed offset covers it all

    def poll(self, max_records, timeout_s):
        got = self.inner.poll(max_records, timeout_s)
        out, times = [], []
        if got is not None:
            messages, stamps = got
            stamps = np.zeros(len(messages)) if stamps is None else stamps
            for m, t in zip(messages, stamps):
                if self._skipped(m.partition, m.offset):
                    self._delivered(m.partition, [m.offset])
                    continue
                for rec in self._take(m.value, m.partition, m.offset, float(t)):
                    out.append(rec[:2])
                    times.append(rec[2])
        if self.inner.exhausted and not self.flushed:
            self.flushed = True  # the topic ended: what is still partial never completes
            parts = list(self.partial.values())
            self.partial.clear()
            self.pending_bytes = 0
            for part in parts:
                out.append((part.key or part.where, BadInput(
                    f"incomplete chunked image {part.key!r} (first chunk at {part.where}): "
                    f"{len(part.parts)} of {part.count} chunks at end of topic")))
                times.append(part.event_time)
                self._delivered(part.partition, part.offsets)
        return (out, np.asarray(times, dtype=np.float64)) if out else None

    def _take(self, v: bytes, p: int, off: int, t: float) -> list[tuple]:
        where = f"{self.spec.topic}/{p}@{off}"
        if v is None or len(v) < _HEADER.size or v[:4] != _MAGIC:
            self._delivered(p, [off])
            return [(where, v if v is not None else b"", t)]
        _, image_id, idx, count, total, klen = _HEADER.unpack_from(v)
        key = v[_HEADER.size : _HEADER.size + klen].decode(errors="replace")
        data = v[_HEADER.size + klen :]
        if total > self.spec.max_image_bytes:
            self._delivered(p, [off])
            return [(key or where, BadInput(
                f"oversize image {key!r} (at {where}): {total} bytes > "
                f"max_image_bytes={self.spec.max_image_bytes}"), t)] if idx == 0 else []
        if count == 1:
            self._delivered(p, [off])
            return [(key or where, data, t)]
        part = self.partial.get(image_id)
        if part is None:
            part = self.partial[image_id] = _Partial(key, where, p, off, count, total)
        if idx in part.parts or idx >= count:
            self._delivered(p, [off])  # a repeated or impossible chunk: nothing to rebuild
            return []
        part.parts[idx] = data
        part.offsets.append(off)
        part.size += len(data)
        part.event_time = max(part.event_time, t)
        self.pending_bytes += len(data)
        out: list[tuple] = []
        finished: list[_Partial] = []
        if len(part.parts) == count:
            del self.partial[image_id]
            self.pending_bytes -= part.size
            blob = b"".join(part.parts[i] for i in range(count))
            if len(blob) != total:
                out.append((key or part.where, BadInput(
                    f"chunked image {key!r} (first chunk at {part.where}): {len(blob)} "
                    f"bytes, header says {total}"), t))
            else:
                out.append((key or part.where, blob, t))
            finished.append(part)
        while self.pending_bytes > self.spec.max_pending_bytes and self.partial:
            _, old = self.partial.popitem(last=False)
            self.pending_bytes -= old.size
            out.append((old.key or old.where, BadInput(
                f"incomplete chunked image {old.key!r} (first chunk at {old.where}) "
                f"evicted: over max_pending_bytes"), t))
            finished.append(old)
        for f in finished:
            self._delivered(f.partition, f.offsets)
        return out

    @property
    def exhausted(self) -> bool:
        return self.inner.exhausted and self.flushed

    def snapshot(self) -> dict:
        """Offsets to read from (a partial image's first chunk, where one is partly read)
        and the ranges after them already delivered."""
        nxt = self.inner.snapshot()
        low: dict[int, int] = {}
        for part in self.partial.values():
            low[part.partition] = min(low.get(part.partition, part.first), part.first)
        offsets = {p: min(o, low.get(int(p), o)) for p, o in nxt.items()}
        skip: dict[int, list[tuple[int, int]]] = {}
        for p, start in offsets.items():
            p = int(p)
            runs = _ranges([o for o in self.done.get(p, ()) if o >= start],
                           [(max(a, start), b) for a, b in self.skip.get(p, ()) if b > start])
            if runs:
                skip[p] = runs
        for p in list(self.done):
            if p not in low:
                del self.done[p]
            else:
                self.done[p] = [o for o in self.done[p] if o >= low[p]]
        return {"offsets": offsets, "skip": skip}

    def close(self) -> None:
        self.inner.close()


# -- out-of-core tiles: images larger than memory ------------------------------------------

@dataclass(frozen=True)
class NpyTileSource(SourceSpec):
    """Tiles (with halo) of one large image stored as a ``.npy`` file, read tile by tile.

    Each poll maps the file, copies out the tile and unmaps it again, so a source instance
    holds one batch of tiles, never the image: memory stays flat whatever the image size.
    Instance ``i`` of ``n`` reads tiles ``i, i + n, ...``.

    Args:
        path: the ``.npy`` file (H × W or H × W × C).
        tile: tile size, int or (height, width).
        halo: the filter's halo (``spec.halo``).
        border: the filter's border (``spec.border``).
        tiles_per_batch: tiles per batch at most.
    """

    path: str
    tile: int | tuple[int, int]
    halo: Halo
    border: str = "reflect101"
    tiles_per_batch: int = 2

    def build(self, ctx: StepContext, resume_state: Any = None) -> SourceReader:
        return _NpyTileReader(self, ctx, int(resume_state or 0))


class _NpyTileReader(SourceReader):
    def __init__(self, spec: NpyTileSource, ctx: StepContext, done: int):
        self.spec = spec
        arr = np.load(spec.path, mmap_mode="r")
        self.shape = tuple(arr.shape)
        del arr
        regions = tile_regions(self.shape, spec.tile)
        self.count = len(regions)
        self.mine = [(i, regions[i]) for i in range(ctx.instance, self.count, ctx.parallelism)]
        self.done = done

    def poll(self, max_records, timeout_s):
        if self.exhausted:
            return None
        spec, out = self.spec, []
        image = np.load(spec.path, mmap_mode="r")
        try:
            while self.done < len(self.mine) and len(out) < min(max_records, spec.tiles_per_batch):
                i, (y0, y1, x0, x1) = self.mine[self.done]
                data = cut_tile(image, y0, y1, x0, x1, Halo(*spec.halo), spec.border)
                out.append(Tile(spec.path, i, self.count, y0, x0, y1 - y0, x1 - x0,
                                self.shape, Halo(*spec.halo), data))
                self.done += 1
        finally:
            del image  # unmap: the pages read leave this process's memory
        return out, None

    @property
    def exhausted(self) -> bool:
        return self.done >= len(self.mine)

    def snapshot(self) -> int:
        return self.done


@dataclass(frozen=True)
class NpyTileSink(SinkSpec):
    """Write filtered tiles into an existing ``.npy`` file (made with
    ``np.lib.format.open_memmap``), mapping it per batch so memory stays flat."""

    path: str

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        return _NpyTileWriter(ctx, self.path)


class _NpyTileWriter(SinkWriter):
    def __init__(self, ctx: StepContext, path: str):
        self.ctx, self.path, self.tiles = ctx, path, 0

    def write(self, items, event_times, in_time):
        out = np.load(self.path, mmap_mode="r+")
        try:
            for t in items:
                place_tile(out, t)
                self.tiles += 1
            out.flush()
        finally:
            del out

    def result(self) -> list[dict]:
        return [{"instance": self.ctx.instance, "tiles": self.tiles}]
