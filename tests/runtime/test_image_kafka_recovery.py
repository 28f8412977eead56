"""Chunked images through Kafka survive a restore: an image whose chunks straddle the
restored checkpoint is read again from its first chunk, and each image is counted exactly
once (in restored keyed state) with its exact pixels."""

from __future__ import annotations

import hashlib
import time

import rayflow as rf
from rayflow.connectors.images import (
    DecodeImage,
    KafkaImageSource,
    chunk_image,
    encode_image,
    synthetic_image,
)
from rayflow.connectors.kafka import produce
from rayflow.operators.stateless import Map
from rayflow.operators.windows import Count, CountWindow
from rayflow.testing import CrashDuringCheckpoint

N = 16


def _slow(record):
    time.sleep(0.05)  # stretch the run over several checkpoints
    return record


def _digest(record):
    key, image = record
    return f"{key}:{hashlib.sha256(image.tobytes()).hexdigest()}"


def test_images_straddling_a_checkpoint_are_counted_once_after_a_crash(
        ray_session, kafka_broker, new_topic, tmp_path):
    bs, topic = kafka_broker.bootstrap, new_topic(1)
    images = {f"shots/{i:02d}.png": synthetic_image(i, 40, 60) for i in range(N)}
    chunks = [chunk_image(encode_image(img), key, 1500) for key, img in images.items()]
    assert min(len(c) for c in chunks) >= 4
    # four images at a time, their chunks interleaved: nearly every position of the topic
    # is inside some image, so the restored checkpoint is too
    messages = []
    for g in range(0, N, 4):
        group = [list(c) for c in chunks[g : g + 4]]
        while any(group):
            messages += [q.pop(0) for q in group if q]
    produce(bs, topic, messages)

    flow = rf.Dataflow("img-kafka-recovery")
    (flow.source("read", KafkaImageSource(topic, bootstrap=bs, bounded=True))
         .apply("slow", CrashDuringCheckpoint(Map(_slow), 2, str(tmp_path / "m")))
         .apply("decode", DecodeImage(channels=3), on_error="dead_letter")
         .map("digest", _digest)
         .key_by(lambda d: d)
         .window("count", CountWindow(10**9), Count())  # emitted at the end
         .map("fmt", lambda r: (r.key, r.value))
         .sink("out", rf.CollectSink()))
    job = flow.run(checkpoint={"interval_s": 0.2, "processing_guarantee": "exactly_once"},
                   stream={"batch_size": 1, "channel_calls": 2}, timeout_s=120)
    assert (tmp_path / "m").exists()
    assert len(job.recoveries) == 1 and job.recoveries[0]["restored_checkpoint"] is not None
    assert job.dead_letters() == []
    assert dict(job.collect("out")) == {_digest(kv): 1 for kv in images.items()}


def test_the_image_sink_writes_each_image_once_exactly_once_through_a_crash(
        ray_session, kafka_broker, new_topic, tmp_path):
    """Under exactly-once the image sink's messages go through the Kafka sink's
    transactions: committed with the checkpoints, each image once although the job failed
    during one, and read back whole by a bounded image source. Before, the sink never
    committed them: the topic stayed empty and the job reported every image delivered."""
    from rayflow.connectors.images import KafkaImageSink

    bs, topic = kafka_broker.bootstrap, new_topic(2)
    images = [(f"shot-{i:02d}", synthetic_image(i, 40, 60)) for i in range(N)]
    w = rf.Dataflow("img-kafka-eo")
    (w.source("in", rf.MemorySource(images), batch_size=1)
      .apply("slow", CrashDuringCheckpoint(Map(_slow), 2, str(tmp_path / "m")))
      .sink("out", KafkaImageSink(topic, bootstrap=bs, chunk_bytes=1500)))
    job = w.run(checkpoint={"interval_s": 0.2, "processing_guarantee": "exactly_once"},
                timeout_s=180)
    assert job.recoveries
    assert sum(r["images"] for r in job.collect("out")) == N
    r = rf.Dataflow("img-kafka-eo-read")
    (r.source("in", KafkaImageSource(topic, bootstrap=bs, bounded=True))
      .apply("decode", DecodeImage(channels=3))
      .map("digest", _digest)
      .sink("out", rf.CollectSink()))
    got = r.run(timeout_s=120).collect("out")
    assert sorted(got) == sorted(_digest((k, img)) for k, img in images)
