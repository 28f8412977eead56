"""Tumbling windows over Arrow batches, kept as columns. Pure: no Ray.

A keyed tumbling window whose key is a field (``key_by("user")``) and whose aggregator has a
columnar form (:meth:`Aggregator.arrow_partials`: ``Count()``, ``Sum(Field(...))``,
``MinMax`` of fields) takes an Arrow batch whole: its rows become a table of partials (the
key column and one column per part of the accumulator: a count of 1, the value for a sum,
a minimum and a maximum), which the window keeps. A window's tables are merged per key
(Arrow's dictionary encoding finds the keys and numpy merges the values, or Arrow's
grouping on large tables) when they grow, and when it fires, which then makes one result
per key. No Python work is done per record, and none per key until the window fires, so a
record costs about the same with a thousand keys open as with a million, apart from what
the processor's caches cost the hashing (a Python dict per window pays cache misses per
record once its keys outgrow them).

A window's tables are merged into one once they hold ``COMPACT_ROWS`` rows and four times
as many as after their last merge (eight where that merge left most rows), so a window
holds at most a few rows per key (and ``COMPACT_ROWS``), and merging costs a few passes
over its rows in all. At a checkpoint the windows that changed are written to the step's
state backend, a table of a row per key each (see :class:`ArrowWindows`: on RocksDB what
came since the last checkpoint, which then leaves memory); a restore reads them back, and
a rescale splits them by the keys each new instance owns. Integer sums are exact while
they fit in 64 bits; float sums add in another order than record by record, so they may
differ in the last bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: the state keys of a window's partials: ``(CW, (start, end), part)``
CW = "__cw"
#: a window's tables are merged once they hold this many rows (and 4x the last merge's)
COMPACT_ROWS = 1 << 16
#: tables of this many rows and more are merged by Arrow's grouping (see ArrowWindows.merged)
GROUP_ROWS = 1 << 16
_GROUP = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}


def _groups_by(typ: Any) -> bool:
    """Whether a key column of type ``typ`` can be grouped by (dictionary-encoded)."""
    import pyarrow as pa

    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_string(typ)
            or pa.types.is_large_string(typ) or pa.types.is_binary(typ)
            or pa.types.is_large_binary(typ) or pa.types.is_boolean(typ)
            or pa.types.is_temporal(typ))


def is_cw(state_key: Any) -> bool:
    return isinstance(state_key, tuple) and len(state_key) == 3 and state_key[0] == CW


class ArrowWindows:
    """The open windows of one step instance, as tables of partials: column 0 the key,
    then the columns of :meth:`Aggregator.arrow_partials`. A window's tables since the last
    checkpoint are in memory; at a checkpoint they go to ``state`` as entries
    ``(CW, window, part)``. On a state that holds its values in memory (``spill`` False)
    a window is one entry, rewritten when it changed, and its table stays in memory; on
    one that does not (RocksDB), each checkpoint adds an entry of what came since the last
    and the memory holds only that, and a firing reads the window's entries back."""

    def __init__(self, key: str, parts: list[tuple[str | None, str]], state: Any,
                 spill: bool):
        self.key = key
        self.parts = parts
        self.state = state
        self.spill = spill
        self.fields = list(dict.fromkeys(f for f, _ in parts if f is not None))
        self._names = [key] + [f"p{i}" for i in range(len(parts))]
        self._group = [(f"p{i}", _GROUP[how]) for i, (_, how) in enumerate(parts)]
        self.open: dict[tuple, list] = {}  # window -> its tables in memory
        self.stored: dict[tuple, list[int]] = {}  # window -> its parts in the state
        self._schema: dict[tuple, Any] = {}  # window -> the schema of its tables
        self._rows: dict[tuple, int] = {}  # window -> the rows of its tables in memory
        self._next: dict[tuple, int] = {}  # window -> the rows at which they are merged
        self._dirty: set = set()  # windows with tables since the last checkpoint

    def has(self, window: tuple) -> bool:
        return window in self._schema

    def reads(self, items: Any) -> bool:
        """Whether ``items`` (an Arrow batch) can go in as columns: it has the key, of a
        type Arrow groups by (not a list or a struct), and the aggregated fields, numbers
        without nulls (where a record would be a dead letter on the record path, the batch
        takes that path; so does a batch with a NaN in a field, whose minimum and maximum
        Python's comparisons define)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        names = items.schema.names
        if self.key not in names or not _groups_by(items.schema.field(self.key).type):
            return False
        for f in self.fields:
            if f not in names:
                return False
            typ = items.schema.field(f).type
            if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)) \
                    or items.column(f).null_count:
                return False
            if pa.types.is_floating(typ) and pc.any(pc.is_nan(items.column(f))).as_py():
                return False  # (a NaN's minimum or maximum is Python's to say)
        return True

    def partials(self, items: Any) -> Any:
        """The rows of ``items`` as a table of partials, a row each (a record's count is
        1, its sum, minimum and maximum its value): no hashing per batch; rows of a key
        merge when their window's tables do."""
        import pyarrow as pa

        n = len(items)
        values: dict = {}
        for f in self.fields:
            col = items.column(f)
            values[f] = col.cast(pa.int64() if pa.types.is_integer(col.type) else pa.float64())
        key = items.column(self.key)
        if pa.types.is_dictionary(key.type):  # (merges give plain keys: tables must agree)
            key = key.cast(key.type.value_type)
        cols = [key] + [
            pa.array(np.ones(n, dtype=np.int64)) if f is None else values[f]
            for f, _ in self.parts]
        return pa.table(cols, names=self._names)

    def merged(self, tables: list) -> Any:
        """One table of partials from several: a row per key, its rows merged. From
        ``GROUP_ROWS`` rows up by Arrow's grouping; below, Arrow's dictionary encoding finds
        each row's key and numpy merges the values by it, which costs less to set up (a
        window of a few thousand rows took Arrow's grouping 0.16 ms, and the encoding and
        numpy 0.02 ms, on the 2-core VM; on two million rows the grouping was faster)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if len(table) >= GROUP_ROWS:
            out = table.group_by(self.key, use_threads=False).aggregate(
                self._group).rename_columns(self._names)
            # the grouping's hash table goes back to the system now: Arrow's allocator kept
            # it otherwise (bench_keys at 10^6 keys: the process grew 165 bytes per key's
            # window with it kept, 67 without, at the same speed)
            pa.default_memory_pool().release_unused()
            return out
        keys = table.column(0).combine_chunks()
        if pa.types.is_dictionary(keys.type):
            keys = keys.dictionary_decode()
        coded = pc.dictionary_encode(keys, null_encoding="encode")
        codes = coded.indices.to_numpy(zero_copy_only=False)
        n = len(coded.dictionary)
        cols = [coded.dictionary]
        for i, (_, how) in enumerate(self.parts):
            vals = table.column(i + 1).to_numpy()
            if how in ("count", "sum"):
                out = np.zeros(n, dtype=vals.dtype)
                np.add.at(out, codes, vals)
            else:
                big = np.iinfo(vals.dtype) if vals.dtype.kind == "i" else None
                if how == "min":
                    out = np.full(n, big.max if big else np.inf, dtype=vals.dtype)
                    np.minimum.at(out, codes, vals)
                else:
                    out = np.full(n, big.min if big else -np.inf, dtype=vals.dtype)
                    np.maximum.at(out, codes, vals)
            cols.append(pa.array(out))
        return pa.table(cols, names=self._names)

    def fits(self, window: tuple, table: Any) -> bool:
        """Whether ``table`` has the schema of ``window``'s tables (or it has none): a batch
        whose column types differ from its window's takes the record path."""
        schema = self._schema.get(window)
        return schema is None or schema.equals(table.schema)

    def _known(self, window: tuple, table: Any) -> bool:
        """Note ``window`` (its tables' schema is ``table``'s); whether it is new."""
        new = window not in self._schema
        if new:
            self._schema[window] = table.schema
        return new

    def _append(self, window: tuple, table: Any) -> None:
        tables = self.open.setdefault(window, [])
        if not tables:
            self._rows[window], self._next[window] = 0, COMPACT_ROWS
        tables.append(table)
        self._rows[window] += len(table)

    def add(self, window: tuple, table: Any) -> bool:
        """Add a table of partials to ``window``; whether the window is new. Once its tables
        in memory hold ``COMPACT_ROWS`` rows and four times as many as after their last
        merge (eight where that merge left most rows: keys seen once or twice), they are
        merged into one, so they hold at most a few rows per key."""
        new = self._known(window, table)
        self._append(window, table)
        self._dirty.add(window)
        if self._rows[window] >= self._next[window]:
            self._compact(window)
        return new

    def _compact(self, window: tuple) -> Any:
        """Merge ``window``'s tables in memory into one, and return it."""
        rows = self._rows[window]
        one = self.merged(self.open[window])
        self.open[window] = [one]
        self._rows[window] = len(one)
        # a merge that left most rows (keys seen once or twice) waits longer for the next
        self._next[window] = max(COMPACT_ROWS, (8 if 4 * len(one) > 3 * rows else 4) * len(one))
        return one

    def restore(self, state_key: tuple, table: Any) -> bool:
        """A window's entry ``(CW, window, part)`` of a restored state; whether the window
        is new."""
        window = state_key[1]
        new = self._known(window, table)
        self.stored.setdefault(window, []).append(state_key[2])
        if not self.spill:  # (the entry is rewritten at the next checkpoint it changed by)
            self._append(window, table)
        return new

    def take(self, window: tuple) -> tuple[list, list[list]] | None:
        """Remove ``window``, its entries in the state too: its keys and partial columns,
        as lists (None: not open)."""
        if self._schema.pop(window, None) is None:
            return None
        tables = self.open.pop(window, [])
        self._rows.pop(window, None)
        self._next.pop(window, None)
        self._dirty.discard(window)
        for part in self.stored.pop(window, ()):
            if self.spill:
                table = self.state.get((CW, window, part))
                if table is not None:
                    tables.append(table)
            self.state.delete((CW, window, part))
        if not tables:
            return [], [[] for _ in self.parts]
        table = self.merged(tables)
        return (table.column(0).to_pylist(),
                [table.column(i).to_pylist() for i in range(1, table.num_columns)])

    def snapshot(self) -> None:
        """Write the windows that changed since the last checkpoint to the state (see the
        class docstring)."""
        state = self.state
        for window in self._dirty:
            tables = self.open.get(window)
            if not tables:
                continue
            parts = self.stored.setdefault(window, [])
            if self.spill:  # what came since the last checkpoint, as an entry of its own
                part = max(parts, default=-1) + 1
                state.put((CW, window, part), self.merged(tables))
                parts.append(part)
                self.open[window] = []
            else:  # the window whole, as one entry
                state.put((CW, window, 0), self._compact(window))
                for part in parts:
                    if part:
                        state.delete((CW, window, part))
                self.stored[window] = [0]
        self._dirty.clear()


def owned_rows(table: Any, owns: Any) -> Any:
    """The rows of a table of partials whose key ``owns(key)`` accepts (None: no row)."""
    keys = table.column(0).to_pylist()
    mask = np.fromiter((owns(k) for k in keys), dtype=bool, count=len(keys))
    if not mask.any():
        return None
    return table if mask.all() else table.filter(mask)
