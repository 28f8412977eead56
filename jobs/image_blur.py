"""W1: read images from disk, Gaussian blur (5 × 5, sigma 3), encode PNG and drop (or write).

    python jobs/image_blur.py --size 400 --count 200            # synthetic PNGs, local Ray
    python jobs/image_blur.py --input ./imgs --output ./blurred --blur-parallelism 2
    python jobs/image_blur.py --input ./photos --ext jpg,jpeg --recursive --output ./blurred
    python jobs/image_blur.py --input ./imgs --pattern 'shot-*.png'
    ray job submit --working-dir . -- python jobs/image_blur.py --address auto --input /data/imgs

The input is every file whose name matches ``--pattern`` (a glob; repeat it for several) or,
by default, has one of the ``--ext`` extensions (``png,jpg,jpeg,tif,tiff,bmp,webp``, in lower
or upper case). An input directory where nothing matches is an error (exit code 2), not an
empty run. With ``--output``, each image is written as PNG at its path relative to the input
(``a/shot.jpg`` -> ``OUT/a/shot.png``); two inputs that would share an output name (``photo.png``
and ``photo.jpg``) make the second a dead letter, never an overwrite.

Bad files (empty, truncated, corrupt, not images, wrong channel count, oversize) go to the
dead-letter output with their path and the reason; the job counts them and goes on.
"""

from __future__ import annotations

import json
import tempfile
import time

import click

import rayflow as rf
from rayflow.connectors.images import (
    DecodeImage,
    DirectorySink,
    DirectorySource,
    PngDiscardSink,
    write_image_set,
)
from rayflow.operators.image import GaussianBlur

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
# object store). glibc: a fixed mmap threshold of 32 MiB serves image buffers from the heap
# (with the 256 KiB threshold every image was a fresh mmap whose page faults cost ~15% of
# the throughput), a 4 MiB trim threshold gives freed images back to the OS, and two arenas
# per process stop the control threads from keeping heaps of their own.
LOCAL_RAY = {
    "_system_config": {"free_objects_period_milliseconds": 100},
    "runtime_env": {"env_vars": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                                 "MALLOC_TRIM_THRESHOLD_": str(4 << 20),
                                 "MALLOC_ARENA_MAX": "2"}},
}

# For a pipeline split between actors (every decoded image crosses the object store): serve
# image buffers by mmap from 1 MiB up, so that a freed image goes back to the OS at once.
# Measured at 1200 px, parallelism 1 split in two chains: job USS 263-404 MB with the 32 MiB
# threshold, 221 MB with this one, for 4-6% of the throughput; with the blur at parallelism
# 2 (images cross twice) the job grew 1.55x from 50 to 1200 px without it, 1.29x with it.
# Set per step (``actor_env``), so the unsplit chains keep the faster heap.
SPLIT_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}

# For chains that run the whole pipeline (no image crosses an actor): keep up to 64 MiB of
# freed heap instead of 4 MiB. Each image frees buffers of the sizes the next one allocates;
# trimming them gave the pages back to the OS only to fault them in again. Measured at
# 1200 px, two such chains: 29.7-30.1 images/s against 27.8-28.7 (1.87x the loop against
# 1.73-1.78x; 1000 px: 1.83x against 1.77x). It keeps more heap: job USS 252 MB against
# 222 MB at 1200 px in the N = 1000 benchmark runs (docs/images.md): memory for speed.
WHOLE_ENV = {"MALLOC_TRIM_THRESHOLD_": str(64 << 20)}


def tuned_env(readers: int = 1, blur_parallelism: int = 1, writers: int = 1,
              split: bool = False) -> dict:
    """The per-step malloc settings measured best for this shape of the pipeline:
    :data:`SPLIT_ENV` when images cross actors, :data:`WHOLE_ENV` when every chain runs the
    whole pipeline (all steps at one parallelism, not split)."""
    whole = not split and readers == blur_parallelism == writers
    return WHOLE_ENV if whole else SPLIT_ENV


