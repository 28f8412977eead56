"""W1, the image blur: read images from disk, Gaussian blur (5 × 5, sigma 3), encode PNG and
drop (or write). ``jobs/image_blur.py`` is its command line; the demo and the benchmark run it
from here.

The input is every file whose name matches ``pattern`` (globs) or, by default, has one of the
:data:`IMAGE_EXTENSIONS` (in lower or upper case). With ``output_dir``, each image is written as
PNG at its path relative to the input (``a/shot.jpg`` -> ``OUT/a/shot.png``); two inputs that
would share an output name (``photo.png`` and ``photo.jpg``) make the second a dead letter,
never an overwrite.

Bad files (empty, truncated, corrupt, not images, wrong channel count, oversize) go to the
dead-letter output with their path and the reason; the job counts them and goes on.
"""

from __future__ import annotations

import time
from typing import Any

import rayflow as rf
from rayflow.connectors.images import (
    DecodeImage,
    DirectorySink,
    DirectorySource,
    PngDiscardSink,
)
from rayflow.operators.image import Border, GaussianBlur

# Extensions read by default: the formats OpenCV decodes that photos and scans come in.
IMAGE_EXTENSIONS = ("png", "jpg", "jpeg", "tif", "tiff", "bmp", "webp")


def ext_patterns(extensions) -> tuple[str, ...]:
    """Globs for file extensions (``"jpg"`` or ``".jpg"``), in lower and upper case."""
    out = []
    for e in extensions:
        e = e.strip().lstrip(".")
        if not e or any(c in e for c in "*?[]/"):
            raise ValueError(f"not a file extension: {e!r}")
        for v in (e.lower(), e.upper()):
            if f"*.{v}" not in out:
                out.append(f"*.{v}")
    if not out:
        raise ValueError("no file extension given")
    return tuple(out)


IMAGE_PATTERNS = ext_patterns(IMAGE_EXTENSIONS)

# Channels hold at most 4 batches and 8 MiB each: the paper's fix for Storm was bounded
# queues of 2–4 images; byte bounds keep 1200 px images as cheap to hold as 50 px ones. A
# batch is at most 256 files and at most 1 MiB of files (see build_flow).
IMAGE_STREAM = {"batch_size": 256, "channel_calls": 4, "channel_bytes": 8 << 20}

# Settings for a local Ray, measured with benchmarks/bench_images.py: the raylet frees dead
# objects every 100 ms instead of every second (at 1200 px a second of traffic is ~300 MB of
# object store). glibc's settings are the configured process profile (ray.process_profile,
# "default": a fixed 32 MiB mmap threshold, a 4 MiB trim threshold, two arenas).
LOCAL_RAY: dict[str, Any] = {"_system_config": {"free_objects_period_milliseconds": 100}}


def tuned_profile(readers: int = 1, blur_parallelism: int = 1, writers: int = 1,
                  split: bool = False) -> str:
    """The process profile (``ray.process_profiles``) measured best for this shape of the
    pipeline, set per step (the ``process_profile`` step option) so that other shapes keep
    the job's:

    - ``whole_pipeline`` when every chain runs the whole pipeline (all steps at one
      parallelism, not split; no image crosses an actor): it keeps up to 64 MiB of freed
      heap, which the next image allocates again. At 1200 px, two such chains: 29.7-30.1
      images/s against 27.8-28.7 (1.87x the loop against 1.73-1.78x), for more memory (job
      USS 252 MB against 222 MB in the N = 1000 runs of docs/images.md).
    - ``split_pipeline`` otherwise (every decoded image crosses the object store): it serves
      image buffers by mmap from 1 MiB up, so that a freed image goes back to the OS at
      once. At 1200 px, parallelism 1 split in two chains: job USS 221 MB against 263-404 MB
      with the 32 MiB threshold, for 4-6% of the throughput; with the blur at parallelism 2
      the job grew 1.29x from 50 to 1200 px with it, 1.55x without.
    """
    whole = not split and readers == blur_parallelism == writers
    return "whole_pipeline" if whole else "split_pipeline"


