"""W1: read images from disk, Gaussian blur (5 × 5, sigma 3), encode PNG and drop (or write).

    python jobs/image_blur.py --size 400 --count 200            # synthetic PNGs, local Ray
    python jobs/image_blur.py --input ./imgs --output ./blurred --blur-parallelism 2
    python jobs/image_blur.py --input ./photos --ext jpg,jpeg --recursive --output ./blurred
    python jobs/image_blur.py --input ./imgs --pattern 'shot-*.png'
    ray job submit --working-dir . -- python jobs/image_blur.py --address auto --input /data/imgs

The command line of the flow in :mod:`rayflow.examples.image_blur`, which says what is read,
written and dead-lettered. ``--pattern`` (a glob; repeat it for several) or ``--ext`` (by
default ``png,jpg,jpeg,tif,tiff,bmp,webp``, any case) choose the input files; an input
directory where nothing matches is an error (exit code 2), not an empty run.
"""

from __future__ import annotations

import json
import tempfile

import click

from rayflow.connectors.images import DirectorySource, write_image_set
from rayflow.examples.image_blur import (  # noqa: F401 - the names scripts import from here
    IMAGE_EXTENSIONS,
    IMAGE_PATTERNS,
    IMAGE_STREAM,
    LOCAL_RAY,
    build_flow,
    ext_patterns,
    run_w1,
    step_times,
    tuned_env,
    tuned_profile,
)


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
                         process_profile=tuned_profile(readers, blur_parallelism, writers))
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