def build_flow(input_dir: str, *, output_dir: str | None = None, readers: int = 1,
               decoders: int | None = None, blur_parallelism: int = 1, writers: int = 1,
               ksize: int = 5, sigma: float = 3.0, border: str = "reflect101",
               channels: int | None = None, max_pixels: int | None = 100_000_000,
               pattern: str | tuple[str, ...] = IMAGE_PATTERNS, recursive: bool = False,
               watch: bool = False, split: bool = False,
               actor_env: dict | None = None) -> rf.Dataflow:
    """The W1 dataflow: read → decode → blur → encode PNG (drop, or write to a directory).

    Reading and decoding run at ``readers`` (the paper's reader both reads and decodes;
    here decoding is its own step so bad files become dead letters with their path).
    Steps with equal parallelism are chained into one actor (no copy of the image between
    them); ``split=True`` starts a new chain at the blur, so that reading and decoding run
    on one core while blurring and encoding run on another. ``actor_env`` sets environment
    variables of every step's actor process (e.g. :data:`SPLIT_ENV`).
    """
    flow = rf.Dataflow("image_blur")
    env = {"actor_env": actor_env} if actor_env else {}
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


@click.command()
@click.option("--address", default=None, help="Ray address ('auto' inside ray job submit).")
@click.option("--input", "input_dir", default=None, help="Directory of images; synthetic if omitted.")
@click.option("--output", "output_dir", default=None, help="Write blurred PNGs here (default: encode and drop).")
@click.option("--count", default=200, show_default=True, help="Synthetic images to generate.")
@click.option("--size", default=400, show_default=True, help="Side of the synthetic images, px.")
@click.option("--readers", default=1, show_default=True)
@click.option("--blur-parallelism", default=1, show_default=True)
@click.option("--writers", default=1, show_default=True)
@click.option("--ksize", default=5, show_default=True)
@click.option("--sigma", default=3.0, show_default=True)
@click.option("--border", default="reflect101", show_default=True,
              type=click.Choice(["reflect101", "reflect", "replicate", "constant", "wrap"]))
@click.option("--channels", default=None, type=int, help="Required channels; others are dead letters.")
@click.option("--pattern", "patterns", multiple=True,
              help="Glob of the input file names (repeat for several); overrides --ext.")
@click.option("--ext", "extensions", default=",".join(IMAGE_EXTENSIONS), show_default=True,
              help="Comma-separated extensions of the input files (any case).")
@click.option("--recursive/--no-recursive", default=False, show_default=True,
              help="Read the input's subdirectories too.")
@click.option("--memory/--no-memory", default=True, help="Measure peak USS and object store.")
def main(address, input_dir, output_dir, count, size, readers, blur_parallelism, writers, ksize,
         sigma, border, channels, patterns, extensions, recursive, memory):
    """Run W1 and print a JSON summary."""
    try:
        pattern = tuple(patterns) if patterns else ext_patterns(extensions.split(","))
        if input_dir is not None:
            _check_input(input_dir, DirectorySource(input_dir, pattern, recursive=recursive))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    tmp = None
    if input_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="w1-")
        input_dir = tmp.name
        write_image_set(input_dir, count, size)
    try:
        summary = run_w1(input_dir, address=address, measure_memory=memory,
                         output_dir=output_dir, readers=readers,
                         blur_parallelism=blur_parallelism, writers=writers, ksize=ksize,
                         sigma=sigma, border=border, channels=channels, pattern=pattern,
                         recursive=recursive,
                         actor_env=tuned_env(readers, blur_parallelism, writers))
        print(json.dumps(summary, indent=2))
    finally:
        if tmp is not None:
            tmp.cleanup()


def _check_input(input_dir: str, source: DirectorySource) -> None:
    """Fail before starting Ray when the input has nothing to read (``ValueError``)."""
    from pathlib import Path

    root = Path(input_dir)
    if not root.is_dir():
        raise ValueError(f"--input {input_dir!r} is not a directory")
    files = root.rglob("*") if source.recursive else root.iterdir()
    if not any(p.is_file() and source.matches(p.name) for p in files):
        pats = " or ".join(repr(p) for p in source.patterns)
        raise ValueError(f"no file in {'or below ' if source.recursive else ''}"
                         f"{input_dir!r} matches {pats}")


if __name__ == "__main__":
    main()
