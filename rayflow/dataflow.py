"""The logical dataflow: steps with ids, wired into streams. Pure Python, no Ray.

    >>> from rayflow import Dataflow, MemorySource, CollectSink
    >>> flow = Dataflow("example")
    >>> words = flow.source("lines", MemorySource(["a b", "c"])).flat_map("split", str.split)
    >>> words.key_by(lambda w: w).map("upper", str.upper, parallelism=2).sink("out", CollectSink())
    >>> [s.step_id for s in flow.steps]
    ['lines', 'split', 'upper', 'out']
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rayflow.config import STEP_OPTIONS, validate_step_options
from rayflow.core.connectors import SinkSpec, SourceSpec
from rayflow.core.operators import OperatorSpec
from rayflow.core.records import Field
from rayflow.errors import ConfigError
from rayflow.operators.stateless import Filter, FlatMap, Inspect, Map, MapBatches

Partitioning = Literal["forward", "rebalance", "hash", "broadcast"]
OnError = Literal["raise", "dead_letter"]
_STEP_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _caller_keywords() -> tuple[str, tuple[str, ...]]:
    """The public method of this module that is adding a step (``map``...), and its own
    keyword arguments, for an error about an unknown option to name them."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename == __file__ and not code.co_name.startswith("_"):
            named = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
            return code.co_name, tuple(n for n in named if n not in ("self", "step_id"))
        frame = frame.f_back
    return "", ()


def _user_fn(step_id: str, method: str, fn: Any) -> Any:
    """``fn``, where it is callable: else a ConfigError naming the step and the method."""
    if not callable(fn):
        raise ConfigError(f"step {step_id!r}: {method}() needs a function, got {fn!r}")
    return fn


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
    watermarks: Any = None  # sources: an EventTime, how the source makes watermarks


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
        self, step_id: str, spec: SourceSpec, parallelism: int = 1, *,
        watermarks: Any = None, **options: Any
    ) -> Stream:
        """Add a source step and return its output stream.

        ``watermarks=EventTime(timestamp, max_delay_s, idle_timeout_s)`` makes the source
        track event time per split (Kafka partition) and send watermarks downstream, in order
        with the data; event-time windows, joins and timers fire on them."""
        from rayflow.operators.windows import EventTime

        if not isinstance(spec, SourceSpec):
            raise ConfigError(f"step {step_id!r}: {spec!r} is not a source")
        if watermarks is not None and not isinstance(watermarks, EventTime):
            raise ConfigError(f"step {step_id!r}: watermarks must be an EventTime(...), got "
                              f"{watermarks!r}")
        self._add(Step(step_id, "source", spec, parallelism, (), None, options, watermarks))
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
        # a misspelt option must fail here, not be dropped by the runtime
        step = dataclasses.replace(step, options=validate_step_options(
            step.step_id, step.options,
            *(_caller_keywords() if set(step.options) - set(STEP_OPTIONS) else ("", ()))))
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
        for s in steps:
            if getattr(s.spec, "event_time", False) and not self._watermarked(s.step_id):
                raise ConfigError(
                    f"step {s.step_id!r} runs on event time, but no source upstream of it "
                    f"makes watermarks: add watermarks=EventTime(max_delay_s=...) to the "
                    f"source, e.g. flow.source(step_id, spec, watermarks=EventTime(...))"
                )

    def _watermarked(self, step_id: str) -> bool:
        """Whether a source upstream of ``step_id`` makes watermarks."""
        seen, todo = set(), [step_id]
        while todo:
            step = self._steps[todo.pop()]
            if step.kind == "source" and step.watermarks is not None:
                return True
            for e in step.inputs:
                if e.upstream not in seen:
                    seen.add(e.upstream)
                    todo.append(e.upstream)
        return False

    def run(self, **kwargs: Any):
        """Run to completion and return the finished job (see :func:`rayflow.run`)."""
        import rayflow  # the package's facade runs it: the API layer never names the runtime

        return rayflow.run(self, **kwargs)


