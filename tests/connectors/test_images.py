"""Image sources, sinks and decoding: bad input becomes dead letters with where and why."""

from __future__ import annotations

import math
import os
import time

import cv2
import numpy as np
import pytest

import rayflow as rf
from rayflow.connectors.base import LocalSplits, guided_chunk
from rayflow.connectors.images import (
    BadInput,
    DecodeImage,
    DirectorySink,
    DirectorySource,
    KafkaImageSink,
    KafkaImageSource,
    PngDiscardSink,
    SyntheticImageSource,
    _KafkaImageReader,
    chunk_image,
    decode_image,
    encode_image,
    png_size,
    synthetic_image,
    write_image_set,
)
from rayflow.connectors.kafka import KafkaMessage
from rayflow.operators.base import Rescaled, StepContext

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


class _FakeKafka:
    """Stands in for KafkaSource(with_metadata=True)'s reader: yields messages in given polls."""

    def __init__(self, polls):
        self.polls = list(polls)

    def poll(self, max_records, timeout_s):
        if not self.polls:
            return None
        msgs = self.polls.pop(0)
        return [KafkaMessage(0, off, v) for off, v in msgs], np.full(len(msgs), 1000.0)

    @property
    def exhausted(self):
        return not self.polls


def test_chunked_images_are_reassembled_and_incomplete_ones_reported():
    a, b = os.urandom(2500), os.urandom(2200)
    ca, cb = chunk_image(a, "a.png", 1000), chunk_image(b, "b.png", 1000)
    assert len(ca) == 3 and all(len(m) <= 1000 for m in ca + cb)
    interleaved = [ca[0], cb[0], ca[1], ca[2], cb[1]]  # b's third chunk never comes
    raw = b"\x89PNG plain message"
    msgs = [(i, m) for i, m in enumerate(interleaved + [raw])]
    spec = KafkaImageSource("imgs")
    reader = _KafkaImageReader(spec, _FakeKafka([msgs[:3], msgs[3:]]))
    got = []
    while not reader.exhausted:
        polled = reader.poll(100, 0)
        if polled:
            got.extend(polled[0])
    assert got[0] == ("imgs/0@0", a)  # where = offset of the first chunk
    assert got[1] == ("imgs/0@5", raw)
    assert got[2][0] == "imgs/0@1" and isinstance(got[2][1], BadInput)
    assert "2 of 3 chunks" in got[2][1].reason
    assert len(got) == 3


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
    assert all(k.startswith(f"{topic}/") and "@" in k for k, _ in got)

    # without chunking a large image is a dead letter that names the limit
    n = rf.Dataflow("img-kafka-nochunk")
    (n.source("in", rf.MemorySource(images))
      .sink("out", KafkaImageSink(topic, bootstrap=bs, chunking=False), on_error="dead_letter"))
    job = n.run(timeout_s=120)
    dead = job.dead_letters()
    assert job.metrics()["out"]["dead_letters"] == 3 == len(dead)
    assert all("exceeds the Kafka message limit" in d.reason for d in dead)
    assert {d.where for d in dead} == {"big0", "big1", "big2"}
