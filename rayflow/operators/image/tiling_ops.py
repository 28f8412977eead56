"""The tiling operators: cut ``(key, image)`` records into tiles for a filter, and stitch
the filtered tiles of each image back. Pure: no Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rayflow.core.operators import Logic, OperatorSpec, Output, StepContext, describe_exception
from rayflow.operators.image.filters import _Filter, _label, _where
from rayflow.operators.image.tiling import Tile, place_tile, split_tiles


@dataclass(frozen=True)
class SplitTiles(OperatorSpec):
    """Cut each ``(key, image)`` record into :class:`Tile` records for ``filter``.

    Use with ``stream.apply("split", SplitTiles(blur, 512))``, then the filter at any
    parallelism (``.rebalance().apply("blur", blur, parallelism=4)``), then
    ``.key_by(tile_key).apply("stitch", StitchTiles())``.
    """

    filter: _Filter
    tile: int | tuple[int, int] = 512

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _SplitLogic(ctx, self)


class _SplitLogic(Logic):
    def __init__(self, ctx: StepContext, spec: SplitTiles):
        super().__init__(ctx)
        self.spec = spec

    def process(self, items, event_times):
        f, out, times, dead = self.spec.filter, [], [], []
        for i, rec in enumerate(items):
            key, image = (rec[0], rec[1]) if isinstance(rec, tuple) else (None, rec)
            try:
                tiles = split_tiles(image, self.spec.tile, f.halo, f.border, key)
            except Exception as exc:  # noqa: BLE001
                dead.append(self.dead(describe_exception(exc), _label(rec), _where(rec)))
                continue
            out.extend(tiles)
            if event_times is not None:
                times.extend([event_times[i]] * len(tiles))
        return Output(out, None if event_times is None else np.asarray(times), dead)


def tile_key(tile: Tile) -> Any:
    """Partition key of a tile: its image (use with ``key_by`` before :class:`StitchTiles`)."""
    return tile.key


@dataclass(frozen=True)
class StitchTiles(OperatorSpec):
    """Collect the tiles of each image and emit ``(key, image)`` once all have arrived.

    Holds one output buffer per image in progress; put ``key_by(tile_key)`` before it when
    it runs at parallelism > 1, so all tiles of an image meet in one instance.
    """

    def build(self, ctx: StepContext, resume_state: Any = None) -> Logic:
        return _StitchLogic(ctx)


class _StitchLogic(Logic):
    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.partial: dict[Any, list] = {}  # key -> [buffer, tiles left, earliest event time]

    def process(self, items, event_times):
        out, times = [], []
        for i, t in enumerate(items):
            entry = self.partial.get(t.key)
            if entry is None:
                entry = self.partial[t.key] = [np.empty(t.shape, t.data.dtype), t.count, np.inf]
            place_tile(entry[0], t)
            entry[1] -= 1
            if event_times is not None:
                entry[2] = min(entry[2], event_times[i])
            if entry[1] == 0:
                del self.partial[t.key]
                out.append((t.key, entry[0]))
                times.append(entry[2])
        return Output(out, None if event_times is None else np.asarray(times))

    def on_end(self) -> Output | None:
        if not self.partial:
            return None
        dead = [self.dead(f"{left} tile(s) missing at end of stream", key, str(key))
                for key, (_, left, _) in self.partial.items()]
        self.partial.clear()
        return Output([], None, dead)