class Stream:
    """The output of a step; each method adds a downstream step and returns its stream."""

    def __init__(
        self, flow: Dataflow, step_id: str, partitioning: Partitioning = "forward",
        key_fn: Callable[[Any], Any] | None = None, port: str = "main",
    ):
        self.flow, self.step_id = flow, step_id
        self._partitioning, self._key_fn, self._port = partitioning, key_fn, port

    def _then(
        self, step_id: str, kind: Literal["source", "operator", "sink"], spec: Any,
        parallelism: int | None,
        on_error: OnError | None, options: dict,
    ) -> Stream:
        if parallelism is None:
            parallelism = self.flow.step(self.step_id).parallelism
        edge = Edge(self.step_id, self._partitioning, self._key_fn, self._port)
        self.flow._add(Step(step_id, kind, spec, parallelism, (edge,), on_error, options))
        return Stream(self.flow, step_id)

    def _edge(self) -> Edge:
        return Edge(self.step_id, self._partitioning, self._key_fn, self._port)

    def _inputs_with(self, step_id: str, what: str, others: tuple) -> tuple[Edge, ...]:
        """The edges of a step reading this stream and ``others``."""
        edges = [self._edge()]
        for o in others:
            if not isinstance(o, Stream) or o.flow is not self.flow:
                raise ConfigError(f"step {step_id!r}: {what}() takes streams of flow "
                                  f"{self.flow.name!r}, got {o!r}")
            edges.append(o._edge())
        seen: set[str] = set()
        for e in edges:
            if e.upstream in seen:
                raise ConfigError(
                    f"step {step_id!r}: {what}() reads step {e.upstream!r} twice; a step "
                    f"takes each upstream step once (put a map step on one of the paths)")
            seen.add(e.upstream)
        return tuple(edges)

    def merge(self, step_id: str, *others: Stream, parallelism: int | None = None,
              **options: Any) -> Stream:
        """The union of this stream and ``others`` (Flink's ``union``), whatever their
        parallelism. Each input keeps its own partitioning (``key_by`` before ``merge`` keys
        that input). Event time: the merged stream's watermark is the minimum of its inputs'.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> f = Dataflow("u")
            >>> a, b = f.source("a", MemorySource([1, 2])), f.source("b", MemorySource([3]))
            >>> a.merge("both", b).sink("out", CollectSink())
        """
        from rayflow.operators.stateless import Union

        if not others:
            raise ConfigError(f"step {step_id!r}: merge() needs at least one other stream")
        edges = self._inputs_with(step_id, "merge", others)
        if parallelism is None:
            parallelism = self.flow.step(self.step_id).parallelism
        self.flow._add(Step(step_id, "operator", Union(), parallelism, edges, None, options))
        return Stream(self.flow, step_id)

    def branch(self, step_id: str, predicate: Callable[[Any], bool], *,
               parallelism: int | None = None, on_error: OnError | None = None,
               **options: Any) -> tuple[Stream, Stream]:
        """Split the stream in two: ``(records where predicate is true, the rest)``.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> f = Dataflow("b")
            >>> even, odd = f.source("in", MemorySource([1, 2, 3])).branch("even", lambda x: x % 2 == 0)
            >>> even.sink("evens", CollectSink()); odd.sink("odds", CollectSink())
        """
        from rayflow.operators.stateless import BRANCH_REST, Branch

        out = self._then(step_id, "operator", Branch(_user_fn(step_id, "branch", predicate)),
                         parallelism, on_error, options)
        return out, out.side(BRANCH_REST)

    def _keyed_pair(self, step_id: str, what: str, right: Any) -> tuple[Edge, ...]:
        edges = self._inputs_with(step_id, what, (right,))
        for side, e in zip(("left", "right"), edges):
            if e.partitioning != "hash" or e.key_fn is None:
                raise ConfigError(f"step {step_id!r}: {what}() needs both streams keyed; "
                                  f"call key_by(...) on the {side} one")
        return edges

    def join(self, step_id: str, right: Stream, window: Any,
             how: Literal["inner", "left", "outer"] = "inner", *,
             clock: Any = None, ttl_s: float | None = None, parallelism: int | None = None,
             **options: Any) -> Stream:
        """Window join: pair this stream's records with ``right``'s of the same key in the
        same window (tumbling, sliding or session); emits ``(key, left, right)``. ``how``:
        ``inner``, ``left`` (unmatched left records as ``(key, left, None)``) or ``outer``
        (also ``(key, None, right)``). Both streams need :meth:`key_by`.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> from rayflow.operators.windows import TumblingWindow
            >>> f = Dataflow("j")
            >>> a = f.source("a", MemorySource([("k", 1)])).key_by(lambda r: r[0])
            >>> b = f.source("b", MemorySource([("k", 2)])).key_by(lambda r: r[0])
            >>> a.join("ab", b, TumblingWindow(60.0)).sink("out", CollectSink())
        """
        from rayflow.operators.joins import WindowJoin
        from rayflow.operators.windows import ProcessingTime

        edges = self._keyed_pair(step_id, "join", right)
        _check_clock(step_id, clock)
        try:
            # _keyed_pair checked that both key functions are set
            keys = edges[0].key_fn, edges[1].key_fn
            spec = WindowJoin(window, how, *keys, clock or ProcessingTime(),  # type: ignore[arg-type]
                              ttl_s)
        except ValueError as exc:
            raise ConfigError(f"step {step_id!r}: {exc}") from None
        return self._add_multi(step_id, spec, edges, parallelism, options)

    def interval_join(self, step_id: str, right: Stream, lower_s: float, upper_s: float, *,
                      clock: Any = None, ttl_s: float | None = None,
                      parallelism: int | None = None, **options: Any) -> Stream:
        """Interval join on event time: pairs ``(key, left, right)`` of equal keys with
        ``left.t + lower_s <= right.t <= left.t + upper_s``, emitted as soon as both have
        arrived; the watermark drops what can no longer match. Both streams need
        :meth:`key_by` and watermarks from their sources."""
        from rayflow.operators.joins import IntervalJoin
        from rayflow.operators.windows import EventTime

        edges = self._keyed_pair(step_id, "interval_join", right)
        _check_clock(step_id, clock)
        try:
            keys = edges[0].key_fn, edges[1].key_fn  # both set: _keyed_pair checked them
            spec = IntervalJoin(lower_s, upper_s, *keys, clock or EventTime(),  # type: ignore[arg-type]
                                ttl_s)
        except ValueError as exc:
            raise ConfigError(f"step {step_id!r}: {exc}") from None
        return self._add_multi(step_id, spec, edges, parallelism, options)

    def lookup_join(self, step_id: str, table: Stream, *, how: str = "inner",
                    clock: Any = None, ttl_s: float | None = None,
                    parallelism: int | None = None, **options: Any) -> Stream:
        """Join each record with the latest value of its key in ``table``, a changelog
        stream whose records each set their key's value; emits ``(key, record, value)``.
        ``clock=ProcessingTime()`` (default): the value that has arrived when the record is
        processed. ``clock=EventTime()``: the value as of the record's event time (Flink's
        temporal join; deterministic whatever the interleaving, at the cost of waiting for
        the watermark). ``how``: ``inner`` (drop records without a value) or ``left`` (emit
        them with None). Both streams need :meth:`key_by`.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> f = Dataflow("l")
            >>> rates = f.source("rates", MemorySource([("eur", 1.1)])).key_by(lambda r: r[0])
            >>> orders = f.source("orders", MemorySource([("eur", 10)])).key_by(lambda r: r[0])
            >>> orders.lookup_join("priced", rates).sink("out", CollectSink())
        """
        from rayflow.operators.lookup import LookupJoin
        from rayflow.operators.windows import ProcessingTime

        edges = self._keyed_pair(step_id, "lookup_join", table)
        _check_clock(step_id, clock)
        try:
            keys = edges[0].key_fn, edges[1].key_fn  # both set: _keyed_pair checked them
            spec = LookupJoin(*keys, how, clock or ProcessingTime(), ttl_s)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigError(f"step {step_id!r}: {exc}") from None
        return self._add_multi(step_id, spec, edges, parallelism, options)

    def enrich_cached(self, step_id: str, fn: Callable[[Any], Any], ttl_s: float, *,
                      batch: bool = False, parallelism: int | None = None,
                      on_error: OnError | None = None, **options: Any) -> Stream:
        """Look each record's key up with ``fn(key)`` (a database, a service) and emit
        ``(key, record, value)``; values are cached per key for ``ttl_s`` seconds, so ``fn``
        runs once per key and ``ttl_s``, not once per record. ``batch=True``: ``fn`` takes
        the list of a batch's uncached keys and returns their values (a list in the same
        order, or a dict). A key whose lookup raises sends its records to the dead letters.
        Needs a preceding :meth:`key_by` (each instance caches the keys it owns)."""
        from rayflow.operators.lookup import EnrichCached

        if self._partitioning != "hash" or self._key_fn is None:
            raise ConfigError(f"step {step_id!r}: enrich_cached() needs key_by(...) before it")
        try:
            spec = EnrichCached(_user_fn(step_id, "enrich_cached", fn), self._key_fn, ttl_s,
                                batch)
        except ValueError as exc:
            raise ConfigError(f"step {step_id!r}: {exc}") from None
        return self._then(step_id, "operator", spec, parallelism, on_error, options)

    def _add_multi(self, step_id: str, spec: Any, edges: tuple[Edge, ...],
                   parallelism: int | None, options: dict) -> Stream:
        if parallelism is None:
            parallelism = self.flow.step(self.step_id).parallelism
        self.flow._add(Step(step_id, "operator", spec, parallelism, edges, None, options))
        return Stream(self.flow, step_id)

    def key_by(self, key_fn: Callable[[Any], Any] | str) -> Stream:
        """Partition the next step's input by ``key_fn(record)``: records with equal keys go to
        the same instance. For numpy batches ``key_fn`` gets the whole batch and returns one key
        per row. A string names a field (:class:`~rayflow.core.records.Field`): on Arrow batches the
        key column is then hashed and windowed vectorized, not record by record."""
        if isinstance(key_fn, str):
            key_fn = Field(key_fn)
        elif not callable(key_fn):
            raise ConfigError(f"key_by() after step {self.step_id!r} needs a function or a "
                              f"field name, got {key_fn!r}")
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
               ttl_s: float | None = None, parallelism: int | None = None,
               on_error: OnError | None = None, **options: Any) -> Stream:
        """Aggregate each key's records per window; emits :class:`WindowResult` records.
        Needs a preceding :meth:`key_by`. Late records leave on ``.side("late")``.
        ``ttl_s``: a key without records for that long (processing time) loses its state,
        open windows included (counted as ``state_expired`` in the step's metrics).

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
        _check_clock(step_id, clock)
        try:
            spec = Windowed(windower, aggregator, self._key_fn, clock or ProcessingTime(), ttl_s)
        except ValueError as exc:
            raise ConfigError(f"step {step_id!r}: {exc}") from None
        return self._then(step_id, "operator", spec, parallelism, on_error, options)

    def stateful_map(self, step_id: str, fn: Callable[[Any, Any], tuple[Any, Any]], *,
                     ttl_s: float | None = None, parallelism: int | None = None,
                     on_error: OnError | None = None, **options: Any) -> Stream:
        """Keep one state per key: ``fn(state, value) -> (state, output)`` per record
        (``state`` is None for a new key; return a state of None to drop the key). Emits
        ``(key, output)``. Needs a preceding :meth:`key_by`; the state is checkpointed.
        ``ttl_s``: drop the state of a key without records for that long.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> f = Dataflow("s")
            >>> (f.source("in", MemorySource(["a", "b", "a"])).key_by(str)
            ...   .stateful_map("seen", lambda n, w: ((n or 0) + 1, (n or 0) + 1))
            ...   .sink("out", CollectSink()))
        """
        from rayflow.operators.stateful import StatefulMap

        if self._partitioning != "hash" or self._key_fn is None:
            raise ConfigError(f"step {step_id!r}: stateful_map() needs key_by(...) before it")
        try:
            spec = StatefulMap(_user_fn(step_id, "stateful_map", fn), self._key_fn, ttl_s)
        except ValueError as exc:
            raise ConfigError(f"step {step_id!r}: {exc}") from None
        return self._then(step_id, "operator", spec, parallelism, on_error, options)

    def stateful_map_batches(self, step_id: str, fn: Callable[[Any, list], tuple[Any, Any]],
                             *, ttl_s: float | None = None, parallelism: int | None = None,
                             on_error: OnError | None = None, **options: Any) -> Stream:
        """Keep one state per key, updated once per key and batch: ``fn(state, values) ->
        (state, outputs)``, where ``values`` are the key's records of the batch in order
        (``state`` is None for a new key; a state of None drops the key). Emits ``(key,
        output)`` for each of ``outputs``, keys in the order of their first record, at the
        latest event time of the key's records. One call, one state read and one write per
        key and batch, where :meth:`stateful_map` makes them per record (Bytewax's
        ``stateful_batch``, Spark's ``flatMapGroupsWithState``). Which records share a
        batch is not fixed (it differs after a failure), so ``fn`` should emit what does
        not depend on it, such as the key's result so far. Needs a preceding
        :meth:`key_by`; ``ttl_s`` as for :meth:`stateful_map`.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> f = Dataflow("b")
            >>> (f.source("in", MemorySource([3, 1, 2])).key_by(lambda x: "all")
            ...   .stateful_map_batches("max", lambda m, xs: (max([m or 0, *xs]), ()))
            ...   .sink("out", CollectSink()))
        """
        from rayflow.operators.stateful import StatefulMapBatches

        if self._partitioning != "hash" or self._key_fn is None:
            raise ConfigError(f"step {step_id!r}: stateful_map_batches() needs key_by(...) "
                              f"before it")
        try:
            spec = StatefulMapBatches(_user_fn(step_id, "stateful_map_batches", fn),
                                      self._key_fn, ttl_s)
        except ValueError as exc:
            raise ConfigError(f"step {step_id!r}: {exc}") from None
        return self._then(step_id, "operator", spec, parallelism, on_error, options)

    def process(self, step_id: str, fn: Any, *, ttl_s: float | None = None,
                parallelism: int | None = None, on_error: OnError | None = None,
                **options: Any) -> Stream:
        """A keyed process function (Flink's ``KeyedProcessFunction``): per record
        ``fn.process_element(value, ctx)``, per due timer ``fn.on_timer(key, ts, ctx)``;
        both yield output records. ``ctx.state`` is the key's value state (``value()``,
        ``update(v)``, ``clear()``), ``ctx.timers.register(event_time=...)`` or
        ``register(processing_time=...)`` / ``delete(...)`` its timers, checkpointed with
        the state. ``fn``: an object with those methods
        (:class:`~rayflow.operators.process.KeyedProcessFunction`), a pair
        ``(process_element, on_timer)``, or one callable. Needs a preceding :meth:`key_by`.
        ``ttl_s``: drop a key's state and timers after that long without its records.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> f = Dataflow("p")
            >>> def first(word, ctx):  # each word once
            ...     if ctx.state.value() is None:
            ...         ctx.state.update(True)
            ...         yield word
            >>> f.source("in", MemorySource(["a", "b", "a"])).key_by(str).process(
            ...     "first", first).sink("out", CollectSink())
        """
        from rayflow.operators.process import Process

        if self._partitioning != "hash" or self._key_fn is None:
            raise ConfigError(f"step {step_id!r}: process() needs key_by(...) before it")
        try:
            spec = Process(fn, self._key_fn, ttl_s)
        except ValueError as exc:
            raise ConfigError(f"step {step_id!r}: {exc}") from None
        return self._then(step_id, "operator", spec, parallelism, on_error, options)

    def map(self, step_id: str, fn: Callable[[Any], Any], *, parallelism: int | None = None,
            on_error: OnError | None = None, **options: Any) -> Stream:
        """Apply ``fn`` to every record.

        Example:
            >>> from rayflow import Dataflow, MemorySource, CollectSink
            >>> f = Dataflow("m"); f.source("in", MemorySource([1, 2])).map("sq", lambda x: x * x).sink("out", CollectSink())
        """
        return self._then(step_id, "operator", Map(_user_fn(step_id, "map", fn)),
                          parallelism, on_error, options)

    def flat_map(self, step_id: str, fn: Callable[[Any], Any], *, parallelism: int | None = None,
                 on_error: OnError | None = None, **options: Any) -> Stream:
        """Apply ``fn`` to every record and emit each element of the iterable it returns."""
        return self._then(step_id, "operator", FlatMap(_user_fn(step_id, "flat_map", fn)),
                          parallelism, on_error, options)

    def filter(self, step_id: str, fn: Callable[[Any], bool], *, parallelism: int | None = None,
               on_error: OnError | None = None, **options: Any) -> Stream:
        """Keep the records for which ``fn`` returns true."""
        return self._then(step_id, "operator", Filter(_user_fn(step_id, "filter", fn)),
                          parallelism, on_error, options)

    def inspect(self, step_id: str, fn: Callable[[Any], Any], *, parallelism: int | None = None,
                **options: Any) -> Stream:
        """Call ``fn`` on every record for its side effect (logging); records pass through."""
        return self._then(step_id, "operator", Inspect(_user_fn(step_id, "inspect", fn)),
                          parallelism, None, options)

    def map_batches(self, step_id: str, fn: Callable[[Any], Any], *,
                    parallelism: int | None = None, on_error: OnError | None = None,
                    **options: Any) -> Stream:
        """Apply ``fn`` to a whole batch (a list, numpy array or Arrow table): the fast path
        for columnar work."""
        return self._then(step_id, "operator", MapBatches(_user_fn(step_id, "map_batches", fn)),
                          parallelism, on_error, options)

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


def _check_clock(step_id: str, clock: Any) -> None:
    from rayflow.operators.windows import EventTime, ProcessingTime

    if clock is not None and not isinstance(clock, (EventTime, ProcessingTime)):
        raise ConfigError(f"step {step_id!r}: clock must be ProcessingTime() or EventTime(), "
                          f"got {clock!r}")
    if isinstance(clock, EventTime) and clock.sets_watermarks:
        raise ConfigError(
            f"step {step_id!r}: max_delay_s and idle_timeout_s belong to the source, which "
            f"makes the watermarks per split: flow.source(..., watermarks=EventTime("
            f"max_delay_s=...)); on the step use clock=EventTime() or EventTime(timestamp=...)"
        )
