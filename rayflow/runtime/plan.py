"""From the logical graph to physical instances and channels. Pure: no Ray.

Each step becomes ``parallelism`` instances. An edge from step U (m instances) into step D
(n instances) connects instance ``u`` of U to:

- ``forward`` with m == n: instance ``u`` of D only (one-to-one, order kept);
- ``forward`` with m != n: all of D, round-robin by batch (Flink does the same: "rebalance");
- ``rebalance``: all of D, round-robin by batch (by part of a batch when a batch would cost
  an instance more than ``stream.batch_target_s``: see :mod:`rayflow.runtime.channel`);
- ``hash``: all of D, each record to ``stable_hash(key) % n``;
- ``broadcast``: all of D, every batch to every instance.

Each instance of D expects one end-of-stream marker per connected upstream instance.

    >>> from rayflow.dataflow import Dataflow
    >>> from rayflow.connectors.memory import MemorySource, CollectSink
    >>> f = Dataflow("p"); f.source("s", MemorySource([1]), 2).map("m", str, parallelism=3).sink("k", CollectSink())
    >>> plan = make_plan(f)
    >>> plan.expected_eos[("m", 0)], plan.outputs[("s", 0)][0].downstream
    (2, 'm')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rayflow.dataflow import Dataflow, Edge, Partitioning, Step


@dataclass(frozen=True)
class OutEdge:
    """Where one upstream instance sends its output for one downstream step."""

    downstream: str
    partitioning: Partitioning
    target_instances: tuple[int, ...]
    key_fn: Callable[[Any], Any] | None = None
    port: str = "main"


@dataclass
class Plan:
    order: list[str]  # step ids, sources first (topological)
    parallelism: dict[str, int]
    outputs: dict[tuple[str, int], list[OutEdge]] = field(default_factory=dict)
    inputs: dict[tuple[str, int], list[tuple[str, int]]] = field(default_factory=dict)

    @property
    def expected_eos(self) -> dict[tuple[str, int], int]:
        """End-of-stream markers each instance waits for: one per connected upstream."""
        return {k: len(v) for k, v in self.inputs.items()}

    def instances(self):
        for step_id in self.order:
            for i in range(self.parallelism[step_id]):
                yield step_id, i


def make_plan(flow: Dataflow) -> Plan:
    flow.validate()
    steps = {s.step_id: s for s in flow.steps}
    order = _topological(flow)
    par = {s: steps[s].parallelism for s in order}
    plan = Plan(order, par)
    for key in plan.instances():
        plan.outputs[key] = []
        plan.inputs[key] = []
    for step in flow.steps:
        n = step.parallelism
        for edge in step.inputs:
            m = par[edge.upstream]
            kind = edge.partitioning
            if kind == "forward" and m != n:
                kind = "rebalance"
            for u in range(m):
                targets = (u,) if kind == "forward" else tuple(range(n))
                plan.outputs[(edge.upstream, u)].append(
                    OutEdge(step.step_id, kind, targets, edge.key_fn, edge.port)
                )
                for t in targets:
                    plan.inputs[(step.step_id, t)].append((edge.upstream, u))
    return plan


def regions(plan: Plan, coupled: Iterable[str] = ()) -> list[frozenset[tuple[str, int]]]:
    """The failover regions of a plan: sets of instances that exchange no record with any
    other set (the connected components of the instance graph, Flink's pipelined regions).
    A failure inside one region restarts only that region from the last checkpoint; the
    others go on. The instances of a step in ``coupled`` are one region (e.g. file readers
    that share a split enumerator).

        >>> from rayflow.dataflow import Dataflow
        >>> from rayflow.connectors.memory import MemorySource, CollectSink
        >>> f = Dataflow("r"); f.source("s", MemorySource([1]), 2).map("m", str).sink("k", CollectSink(), parallelism=2)
        >>> sorted(sorted(r) for r in regions(make_plan(f)))
        [[('k', 0), ('m', 0), ('s', 0)], [('k', 1), ('m', 1), ('s', 1)]]
        >>> g = Dataflow("r"); g.source("s", MemorySource([1]), 2).key_by(str).sink("k", CollectSink(), parallelism=2)
        >>> len(regions(make_plan(g)))
        1
    """
    parent = {k: k for k in plan.instances()}

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def union(a, b):
        parent[find(a)] = find(b)

    for key, ups in plan.inputs.items():
        for up in ups:
            union(key, up)
    for step_id in coupled:
        for i in range(1, plan.parallelism.get(step_id, 0)):
            union((step_id, 0), (step_id, i))
    out: dict = {}
    for k in plan.instances():
        out.setdefault(find(k), set()).add(k)
    return [frozenset(r) for r in out.values()]


_ACTOR_OPTIONS = ("actor_num_cpus", "scheduling_strategy", "actor_env")


def chains(flow: Dataflow, enabled: bool = True) -> dict[str, str]:
    """Which step each step is chained to: ``{step_id: head step_id}`` (a head maps to itself).

    Step D runs in the actor of its upstream U, instance i with instance i, as in Flink's
    operator chaining, when the edge between them is one-to-one: their parallelism is equal
    and the edge is ``forward`` (any partitioning when both have one instance), both ask for
    the same actor options, and neither opts out (``start_new_chain=True`` on D,
    ``disable_chaining=True`` on either). As in Flink, U may feed other steps too, and the
    edge may leave from a side output (a branch's second stream, late records): U hands each
    chained consumer its batches by a plain call, one after the other, and sends to the
    others through channels. A step of several inputs (a join, a merge) chains too when
    every input is such an edge from the same chain (a join of a branch's two streams): its
    barriers and watermarks come by call, in order, and align at once.

        >>> from rayflow.dataflow import Dataflow
        >>> from rayflow.connectors.memory import MemorySource, CollectSink
        >>> f = Dataflow("c"); s = f.source("s", MemorySource([1])).map("m", str)
        >>> _ = s.key_by(str).map("k", str, parallelism=2).sink("out", CollectSink(), parallelism=2)
        >>> chains(f)
        {'s': 's', 'm': 's', 'k': 'k', 'out': 'k'}
        >>> a, b = f.source("t", MemorySource([1])).branch("b", bool)
        >>> _ = a.merge("u", b.map("n", str)).sink("o2", CollectSink())
        >>> {k: v for k, v in chains(f).items() if k in ("b", "n", "u", "o2")}
        {'b': 't', 'n': 't', 'u': 't', 'o2': 't'}
    """
    steps = {s.step_id: s for s in flow.steps}
    head: dict[str, str] = {}
    for sid in _topological(flow):
        d = steps[sid]
        head[sid] = sid
        if not enabled or d.kind == "source" or not d.inputs:
            continue
        if not all(_one_to_one(steps[e.upstream], d, e) for e in d.inputs):
            continue
        heads = {head[e.upstream] for e in d.inputs}
        if len(heads) == 1:
            head[sid] = heads.pop()
    return head


def _one_to_one(u: Step, d: Step, e: Edge) -> bool:
    """Whether the edge ``e`` from ``u`` to ``d`` may be a plain call inside one actor."""
    if u.kind == "sink" or u.parallelism != d.parallelism:
        return False
    if e.partitioning != "forward" and d.parallelism != 1:
        return False
    if d.options.get("start_new_chain") or d.options.get("disable_chaining") or \
            u.options.get("disable_chaining"):
        return False
    return all(u.options.get(k) == d.options.get(k) for k in _ACTOR_OPTIONS)


def _topological(flow: Dataflow) -> list[str]:
    done: list[str] = []
    seen: set[str] = set()
    pending = list(flow.steps)
    while pending:
        ready = [s for s in pending if all(e.upstream in seen for e in s.inputs)]
        if not ready:
            raise ValueError(f"flow {flow.name!r} has a cycle among {[s.step_id for s in pending]}")
        for s in ready:
            done.append(s.step_id)
            seen.add(s.step_id)
        pending = [s for s in pending if s.step_id not in seen]
    return done
