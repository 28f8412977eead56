"""Image sources, sinks and decoding: bad input becomes dead letters with where and why."""

from __future__ import annotations

import io
import math
import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

import rayflow as rf
from rayflow.connectors.images import (
    BadInput,
    DecodeImage,
    DirectorySink,
    DirectorySource,
    KafkaImageSink,
    KafkaImageSource,
    PngDiscardSink,
    SyntheticImageSource,
    chunk_image,
    decode_image,
    encode_image,
    may_hold_frames,
    png_size,
    synthetic_image,
    write_image_set,
)
from rayflow.connectors.images.kafka import _KafkaImageReader, _split_resume_state
from rayflow.connectors.kafka import KafkaMessage
from rayflow.core.connectors import LocalSplits, guided_chunk
from rayflow.core.operators import Rescaled, StepContext

CTX = StepContext("s", 0, 1)


def _png(h=20, w=30, channels=3, i=0) -> bytes:
    return encode_image(synthetic_image(i, h, w, channels))


def _decode_all(records, **kw):
    logic = DecodeImage(**kw).build(CTX)
    logic.open()
    return logic.process(records, np.arange(len(records), dtype=float))


def test_decode_routes_every_kind_of_bad_input():
    good = _png()
    corrupt = bytearray(good)
    corrupt[60:80] = b"\x00" * 20  # damage IDAT: CRC fails
    jpeg = encode_image(synthetic_image(1, 40, 40), ".jpg")
    records = [
        ("ok.png", good),
        ("empty.png", b""),
        ("trunc.png", good[: len(good) // 2]),
        ("corrupt.png", bytes(corrupt)),
        ("text.txt", b"hello, I am not an image\n"),
        ("gray.png", _png(channels=1)),
        ("big.png", _png(60, 60)),
        ("trunc.jpg", jpeg[:-200]),
        ("unreadable.png", BadInput("unreadable file: Permission denied")),
        ("ok.jpg", jpeg),
    ]
    out = _decode_all(records, channels=3, max_pixels=50 * 50)
    assert [k for k, _ in out.items] == ["ok.png", "ok.jpg"]
    assert np.array_equal(out.items[0][1], cv2.imdecode(np.frombuffer(good, np.uint8), -1))
    assert out.event_times.tolist() == [0.0, 9.0]
    why = {d.where: d.reason for d in out.dead}
    assert why["empty.png"] == "empty file"
    assert "truncated PNG" in why["trunc.png"]
    assert "could not decode" in why["corrupt.png"]
    assert "could not decode" in why["text.txt"]
    assert why["gray.png"] == "wrong channel count: 1, expected 3"
    assert why["big.png"].startswith("oversize image: 60x60")
    assert "truncated JPEG" in why["trunc.jpg"]
    assert why["unreadable.png"].startswith("unreadable file")
    assert len(out.dead) == 8


def test_png_header_is_read_without_decoding():
    assert png_size(_png(17, 23)) == (17, 23)
    assert png_size(b"GIF89a") is None
    with pytest.raises(ValueError, match="oversize"):
        decode_image(_png(100, 100), max_pixels=99 * 100)


def test_directory_source_splits_files_bounds_batches_and_flags_oversize(tmp_path):
    paths = write_image_set(tmp_path, 10, 32)
    (tmp_path / "huge.png").write_bytes(b"\x89PNG" + b"x" * 5000)
    (tmp_path / "notes.txt").write_text("skip me")
    seen = []
    for k in range(2):
        reader = DirectorySource(str(tmp_path), "*.png", max_batch_bytes=3000,
                                 max_file_bytes=4000).build(StepContext("r", k, 2))
        while not reader.exhausted:
            items, times = reader.poll(100, 0.0)
            assert times is None
            assert sum(len(d) for _, d in items if isinstance(d, bytes)) < 3000 + 4000
            seen.extend(items)
    names = sorted(os.path.basename(p) for p, _ in seen)
    assert names == sorted([p.name for p in paths] + ["huge.png"])
    bad = [d for p, d in seen if p.endswith("huge.png")][0]
    assert isinstance(bad, BadInput) and "oversize file: 5004 bytes" in bad.reason
    for p, d in seen:
        if not p.endswith("huge.png"):
            assert d == open(p, "rb").read()


def test_directory_source_watches_for_settled_new_files(tmp_path):
    write_image_set(tmp_path, 2, 16)
    reader = DirectorySource(str(tmp_path), "*.png", watch=True, poll_interval_s=0.05,
                             settle_s=0.1).build(CTX)
    first = reader.poll(10, 0.01)[0]
    assert len(first) == 2 and not reader.exhausted
    (tmp_path / "new.png").write_bytes(_png())
    got, deadline = [], time.time() + 5
    while not got and time.time() < deadline:
        polled = reader.poll(10, 0.05)
        got = polled[0] if polled else []
    assert [os.path.basename(p) for p, _ in got] == ["new.png"]
    assert reader.poll(10, 0.01) is None  # read once
    assert len(reader.snapshot()) == 3


def test_guided_chunks_cover_every_split_in_few_requests_ending_with_one():
    for n, p in [(1000, 2), (7, 3), (1, 1), (100_000, 4)]:
        sizes, left = [], n
        while left:
            sizes.append(guided_chunk(left, p))
            left -= sizes[-1]
        assert sum(sizes) == n and sizes[-1] == 1 and max(sizes) <= 1024
        assert sizes == sorted(sizes, reverse=True)
        assert len(sizes) <= 2 * p * (math.log(max(n / (2 * p), 1)) + 1) + n // 1024 + 1
    assert guided_chunk(1000, 2) == 250
    assert DirectorySource("/tmp").enumerator(1, []) is None  # one reader: nothing to balance


def _shared_readers(tmp_path, n, restored=(), resume=(None, None), **kw):
    spec = DirectorySource(str(tmp_path), "*.png", **kw)
    enum = spec.enumerator(2, list(restored))
    return [spec.build(StepContext("r", k, 2, splits=LocalSplits(enum, k)), resume[k])
            for k in range(2)]


def test_directory_source_hands_files_to_the_reader_that_asks(tmp_path):
    paths = write_image_set(tmp_path, 200, 8)
    fast, slow = _shared_readers(tmp_path, 200, max_batch_bytes=1)  # one file per batch
    got = {0: [], 1: []}
    while not (fast.exhausted and slow.exhausted):
        for _ in range(3):  # the fast reader polls three times for each poll of the slow one
            polled = fast.poll(10, 0.0)
            got[0] += [p for p, _ in polled[0]] if polled else []
        polled = slow.poll(10, 0.0)
        got[1] += [p for p, _ in polled[0]] if polled else []
    assert sorted(got[0] + got[1]) == sorted(str(p) for p in paths)  # each file once
    assert 140 <= len(got[0]) <= 160 and 40 <= len(got[1]) <= 60  # 3 : 1, by demand
    assert fast.poll(10, 0.0) is None and slow.poll(10, 0.0) is None
    assert set(fast.snapshot()) | set(slow.snapshot()) == {str(p) for p in paths}


def _drain(reader):
    out = []
    while not reader.exhausted:
        polled = reader.poll(100, 0.0)
        out += [p for p, _ in polled[0]] if polled else []
    return out


def test_directory_source_restores_from_what_every_reader_finished(tmp_path):
    paths = [str(p) for p in write_image_set(tmp_path, 10, 8)]
    done = [paths[:3], paths[5:6]]  # two readers' snapshots
    readers = _shared_readers(tmp_path, 10, restored=done, resume=done)
    read = [p for r in readers for p in _drain(r)]
    assert sorted(read) == paths[3:5] + paths[6:]
    # rescaled: every old snapshot reaches every new instance; instance 0 carries them on
    resc = Rescaled(tuple(done), 2)
    a, b = _shared_readers(tmp_path, 10, restored=[*done], resume=(resc, resc))
    assert set(a.snapshot()) == set(paths[:3] + paths[5:6]) and b.snapshot() == []
    # a reader on its own (no enumerator) reads its static share, minus what was finished
    alone = DirectorySource(str(tmp_path), "*.png").build(StepContext("r", 1, 2), resc)
    assert _drain(alone) == [paths[3], paths[7], paths[9]]  # odd positions, 1 and 5 done


def test_watched_directory_hands_out_new_files_once(tmp_path):
    write_image_set(tmp_path, 4, 8)
    a, b = _shared_readers(tmp_path, 4, watch=True, poll_interval_s=0.05, settle_s=0.1)
    first = [p for r in (a, b) for p, _ in (r.poll(10, 0.0) or ([], None))[0]]
    first += [p for r in (a, b) for p, _ in (r.poll(10, 0.0) or ([], None))[0]]
    assert len(first) == 4 and not a.exhausted and not b.exhausted
    (tmp_path / "new.png").write_bytes(_png())
    got, deadline = [], time.time() + 5
    while len(got) < 1 and time.time() < deadline:
        for r in (a, b):
            polled = r.poll(10, 0.05)
            got += [p for p, _ in polled[0]] if polled else []
    time.sleep(0.2)
    for r in (a, b):
        polled = r.poll(10, 0.1)
        got += [p for p, _ in polled[0]] if polled else []
    assert [os.path.basename(p) for p in got] == ["new.png"]


def test_synthetic_source_is_deterministic_and_byte_bounded():
    spec = SyntheticImageSource(5, size=(40, 50), channels=3, max_batch_bytes=40 * 50 * 3 * 2)
    items, _ = spec.build(CTX).poll(100, 0)
    assert len(items) == 2 and items[0][1].shape == (40, 50, 3)
    assert np.array_equal(items[1][1], synthetic_image(1, 40, 50, 3))
    enc = SyntheticImageSource(1, size=8, encode=".png").build(CTX).poll(10, 0)[0]
    assert enc[0][1][:4] == b"\x89PNG"


def test_sinks_encode_write_and_dead_letter_what_cannot_be_encoded(tmp_path):
    imgs = [(f"/in/img{i}.png", synthetic_image(i, 12, 9)) for i in range(3)]
    bad = ("/in/bad.png", np.zeros((4, 4, 2), np.float64))
    discard = PngDiscardSink().build(CTX)
    dead = discard.write(imgs + [bad], None, 0.0)
    assert [d.where for d in dead] == ["/in/bad.png"]
    assert discard.result()[0]["images"] == 3 and discard.result()[0]["bytes"] > 0
    out = DirectorySink(str(tmp_path / "out")).build(CTX)
    assert not out.write(imgs, None, 0.0)
    for key, img in imgs:
        written = cv2.imread(str(tmp_path / "out" / os.path.basename(key)), -1)
        assert np.array_equal(written, img)
    assert not list((tmp_path / "out").glob(".*tmp"))


def test_directory_sink_keeps_relative_paths_and_never_overwrites(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    imgs = {src / "a" / "shot.png": synthetic_image(0, 12, 9),
            src / "b" / "shot.png": synthetic_image(1, 12, 9),
            src / "photo.jpg": synthetic_image(2, 12, 9),
            src / "photo.png": synthetic_image(3, 12, 9)}
    records = [(str(k), v) for k, v in imgs.items()]
    writer = DirectorySink(str(out), relative_to=str(src)).build(CTX)
    dead = writer.write(records, None, 0.0)
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == ["a/shot.png", "b/shot.png", "photo.png"]
    for rel, key in [("a/shot.png", src / "a" / "shot.png"), ("b/shot.png", src / "b" / "shot.png"),
                     ("photo.png", src / "photo.jpg")]:
        assert np.array_equal(cv2.imread(str(out / rel), cv2.IMREAD_UNCHANGED), imgs[key])
    (d,) = dead  # photo.png would have replaced what photo.jpg became
    assert d.where == str(src / "photo.png") and d.step_id == "s"
    assert d.reason == (f"FileExistsError: 'photo.png' was already written by "
                        f"{str(src / 'photo.jpg')!r}; {str(src / 'photo.png')!r} is not "
                        f"written over it")
    assert writer.result()[0]["images"] == 3
    # the same record again (replayed after a restore) is no collision; other content from
    # a fresh writer (an earlier run's file) is
    assert writer.write(records[:1], None, 0.0) == []
    again = DirectorySink(str(out), relative_to=str(src)).build(CTX)
    (d,) = again.write([(str(src / "a" / "shot.png"), synthetic_image(9, 12, 9))], None, 0.0)
    assert "'a/shot.png' exists with other content" in d.reason
    assert np.array_equal(cv2.imread(str(out / "a/shot.png"), -1), imgs[src / "a" / "shot.png"])
    # keys with no place under the output directory
    bad = DirectorySink(str(out), relative_to=str(src)).build(CTX).write(
        [("/elsewhere/x.png", imgs[src / "photo.png"]), ("../up.png", imgs[src / "photo.png"])],
        None, 0.0)
    assert [d.reason for d in bad] == [
        "ValueError: key '/elsewhere/x.png' is not under relative_to=" + repr(str(src)),
        "ValueError: key '../up.png' names no file inside the output directory"]
    assert not list(out.rglob(".*tmp"))
    # without relative_to: relative keys keep their folders, absolute ones their name
    sink = DirectorySink(str(out), ext=".tif")
    assert sink.output_name("a/b/c.jpg") == Path("a/b/c.tif")
    assert sink.output_name("/data/in/a/c.jpg") == Path("c.tif")
    assert sink.output_name("imgs/0@17") == Path("imgs/0@17.tif")


def test_images_without_keys_get_names_of_their_instance_and_keep_them_after_a_restore(
        tmp_path):
    """An image with no key is named by its sink instance and its number there, so two
    instances writing to one directory never collide; a recovery of the same run counts on
    from the snapshot, so a replayed image gets the name (and bytes) it had, and another
    run's snapshot (a new job) counts afresh."""
    imgs = [synthetic_image(i, 12, 9) for i in range(6)]
    out = tmp_path / "out"
    writers = [DirectorySink(str(out)).build(StepContext("s", i, 2, run_id="r1"))
               for i in range(2)]
    assert writers[0].write(imgs[:3], None, 0.0) == []
    snap = writers[1].snapshot(1)  # before any image of instance 1
    assert writers[1].write(imgs[3:5], None, 0.0) == []
    assert sorted(p.name for p in out.iterdir()) == [
        "image-0-00000000.png", "image-0-00000001.png", "image-0-00000002.png",
        "image-1-00000000.png", "image-1-00000001.png"]
    for name, img in [("image-0-00000002.png", imgs[2]), ("image-1-00000001.png", imgs[4])]:
        assert np.array_equal(cv2.imread(str(out / name), -1), img)
    mid = writers[0].snapshot(2)
    assert writers[0].write(imgs[5:], None, 0.0) == []  # image-0-00000003, then a failure
    restored = DirectorySink(str(out)).build(StepContext("s", 0, 2, run_id="r1"), mid)
    assert restored.write(imgs[5:], None, 0.0) == []  # the replay: same name, same bytes
    assert restored.result()[0]["images"] == 4
    assert len(list(out.iterdir())) == 6
    # a new job (another run) resumed from that snapshot counts afresh
    fresh = DirectorySink(str(out)).build(StepContext("s", 1, 2, run_id="r2"), snap)
    assert fresh.result()[0]["images"] == 0
    assert DirectorySink(str(out)).build(
        StepContext("s", 1, 2, run_id="r1"), snap).result()[0]["images"] == 0


def test_npy_tile_sink_counts_on_after_a_recovery_of_its_run(tmp_path):
    """The tile sink's count is its checkpointed state: a recovery of the same run places
    the replayed tiles again and counts each once; another run counts afresh."""
    from rayflow.connectors.images import NpyTileSink, NpyTileSource
    from rayflow.operators.image import Halo

    src, dst = tmp_path / "in.npy", tmp_path / "out.npy"
    img = np.arange(64 * 48, dtype=np.uint16).reshape(64, 48)
    np.save(src, img)
    np.lib.format.open_memmap(dst, "w+", img.dtype, img.shape)
    reader, tiles = NpyTileSource(str(src), 16, Halo(0, 0, 0, 0)).build(CTX), []
    while not reader.exhausted:
        tiles += reader.poll(100, 0)[0]
    ctx = StepContext("s", 0, 1, run_id="r1")
    first = NpyTileSink(str(dst)).build(ctx)
    first.write(tiles[:5], None, 0.0)
    snap = first.snapshot(1)
    first.write(tiles[5:8], None, 0.0)  # then a failure
    again = NpyTileSink(str(dst)).build(ctx, snap)
    again.write(tiles[5:], None, 0.0)
    assert again.result()[0]["tiles"] == len(tiles) == 12
    assert np.array_equal(np.load(dst), img)
    fresh = NpyTileSink(str(dst)).build(StepContext("s", 0, 1, run_id="r2"), snap)
    assert fresh.result()[0]["tiles"] == 0


def _exif_jpeg(img_rgb: np.ndarray, orientation: int) -> bytes:
    from PIL import Image

    pil = Image.fromarray(img_rgb)
    exif = pil.getexif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    pil.save(buf, "JPEG", exif=exif.tobytes(), quality=95)
    return buf.getvalue()


def test_decode_applies_exif_orientation_like_imread_and_keeps_depth_and_alpha(tmp_path):
    img = synthetic_image(4, 30, 50)
    img[:8, :12] = 255  # a mark in the stored top-left corner
    path = tmp_path / "phone.jpg"
    path.write_bytes(_exif_jpeg(img[:, :, ::-1].copy(), 6))  # 6: turn 90 degrees clockwise
    data = path.read_bytes()
    upright = cv2.imread(str(path))  # cv2.imread's default applies the orientation
    stored = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert upright.shape == (50, 30, 3) and stored.shape == (30, 50, 3)
    assert np.array_equal(upright, cv2.rotate(stored, cv2.ROTATE_90_CLOCKWISE))
    out = _decode_all([("phone.jpg", data)])
    assert np.array_equal(out.items[0][1], upright)
    assert np.array_equal(_decode_all([("p", data)], mode="color").items[0][1], upright)
    assert np.array_equal(_decode_all([("p", data)], mode="gray").items[0][1],
                          cv2.imread(str(path), cv2.IMREAD_GRAYSCALE))
    assert np.array_equal(_decode_all([("p", data)], orientation=False).items[0][1], stored)
    # "unchanged" still keeps alpha and 16 bits (what IMREAD_UNCHANGED would)
    rgba = np.dstack([synthetic_image(5, 9, 7), np.full((9, 7), 77, np.uint8)])
    deep = (synthetic_image(6, 9, 7, 1).astype(np.uint16) * 257)
    for im in (rgba, deep):
        (got,) = _decode_all([("k", encode_image(im))]).items
        assert got[1].dtype == im.dtype and np.array_equal(got[1], im)
    with pytest.raises(ValueError, match="unknown mode 'rgb'"):
        DecodeImage(mode="rgb")
    with pytest.raises(ValueError, match="unknown frames 'last'"):
        DecodeImage(frames="last")


def _pages(fmt: str, n: int = 3) -> tuple[bytes, list[np.ndarray]]:
    from PIL import Image

    rgb = [synthetic_image(i, 8, 10)[:, :, ::-1].copy() for i in range(n)]
    buf = io.BytesIO()
    extra = {"lossless": True} if fmt == "WEBP" else {}
    Image.fromarray(rgb[0]).save(buf, fmt, save_all=True,
                                 append_images=[Image.fromarray(p) for p in rgb[1:]], **extra)
    return buf.getvalue(), rgb


@pytest.mark.parametrize("fmt", ["TIFF", "GIF", "PNG", "WEBP"])
def test_multi_frame_inputs_are_counted_or_split_or_dead_lettered(fmt, tmp_path, caplog):
    data, _ = _pages(fmt)
    path = tmp_path / f"scan.{fmt.lower()}"
    path.write_bytes(data)
    ok, want = cv2.imreadmulti(str(path), flags=cv2.IMREAD_UNCHANGED)
    assert ok and len(want) == 3 and may_hold_frames(data)
    logic = DecodeImage().build(CTX)
    logic.open()
    with caplog.at_level("WARNING", logger="rayflow.images"):
        out = logic.process([("scan", data), ("plain", _png())], None)
    assert [k for k, _ in out.items] == ["scan", "plain"]
    assert np.array_equal(out.items[0][1], cv2.imread(str(path), cv2.IMREAD_UNCHANGED))
    assert logic.multi_frame_inputs == 1 and "holds 3 frames" in caplog.text
    out = _decode_all([("d/scan.tif", data)], frames="all")
    assert [k for k, _ in out.items] == [f"d/scan-frame{i}.tif" for i in range(3)]
    assert all(np.array_equal(g, w) for (_, g), w in zip(out.items, want))
    assert out.event_times.tolist() == [0.0, 0.0, 0.0]
    out = _decode_all([("scan", data), ("plain", _png())], frames="dead_letter")
    assert [k for k, _ in out.items] == ["plain"] and out.event_times.tolist() == [1.0]
    assert out.dead[0].reason.startswith("3 frames in one file")
    # one frame of the same formats is no multi-frame input
    single, _ = _pages(fmt, 1)
    assert len(_decode_all([("one", single)], frames="dead_letter").items) == 1
    assert not may_hold_frames(_png()) and not may_hold_frames(encode_image(
        synthetic_image(0, 8, 8), ".jpg"))


def test_images_deeper_than_their_format_are_dead_letters_not_8_bit_files(tmp_path):
    deep = [("a.png", synthetic_image(0, 6, 5).astype(np.uint16) * 257),
            ("f.png", synthetic_image(1, 6, 5).astype(np.float32) / 255)]
    for ext, ok in [(".jpg", []), (".png", ["a.png"]), (".tif", ["a.png", "f.png"])]:
        sink = DirectorySink(str(tmp_path / ext[1:]), ext=ext).build(CTX)
        dead = sink.write(deep, None, 0.0)
        assert sorted(d.where for d in dead) == sorted({"a.png", "f.png"} - set(ok)), ext
        for d in dead:
            assert f"{ext} cannot hold" in d.reason and "pixels" in d.reason
        for key in ok:
            back = cv2.imread(str(tmp_path / ext[1:] / Path(key).with_suffix(ext)), -1)
            assert back.dtype == dict(deep)[key].dtype and np.array_equal(back, dict(deep)[key])
    with pytest.raises(ValueError, match=r"\.jpg cannot hold uint16 pixels \(OpenCV would "
                                         r"write them as uint8\)"):
        encode_image(deep[0][1], ".jpg")


class _FakeTopic:
    """Stands in for KafkaSource(with_metadata=True)'s reader over fixed partitions: each
    poll returns the next ``per_poll`` messages of one partition, round robin."""

    def __init__(self, partitions: dict[int, list[bytes]], start=None, per_poll: int = 1):
        self.msgs, self.per_poll = partitions, per_poll
        if isinstance(start, Rescaled):  # as KafkaSource's reader: every old instance's
            start = {p: o for h in start.handles for p, o in h.items()}
        self.next = {p: int((start or {}).get(p, 0)) for p in partitions}
        self.turn = 0

    def poll(self, max_records, timeout_s):
        live = [p for p in sorted(self.msgs) if self.next[p] < len(self.msgs[p])]
        if not live:
            return None
        p = live[self.turn % len(live)]
        self.turn += 1
        lo = self.next[p]
        hi = min(lo + self.per_poll, len(self.msgs[p]))
        self.next[p] = hi
        return ([KafkaMessage(p, o, self.msgs[p][o]) for o in range(lo, hi)],
                np.full(hi - lo, 1000.0))

    @property
    def exhausted(self):
        return all(self.next[p] >= len(m) for p, m in self.msgs.items())

    def snapshot(self):
        return dict(self.next)


def _image_reader(partitions, state=None, per_poll=1, **kw):
    offsets, skip = _split_resume_state(state)
    return _KafkaImageReader(KafkaImageSource("imgs", **kw),
                             _FakeTopic(partitions, offsets, per_poll), skip)


def _read(reader, polls=None):
    got = []
    while not reader.exhausted and (polls is None or polls > 0):
        polled = reader.poll(100, 0)
        if polled:
            got.extend(polled[0])
        polls = None if polls is None else polls - 1
    return got


def test_chunked_images_are_reassembled_keyed_by_name_and_incomplete_ones_reported():
    a, b = os.urandom(2500), os.urandom(2200)
    ca, cb = chunk_image(a, "dir/a.png", 1000), chunk_image(b, "b.png", 1000)
    assert len(ca) == 3 and all(len(m) <= 1000 for m in ca + cb)
    raw = b"\x89PNG plain message"
    # b's third chunk never comes
    got = _read(_image_reader({0: [ca[0], cb[0], ca[1], ca[2], cb[1], raw]}, per_poll=3))
    assert got[0] == ("dir/a.png", a)  # the key the sink was given, not the offset
    assert got[1] == ("imgs/0@5", raw)  # a message without a header: its position
    assert got[2][0] == "b.png" and isinstance(got[2][1], BadInput)
    assert got[2][1].reason == ("incomplete chunked image 'b.png' (first chunk at imgs/0@1): "
                                "2 of 3 chunks at end of topic")
    assert len(got) == 3
    with pytest.raises(ValueError, match="image key of 1025 bytes"):
        chunk_image(a, "k" * 1025, 1000)


def test_a_checkpoint_inside_an_image_rewinds_to_its_first_chunk_and_skips_the_rest():
    # two partitions; images interleaved with each other and with whole messages, so every
    # cut leaves images partly read, some of whose later neighbours were delivered already
    rng = np.random.default_rng(5)
    blobs = {f"img{i}.png": rng.bytes(int(rng.integers(1500, 4000))) for i in range(6)}
    chunks = {k: chunk_image(v, k, 700) for k, v in blobs.items()}

    def interleave(keys, extra):
        out, queues = [], [list(chunks[k]) for k in keys]
        while any(queues):
            for q in queues:
                if q:
                    out.append(q.pop(0))
            if extra:
                out.append(extra.pop(0))
        return out

    parts = {0: interleave(["img0.png", "img1.png", "img2.png"], [b"whole-0", b"whole-1"]),
             1: interleave(["img3.png", "img4.png"], [b"whole-2"]) + chunks["img5.png"]}
    want = sorted(_read(_image_reader(parts)))
    assert [k for k, _ in want if k.endswith(".png")] == sorted(blobs)
    assert all(v == blobs[k] for k, v in want if k in blobs)
    total = sum(len(m) for m in parts.values())
    for cut in range(1, total):
        first = _image_reader(parts)
        got = _read(first, polls=cut)
        state = first.snapshot()
        assert set(state) == {"offsets", "skip"}
        second = _image_reader(parts, state)
        got += _read(second, polls=cut // 2)  # a second checkpoint, from the restored one
        got += _read(_image_reader(parts, second.snapshot()))
        assert sorted(got) == want, cut


def test_restored_image_reader_takes_the_skips_of_its_partitions_after_a_rescale():
    a = os.urandom(2500)
    ca = chunk_image(a, "a.png", 1000)
    assert len(ca) == 3
    parts = {0: [ca[0], b"w0", ca[1], b"w1", ca[2]], 1: [b"w2", b"w3"]}
    r0 = _image_reader({0: parts[0]})
    got = _read(r0, polls=4)  # a0, w0, a1, w1
    state0 = r0.snapshot()
    assert state0 == {"offsets": {0: 0}, "skip": {0: [(1, 2), (3, 4)]}}
    resc = Rescaled((state0, {"offsets": {1: 1}, "skip": {}}), 2)
    r = _image_reader(parts, resc)
    got += _read(r)
    assert sorted(got) == sorted([("imgs/0@1", b"w0"), ("imgs/0@3", b"w1"), ("a.png", a),
                                  ("imgs/1@1", b"w3")])


@pytest.mark.slow
def test_kafka_round_trip_of_images_over_one_megabyte(ray_session, kafka_broker, new_topic):
    bs, topic = kafka_broker.bootstrap, new_topic(2)
    rng = np.random.default_rng(3)
    images = [(f"big{i}", rng.integers(0, 256, (700, 700, 3), dtype=np.uint8)) for i in range(3)]
    images.append(("small", synthetic_image(0, 50, 50)))
    assert len(encode_image(images[0][1])) > 1_000_000  # noise does not compress
    w = rf.Dataflow("img-kafka-out")
    (w.source("in", rf.MemorySource(images))
      .sink("out", KafkaImageSink(topic, bootstrap=bs), on_error="dead_letter"))
    job = w.run(timeout_s=120)
    assert job.metrics()["out"]["dead_letters"] == 0
    r = rf.Dataflow("img-kafka-in")
    (r.source("in", KafkaImageSource(topic, bootstrap=bs, bounded=True), parallelism=2)
      .apply("decode", DecodeImage(channels=3), on_error="dead_letter")
      .sink("out", rf.CollectSink()))
    job = r.run(timeout_s=120)
    got = job.collect("out")
    assert len(got) == 4 and not job.dead_letters()
    want = sorted(img.tobytes() for _, img in images)
    assert sorted(img.tobytes() for _, img in got) == want
    assert sorted(k for k, _ in got) == sorted(k for k, _ in images)  # names carried through

    # without chunking a large image is a dead letter that names the limit
    n = rf.Dataflow("img-kafka-nochunk")
    (n.source("in", rf.MemorySource(images))
      .sink("out", KafkaImageSink(topic, bootstrap=bs, chunking=False), on_error="dead_letter"))
    job = n.run(timeout_s=120)
    dead = job.dead_letters()
    assert job.metrics()["out"]["dead_letters"] == 3 == len(dead)
    assert all("exceeds the Kafka message limit" in d.reason for d in dead)
    assert {d.where for d in dead} == {"big0", "big1", "big2"}


@pytest.mark.parametrize("make, message", [
    (lambda: SyntheticImageSource(-1), "SyntheticImageSource: count must be an int >= 0"),
    (lambda: SyntheticImageSource(2, size=(0, 5)), "SyntheticImageSource: size must be"),
    (lambda: SyntheticImageSource(2, size=(4, 5, 6)), "SyntheticImageSource: size must be"),
    (lambda: SyntheticImageSource(2, channels=2), "SyntheticImageSource: channels must be "
                                                  "1, 3 or 4, got 2"),
    (lambda: SyntheticImageSource(2, max_batch_bytes=0), "SyntheticImageSource: "
                                                         "max_batch_bytes must be"),
    (lambda: __import__("rayflow.connectors.images", fromlist=["x"]).KafkaImageSink(
        "t", bootstrap="b", chunk_bytes=0), "KafkaImageSink: chunk_bytes must be a number > 0"),
    (lambda: __import__("rayflow.connectors.images", fromlist=["x"]).KafkaImageSink(
        "t", bootstrap="b", client="confluentt"), "KafkaImageSink: client='confluentt'"),
    (lambda: __import__("rayflow.connectors.images", fromlist=["x"]).KafkaImageSink(
        "t", bootstrap="b", ext=".jpgg"), "KafkaImageSink: ext '.jpgg' is not an image format"),
    (lambda: DirectorySink("/tmp/never-made", ext="png"), "DirectorySink: ext 'png' is not"),
    (lambda: DirectorySink("/tmp/never-made", ext=".pngg"), "DirectorySink: ext '.pngg'"),
    (lambda: __import__("rayflow.connectors.images", fromlist=["x"]).PngDiscardSink(
        ext=".xyz"), "PngDiscardSink: ext '.xyz' is not an image format OpenCV writes"),
    (lambda: DirectorySource("/tmp", poll_interval_s=0), "DirectorySource: poll_interval_s "
                                                         "must be a number > 0"),
    (lambda: DirectorySource("/tmp", settle_s=-1), "DirectorySource: settle_s must be a "
                                                   "number >= 0"),
    (lambda: DirectorySource("/tmp", max_file_bytes=0), "DirectorySource: max_file_bytes"),
])
def test_an_image_source_or_sink_that_cannot_work_is_an_error_where_it_is_made(make, message):
    """Including an extension OpenCV cannot write (every image would be a dead letter)."""
    with pytest.raises(ValueError, match=message):
        make()
