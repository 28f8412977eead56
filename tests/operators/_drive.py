"""Helpers for operator tests without Ray: out-of-order input from several partitions, fed
in rounds with the watermark of each round (the minimum over the partitions), and the same
through a restore or a rescale."""

from __future__ import annotations

import math

import numpy as np

from rayflow.core.operators import Rescaled, StepContext, owns


def partitions(records, parts=3, delay=2.0, seed=0, time=lambda r: r[1]):
    """``records`` spread over ``parts`` partitions, each roughly in time order but out of
    order by up to ``delay`` (as a source with ``max_delay_s=delay`` allows)."""
    rng = np.random.default_rng(seed)
    out = [[] for _ in range(parts)]
    for r in records:
        out[int(rng.integers(0, parts))].append(r)
    return [sorted(p, key=lambda r: time(r) + rng.uniform(0, delay)) for p in out]


def rounds(parts, step=17, delay=2.0, time=lambda r: r[1]):
    """``(batch, times, watermark after it)`` per round: one batch of each partition in
    turn, the watermark being min over partitions of (largest time seen - delay)."""
    top = [-math.inf] * len(parts)
    n = max(len(p) for p in parts)
    for lo in range(0, n, step):
        for i, p in enumerate(parts):
            part = p[lo:lo + step]
            if not part:
                top[i] = math.inf
                continue
            top[i] = max(top[i], max(time(r) for r in part))
            if lo + step >= len(p):
                top[i] = math.inf
            yield part, np.array([time(r) for r in part]), min(top) - delay


def collect(out, into):
    if out is not None:
        into.extend(out.items)


def run_logic(logic, feed, index=None):
    """Feed ``(batch, times, watermark)`` rounds (with an input ``index`` each when
    ``index`` is a list); returns every output record, late ones excluded."""
    got = []
    for n, (batch, times, wm) in enumerate(feed):
        if index is None:
            collect(logic.process(batch, times), got)
        else:
            collect(logic.process_input(index[n], batch, times), got)
        if wm > -math.inf:
            collect(logic.on_watermark(wm), got)
    collect(logic.on_end(), got)
    return got


def ctx_for(backend, step="s", instance=0, parallelism=1):
    return StepContext(step, instance, parallelism, "test", backend)


def rescaled_run(spec, backend, first, rest, key_of, new_parallelism=3, index=None):
    """Run ``first`` rounds on one instance, snapshot, rescale to ``new_parallelism``
    instances that each take the keys they own, and feed them ``rest`` (each record to its
    key's owner, every watermark to all). Returns all output records."""
    one = spec.build(ctx_for(backend))
    got = []
    for n, (batch, times, wm) in enumerate(first):
        out = (one.process(batch, times) if index is None
               else one.process_input(index[n], batch, times))
        collect(out, got)
        if wm > -math.inf:
            collect(one.on_watermark(wm), got)
    handle = one.snapshot()
    resumed = Rescaled((handle,), 1)
    many = [spec.build(ctx_for(backend, instance=i, parallelism=new_parallelism), resumed)
            for i in range(new_parallelism)]
    offset = len(first)
    for n, (batch, times, wm) in enumerate(rest):
        for logic in many:
            mine = [j for j, r in enumerate(batch) if owns(key_of(r, n + offset), logic.ctx)]
            if mine:
                part = [batch[j] for j in mine]
                out = (logic.process(part, times[mine]) if index is None
                       else logic.process_input(index[n + offset], part, times[mine]))
                collect(out, got)
            if wm > -math.inf:
                collect(logic.on_watermark(wm), got)
    for logic in many:
        collect(logic.on_end(), got)
    return got


def two_inputs(left_parts, right_parts, step=17, delay=2.0, time=lambda r: r[1]):
    """Rounds of two inputs, alternating, each round's watermark the minimum of both: as
    ``(index, batch, times, watermark)``; ``index`` lists the input of each round (for
    :func:`run_logic` and :func:`rescaled_run`)."""
    import itertools

    a = list(rounds(left_parts, step, delay, time))
    b = list(rounds(right_parts, step, delay, time))
    feed, index = [], []
    wm = [-math.inf, -math.inf]
    for ra, rb in itertools.zip_longest(a, b):
        for i, r in ((0, ra), (1, rb)):
            if r is None:
                wm[i] = math.inf
                continue
            wm[i] = r[2]
            feed.append((r[0], r[1], min(wm)))
            index.append(i)
    return feed, index


def run_each_watermark(logic, left_parts, right_parts, step=17, delay=2.0,
                       time=lambda r: r[1]):
    """Two inputs in alternating rounds as :func:`two_inputs`, with each input's own
    watermark given to ``on_input_watermark`` before the step's (the minimum of both) goes
    to ``on_watermark``, as the runtime does. Returns ``(every output record, how many were
    emitted before the step's watermark had passed their time)``."""
    import itertools

    a = list(rounds(left_parts, step, delay, time))
    b = list(rounds(right_parts, step, delay, time))
    got, early, wm = [], 0, [-math.inf, -math.inf]
    for ra, rb in itertools.zip_longest(a, b):
        for i, r in ((0, ra), (1, rb)):
            if r is None:
                wm[i] = math.inf
                collect(logic.on_input_watermark(i, math.inf), got)
                continue
            out = logic.process_input(i, r[0], r[1])
            if out.items:
                early += int(np.sum(out.event_times >= min(wm)))
            collect(out, got)
            wm[i] = r[2]
            before = len(got)
            one = logic.on_input_watermark(i, r[2])
            collect(one, got)
            if one is not None and one.items:
                early += int(np.sum(one.event_times >= min(wm)))
            assert len(got) - before == (0 if one is None else len(one.items))
            if min(wm) > -math.inf:
                collect(logic.on_watermark(min(wm)), got)
    collect(logic.on_end(), got)
    return got, early


def sessions_reference(records, gap):
    """Plain-Python sessions of ``(key, t, _)`` records: ``Counter((key, count, last t))``
    per session, a session ending where two of its key's times are more than ``gap`` apart."""
    from collections import Counter, defaultdict

    by_key = defaultdict(list)
    for k, t, _ in records:
        by_key[k].append(t)
    want: Counter = Counter()
    for k, ts in by_key.items():
        ts.sort()
        n, prev = 0, ts[0]
        for t in ts:
            if t - prev > gap:
                want[(k, n, prev)] += 1
                n = 0
            n, prev = n + 1, t
        want[(k, n, prev)] += 1
    return want


def lookup_reference(stream, table, how="inner"):
    """Plain-Python temporal join: each ``(key, t, ...)`` record of ``stream`` with the
    latest version of its key in ``table`` at or before ``t`` (``how="left"``: or None)."""
    import bisect
    from collections import Counter, defaultdict

    versions = defaultdict(list)
    for v in sorted(table, key=lambda v: v[1]):
        versions[v[0]].append(v)
    want: Counter = Counter()
    for r in stream:
        vs = versions.get(r[0], [])
        i = bisect.bisect_right([v[1] for v in vs], r[1])
        if i:
            want[(r[0], r, vs[i - 1])] += 1
        elif how == "left":
            want[(r[0], r, None)] += 1
    return want
