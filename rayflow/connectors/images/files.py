"""Images as files: a directory source (and a synthetic one for benchmarks and tests), the
directory and discarding sinks."""

from __future__ import annotations

import errno
import fnmatch
import numbers
import os
import time
import uuid
from collections import deque
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rayflow.connectors.images.codecs import (
    BadInput,
    MiB,
    _EncodingWriter,
    check_image_ext,
    encode_image,
)
from rayflow.core.connectors import (
    SinkSpec,
    SinkWriter,
    SourceReader,
    SourceSpec,
    SplitEnumerator,
    guided_chunk,
)
from rayflow.core.operators import (
    Rescaled,
    StepContext,
)
from rayflow.errors import check_number

# -- sources ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class DirectorySource(SourceSpec):
    """Files of a directory as ``(path, bytes)`` records, in name order.

    Under the runtime the files are handed out on request by the step's
    :class:`~rayflow.core.connectors.SplitEnumerator` (as Flink's FileSource does): in
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
        check_number("DirectorySource", "poll_interval_s", self.poll_interval_s)
        check_number("DirectorySource", "settle_s", self.settle_s, above=None, at_least=0.0)
        check_number("DirectorySource", "max_batch_bytes", self.max_batch_bytes)
        check_number("DirectorySource", "max_file_bytes", self.max_file_bytes, or_none=True)

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
    :func:`~rayflow.core.connectors.guided_chunk`). The first scan happens at the first
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

    def __post_init__(self):
        if isinstance(self.count, bool) or not isinstance(self.count, numbers.Integral) \
                or self.count < 0:
            raise ValueError(f"SyntheticImageSource: count must be an int >= 0, got "
                             f"{self.count!r}")
        sides = self.size if isinstance(self.size, tuple) else (self.size,)
        if not 1 <= len(sides) <= 2 or not all(
                isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1
                for s in sides):
            raise ValueError(f"SyntheticImageSource: size must be an int >= 1 or a "
                             f"(height, width) of them, got {self.size!r}")
        if self.channels not in (1, 3, 4):
            raise ValueError(f"SyntheticImageSource: channels must be 1, 3 or 4, got "
                             f"{self.channels!r}")
        check_number("SyntheticImageSource", "max_batch_bytes", self.max_batch_bytes)

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


# -- sinks -----------------------------------------------------------------------------------

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

    def __post_init__(self) -> None:
        check_image_ext("PngDiscardSink", self.ext)

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        return _DiscardEncodedWriter(ctx, self.ext, self.params, self.threads, resume_state)


class _DiscardEncodedWriter(_EncodingWriter):
    def deliver(self, key, data):
        pass


@dataclass(frozen=True)
class DirectorySink(SinkSpec):
    """Encode each ``(key, image)`` and write it under ``path``, keeping the key's relative
    path, with its extension replaced by ``ext``: key ``/in/a/shot.jpg`` with
    ``relative_to="/in"`` is written to ``path/a/shot.png``.

    Without ``relative_to``, a relative key (``a/shot.jpg``) keeps its folders and an absolute
    one keeps its file name only. An image without a key (a bare array) is named by the sink
    instance and its number there, ``image-<instance>-<n>``: after a recovery the count
    goes on from the checkpoint, so a replayed image gets its name again. Never an
    overwrite: an output name already written with other bytes (``photo.png`` and
    ``photo.jpg`` both become ``photo.png``; or a file left by an earlier run) makes the
    second image a dead letter naming both; the same bytes again (a record replayed after
    a restore) are not. A key that leaves ``path`` (``..``), or
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

    def __post_init__(self) -> None:
        check_image_ext("DirectorySink", self.ext)

    def build(self, ctx: StepContext, resume_state: Any = None) -> SinkWriter:
        Path(self.path).mkdir(parents=True, exist_ok=True)
        return _DirectoryWriter(ctx, self, resume_state)

    def output_name(self, key: Any, n: int = 0, instance: int = 0) -> Path:
        """The path (relative to ``path``) that the image keyed ``key`` is written to;
        ``ValueError`` if the key has no place under ``path``. A key that is not a string
        names no file: the image is the ``n``-th of sink instance ``instance``
        (``image-<instance>-<n>``)."""
        if not isinstance(key, str) or not key:
            return Path(f"image-{instance}-{n:08d}{self.ext}")
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
    def __init__(self, ctx: StepContext, spec: DirectorySink, resume_state: Any = None):
        super().__init__(ctx, spec.ext, spec.params, spec.threads, resume_state)
        self.spec, self.dir = spec, Path(spec.path)
        self.written: dict[Path, Any] = {}  # output name -> the key written there

    def deliver(self, key, data):
        rel = self.spec.output_name(key, self.images, self.ctx.instance)
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
