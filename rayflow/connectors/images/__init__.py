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

The package by concern: :mod:`~rayflow.connectors.images.codecs` (checks, decoding, encoding,
:class:`DecodeImage`), :mod:`~rayflow.connectors.images.files` (directories and synthetic
images), :mod:`~rayflow.connectors.images.kafka` (chunked images through Kafka) and
:mod:`~rayflow.connectors.images.tiles` (images larger than memory as ``.npy`` tiles).
"""

from rayflow.connectors.images.codecs import (
    BadInput,
    DecodeImage,
    Encoded,
    MiB,
    check_encoded,
    decode_frames,
    decode_image,
    encode_image,
    frame_key,
    imread_flags,
    may_hold_frames,
    png_size,
)
from rayflow.connectors.images.files import (
    DirectorySink,
    DirectorySource,
    PngDiscardSink,
    SyntheticImageSource,
    synthetic_image,
    write_image_set,
)
from rayflow.connectors.images.kafka import (
    KafkaImageSink,
    KafkaImageSource,
    chunk_image,
    chunk_message_key,
)
from rayflow.connectors.images.tiles import (
    NpyTileSink,
    NpyTileSource,
)

__all__ = [
    "BadInput",
    "DecodeImage",
    "DirectorySink",
    "DirectorySource",
    "Encoded",
    "KafkaImageSink",
    "KafkaImageSource",
    "MiB",
    "NpyTileSink",
    "NpyTileSource",
    "PngDiscardSink",
    "SyntheticImageSource",
    "check_encoded",
    "chunk_image",
    "chunk_message_key",
    "decode_frames",
    "decode_image",
    "encode_image",
    "frame_key",
    "imread_flags",
    "may_hold_frames",
    "png_size",
    "synthetic_image",
    "write_image_set",
]
