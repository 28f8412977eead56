"""Out-of-core tiles: images larger than memory, read and written as tiles of ``.npy``
files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rayflow.core.connectors import (
    RunState,
    SinkSpec,
    SinkWriter,
    SourceReader,
    SourceSpec,
    restored_by_run,
)
from rayflow.core.operators import (
    StepContext,
)
from rayflow.operators.image.tiling import Halo, Tile, cut_tile, place_tile, tile_regions

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
        return _NpyTileWriter(ctx, self.path, resume_state)


class _NpyTileWriter(SinkWriter):
    def __init__(self, ctx: StepContext, path: str, resume_state: Any = None):
        # (a recovery of this run counts on from the checkpoint: a replayed tile is placed
        # again, where it was, and counted once)
        self.ctx, self.path = ctx, path
        self.tiles = sum(restored_by_run(resume_state, ctx))

    def write(self, items, event_times, in_time):
        out = np.load(self.path, mmap_mode="r+")
        try:
            for t in items:
                place_tile(out, t)
                self.tiles += 1
            out.flush()
        finally:
            del out

    def snapshot(self, checkpoint_id: int) -> RunState:
        return RunState(self.ctx.run_id, self.tiles)

    def result(self) -> list[dict]:
        return [{"instance": self.ctx.instance, "tiles": self.tiles}]
