"""The logical dataflow: steps with ids, wired into streams. Pure Python, no Ray.

    >>> from rayflow import Dataflow, MemorySource, CollectSink
    >>> flow = Dataflow("example")
    >>> words = flow.source("lines", MemorySource(["a b", "c"])).flat_map("split", str.split)
    >>> words.key_by(lambda w: w).map("upper", str.upper, parallelism=2).sink("out", CollectSink())
    >>> [s.step_id for s in flow.steps]
    ['lines', 'split', 'upper', 'out']
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rayflow.batches import Field
from rayflow.connectors.base import SinkSpec, SourceSpec
from rayflow.errors import ConfigError
from rayflow.operators.base import OperatorSpec
from rayflow.operators.stateless import Filter, FlatMap, Inspect, Map, MapBatches

Partitioning = Literal["forward", "rebalance", "hash", "broadcast"]
OnError = Literal["raise", "dead_letter"]
_STEP_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Edge:
    """How records travel from ``upstream`` into a step."""

    upstream: str
    partitioning: Partitioning = "forward"
    key_fn: Callable[[Any], Any] | None = None
    port: str = "main"  # which output of the upstream step ("late" for late records...)


@dataclass(frozen=True)
class Step:
    """One node of the logical graph."""

    step_id: str
    kind: Literal["source", "operator", "sink"]
    spec: SourceSpec | OperatorSpec | SinkSpec
    parallelism: int = 1
    inputs: tuple[Edge, ...] = ()
    on_error: OnError | None = None  # None: the job's default
    options: dict = field(default_factory=dict)  # per-step overrides: batch_size, linger_ms...


class Dataflow:
    """A named graph of steps. Build it with :meth:`source` and the :class:`Stream` methods,
    then run it with :func:`rayflow.run` (or :meth:`run`)."""

    def __init__(self, name: str):
        self.name = name
        self._steps: dict[str, Step] = {}
        self.dead_letter_sink: SinkSpec | None = None

    @property
    def steps(self) -> list[Step]:
        return list(self._steps.values())

    def step(self, step_id: str) -> Step:
        return self._steps[step_id]

    def source(
        self, step_id: str, spec: SourceSpec, parallelism: int = 1, **options: Any
    ) -> Stream:
        """Add a source step and return its output stream."""
        if not isinstance(spec, SourceSpec):
            raise ConfigError(f"step {step_id!r}: {spec!r} is not a source")
        self._add(Step(step_id, "source", spec, parallelism, (), None, options))
        return Stream(self, step_id)

    def dead_letters(self, spec: SinkSpec) -> None:
        """Send every dead letter of the job to ``spec`` (e.g. a KafkaSink); by default they
        are kept in the job and returned by ``job.dead_letters()``."""
        self.dead_letter_sink = spec

    def _add(self, step: Step) -> None:
        if not _STEP_ID.match(step.step_id):
            raise ConfigError(
                f"step id {step.step_id!r}: use letters, digits, '_', '-' and '.' only"
            )
        if step.step_id in self._steps:
            raise ConfigError(f"step id {step.step_id!r} is used twice in flow {self.name!r}")
        if not isinstance(step.parallelism, int) or step.parallelism < 1:
            raise ConfigError(f"step {step.step_id!r}: parallelism must be an int >= 1")
        self._steps[step.step_id] = step

    def validate(self) -> None:
        """Check the graph: it has sources and sinks, and every stream ends in a sink."""
        steps = self.steps
        if not any(s.kind == "source" for s in steps):
            raise ConfigError(f"flow {self.name!r} has no source")
        consumed = {e.upstream for s in steps for e in s.inputs if e.port == "main"}
        dangling = [s.step_id for s in steps if s.kind != "sink" and s.step_id not in consumed]
        if dangling:
            raise ConfigError(
                f"flow {self.name!r}: the output of {dangling} goes nowhere; end each stream "
                f"with .sink(step_id, CollectSink() | DiscardSink() | KafkaSink(...))"
            )

    def run(self, **kwargs: Any):
        """Run to completion and return the finished job (see :func:`rayflow.run`)."""
        from rayflow.runtime.job import run

        return run(self, **kwargs)


class Stream:
    """The output of a step; each method adds a downstream step and returns its stream."""

    def __init__(
        self, flow: Dataflow, step_id: str, partitioning: Partitioning = "forward",
        key_fn: Callable[[Any], Any] | None = None, port: str = "main",
    ):
        self.flow, self.step_id = flow, step_id
        self._partitioning, self._key_fn, self._port = partitioning, key_fn, port

    def _then(
        self, step_id: str, kind: str, spec: Any, parallelism: int | None,
        on_error: OnError | None, options: dict,
    ) -> Stream:
        if parallelism is None:
            parallelism = self.flow.step(self.step_id).parallelism
        edge = Edge(self.step_id, self._partitioning, self._key_fn, self._port)
        self.flow._add(Step(step_id, kind, spec, parallelism, (edge,), on_error, options))
        return Stream(self.flow, step_id)

    def key_by(self, key_fn: Callable[[Any], Any] | str) -> Stream:
        """Partition the next step's input by ``key_fn(record)``: records with equal keys go to
        the same instance. For numpy batches ``key_fn`` gets the whole batch and returns one key
        per row. A string names a field (:class:`~rayflow.batches.Field`): on Arrow batches the
        key column is then hashed and windowed vectorized, not record by record."""
        if isinstance(key_fn, str):
            key_fn = Field(key_fn)
        return Stream(self.flow, self.step_id, "hash", key_fn, self._port)

    def rebalance(self) -> Stream:
        """Spread the next step's input round-robin over its instances, batch by batch."""
        return Stream(self.flow, self.step_id, "rebalance", None, self._port)

    def broadcast(self) -> Stream:
        """Send every batch to every instance of the next step."""
        return Stream(self.flow, self.step_id, "broadcast", None, self._port)

    def side(self, port: str) -> Stream:
        """The step's side output ``port`` (e.g. ``"late"`` of a window step). A side output
        nobody consumes goes to the dead-letter output: never dropped silently."""
        return Stream(self.flow, self.step_id, "forward", None, port)

    def window(self, step_id: str, windower: Any, aggregator: Any, *, clock: Any = None,
               parallelism: int | None = None, on_error: OnError | None = None,
               **options: Any) -> Stream:
        """Aggregate each key's records per window; emits :class:`WindowResult` records.
        Needs a preceding :meth:`key_by`. Late records leave on ``.side("late")``.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> from rayflow.operators.windows import CountWindow, Count
            >>> f = Dataflow("w")
            >>> counts = f.source("in", MemorySource(["a", "b", "a"])).key_by(str).window(
            ...     "count", CountWindow(2), Count())
            >>> counts.sink("out", CollectSink())
        """
        from rayflow.operators.windows import ProcessingTime, Windowed

        if self._partitioning != "hash" or self._key_fn is None:
            raise ConfigError(f"step {step_id!r}: window() needs key_by(...) before it")
        spec = Windowed(windower, aggregator, self._key_fn, clock or ProcessingTime())
        return self._then(step_id, "operator", spec, parallelism, on_error, options)

    def map(self, step_id: str, fn: Callable[[Any], Any], *, parallelism: int | None = None,
            on_error: OnError | None = None, **options: Any) -> Stream:
        """Apply ``fn`` to every record.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> f = Dataflow("m"); f.source("in", MemorySource([1, 2])).map("sq", lambda x: x * x).sink("out", CollectSink())
        """
        return self._then(step_id, "operator", Map(fn), parallelism, on_error, options)

    def flat_map(self, step_id: str, fn: Callable[[Any], Any], *, parallelism: int | None = None,
                 on_error: OnError | None = None, **options: Any) -> Stream:
        """Apply ``fn`` to every record and emit each element of the iterable it returns."""
        return self._then(step_id, "operator", FlatMap(fn), parallelism, on_error, options)

    def filter(self, step_id: str, fn: Callable[[Any], bool], *, parallelism: int | None = None,
               on_error: OnError | None = None, **options: Any) -> Stream:
        """Keep the records for which ``fn`` returns true."""
        return self._then(step_id, "operator", Filter(fn), parallelism, on_error, options)

    def inspect(self, step_id: str, fn: Callable[[Any], Any], *, parallelism: int | None = None,
                **options: Any) -> Stream:
        """Call ``fn`` on every record for its side effect (logging); records pass through."""
        return self._then(step_id, "operator", Inspect(fn), parallelism, None, options)

    def map_batches(self, step_id: str, fn: Callable[[Any], Any], *,
                    parallelism: int | None = None, on_error: OnError | None = None,
                    **options: Any) -> Stream:
        """Apply ``fn`` to a whole batch (a list, numpy array or Arrow table): the fast path
        for columnar work."""
        return self._then(step_id, "operator", MapBatches(fn), parallelism, on_error, options)

    def apply(self, step_id: str, spec: OperatorSpec, *, parallelism: int | None = None,
              on_error: OnError | None = None, **options: Any) -> Stream:
        """Add a step running any operator spec (windows, image filters, your own)."""
        return self._then(step_id, "operator", spec, parallelism, on_error, options)

    def sink(self, step_id: str, spec: SinkSpec, *, parallelism: int | None = None,
             on_error: OnError | None = None, **options: Any) -> None:
        """End the stream in a sink."""
        if not isinstance(spec, SinkSpec):
            raise ConfigError(f"step {step_id!r}: {spec!r} is not a sink")
        self._then(step_id, "sink", spec, parallelism, on_error, options)