def tuned_env(readers: int = 1, blur_parallelism: int = 1, writers: int = 1,
              split: bool = False) -> dict[str, str]:
    """The environment of :func:`tuned_profile`, from the configured profiles (for a step's
    ``actor_env``)."""
    from rayflow.config import load_config

    return load_config().ray.process_env(tuned_profile(readers, blur_parallelism, writers,
                                                       split))


def build_flow(input_dir: str, *, output_dir: str | None = None, readers: int = 1,
               decoders: int | None = None, blur_parallelism: int = 1, writers: int = 1,
               ksize: int = 5, sigma: float = 3.0, border: Border = "reflect101",
               channels: int | None = None, max_pixels: int | None = 100_000_000,
               pattern: str | tuple[str, ...] = IMAGE_PATTERNS, recursive: bool = False,
               watch: bool = False, split: bool = False,
               actor_env: dict | None = None,
               process_profile: str | None = None) -> rf.Dataflow:
    """The W1 dataflow: read → decode → blur → encode PNG (drop, or write to a directory).

    Reading and decoding run at ``readers`` (the paper's reader both reads and decodes;
    here decoding is its own step so bad files become dead letters with their path).
    Steps with equal parallelism are chained into one actor (no copy of the image between
    them); ``split=True`` starts a new chain at the blur, so that reading and decoding run
    on one core while blurring and encoding run on another. ``process_profile`` (a name of
    ``ray.process_profiles``, e.g. :func:`tuned_profile`) and ``actor_env`` set the
    environment of every step's actor process.
    """
    flow = rf.Dataflow("image_blur")
    env: dict[str, Any] = {"actor_env": actor_env} if actor_env else {}
    if process_profile is not None:
        env["process_profile"] = process_profile
    decoders = decoders or readers
    # 1 MiB of files per batch: one 1200 px image at a time, a few hundred small ones
    s = flow.source("read", DirectorySource(input_dir, pattern, watch=watch,
                                            max_batch_bytes=1 << 20, recursive=recursive),
                    parallelism=readers, **env)
    if decoders != readers:
        s = s.rebalance()
    s = s.apply("decode", DecodeImage(channels=channels, max_pixels=max_pixels),
                parallelism=decoders, on_error="dead_letter", **env)
    if blur_parallelism != decoders:
        s = s.rebalance()
    s = s.apply("blur", GaussianBlur(ksize, sigma, sigma, border), parallelism=blur_parallelism,
                on_error="dead_letter", start_new_chain=split, **env)
    if writers != blur_parallelism:
        s = s.rebalance()
    sink = DirectorySink(output_dir, relative_to=input_dir) if output_dir else PngDiscardSink()
    s.sink("write", sink, parallelism=writers, on_error="dead_letter", **env)
    return flow


def step_times(metrics: dict) -> dict:
    """Per-image milliseconds each step spent working (busy minus backpressure waits),
    summed over its instances."""
    out = {}
    for step, m in metrics.items():
        n = max(m["records_in"], 1)
        out[step] = round(1000.0 * max(m["busy_s"] - m["backpressure_s"], 0.0) / n, 3)
    return out


def run_w1(input_dir: str, *, address: str | None = None, measure_memory: bool = False,
           stream: dict | None = None, **flow_kw) -> dict:
    """Run W1 once and return its summary (throughput, steps, dead letters, memory)."""
    from rayflow._raycontext import ensure_ray

    ensure_ray(address, **({} if address else LOCAL_RAY))
    probe = None
    if measure_memory:
        from rayflow.memprobe import MemoryProbe

        probe = MemoryProbe()
    flow = build_flow(input_dir, **flow_kw)
    if probe:
        probe.start()
    t0 = time.time()
    try:
        job = rf.run(flow, ray={"address": address}, stream={**IMAGE_STREAM, **(stream or {})})
    finally:
        memory = probe.stop() if probe else None
    m = job.metrics()
    dead = job.dead_letters()
    return {
        "images_written": m["write"]["records_out"],
        "files_read": m["read"]["records_out"],
        "dead_letters": sum(s["dead_letters"] for s in m.values()),
        "dead_letter_examples": [d.describe() for d in dead[:5]],
        "throughput_img_s": round(job.throughput("write"), 2),
        "wall_s": round(time.time() - t0, 2),
        "startup_s": round(job.startup_s, 2),
        "step_ms_per_image": step_times(m),
        "memory": memory,
    }
