"""How fast a channel's batches go: pure pacing logic, no Ray (tested without it).

- :func:`window_calls`: how many calls a channel may have in flight (buffer debloating);
- :class:`BatchSizer`: a source's batch size, fitted to ``stream.batch_target_s``;
- :class:`CallPace`: the cost of a receiver's call, fitted to the last few, and how many
  rows the next part may carry;
- :func:`deal` and :func:`least_loaded`: a rebalanced batch dealt in parts to the least
  loaded instances.

:mod:`rayflow.runtime.channel` applies them to the push channels.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator


def window_calls(max_calls: int, target_s: float, service_s: float) -> int:
    """How many calls a channel may have in flight: ``max_calls``, fewer when the receiver
    takes long per call, so that at most about ``target_s`` of work waits there (and a
    barrier behind it waits no longer); at least 2, so the receiver never idles between
    calls.

        >>> window_calls(16, 0.25, 0.001), window_calls(16, 0.25, 0.05), window_calls(16, 0.25, 1.0)
        (16, 5, 2)
        >>> window_calls(16, 0.0, 1.0)  # debloating off
        16
    """
    if target_s <= 0 or service_s <= 0:
        return max_calls
    return max(2, min(max_calls, int(target_s / service_s)))


class BatchSizer:
    """How many records a source puts in one batch: at most ``batch_size``, and at most what
    the job moves in about half of ``target_s`` (its rate over the last half second), so
    that one batch costs each step a fraction of the channel target, and a barrier behind a
    few batches still passes quickly. Pure: the source loop feeds it what it sent.

        >>> s = BatchSizer(16384, 0.25, now=0.0)
        >>> s.limit
        16384
        >>> s.sent(16384, now=0.2), s.sent(16384, now=1.0)   # 32768 records in 1 s
        (16384, 4096)
        >>> BatchSizer(16384, 0.0, now=0.0).sent(10, now=5.0)  # no target: fixed
        16384
    """

    WINDOW_S = 0.5

    def __init__(self, batch_size: int, target_s: float, now: float):
        self.batch_size, self.target_s = batch_size, target_s
        self.limit = batch_size
        self._t0, self._rows = now, 0

    def sent(self, rows: int, now: float) -> int:
        """``rows`` left in one batch at ``now``; returns the limit for the next one."""
        self._rows += rows
        if self.target_s > 0 and now - self._t0 >= self.WINDOW_S:
            rate = self._rows / (now - self._t0)
            self.limit = max(1, min(self.batch_size, int(rate * self.target_s / 2)))
            self._t0, self._rows = now, 0
        return self.limit


class CallPace:
    """How many records one call to a receiver may carry, from how long its calls took.

    The cost of a call is modelled as ``fixed_s + per_record_s * rows``, fitted (least
    squares) to the last :attr:`SAMPLES` completed calls, and a part carries what costs about
    ``target_s``, or twice the fixed cost when that is more, so that the fixed cost never
    takes more than half a call: a receiver that pays a lot per call (a flush, a request)
    keeps large batches. Every :attr:`PROBE`-th part is twice as large, so that the sizes
    differ enough to tell the two costs apart. The first call is left out (warm-up), so until
    a second one completed, a part carries :attr:`FIRST_ROWS`. Pure: the channel feeds it the
    durations the receiver reports.

        >>> p = CallPace(0.1)
        >>> p.rows()                       # nothing measured yet
        512
        >>> p.observe(512, 5.0)            # the first call: warm-up, not counted
        >>> p.rows()
        512
        >>> p.observe(64, 0.064)           # 1 ms a record
        >>> [p.next_part() for _ in range(4)]   # the fourth is a probe
        [100, 100, 100, 200]
        >>> p.observe(100, 0.1); p.observe(200, 0.2)
        >>> round(p.per_record_s, 6), round(p.fixed_s, 6), p.rows()
        (0.001, 0.0, 100)
        >>> f = CallPace(0.1)              # 0.2 s a call, whatever its size
        >>> f.observe(512, 5.0); f.observe(64, 0.2); f.observe(32, 0.2)
        >>> f.fixed_s, f.rows()            # splitting cannot help: no limit
        (0.2, None)
        >>> CallPace(0.0).rows() is None   # off: batches go whole
        True
    """

    SAMPLES = 8
    FIRST_ROWS = 512
    # a batch goes in parts only when it would cost the receiver more than this many targets
    # (a second at the default 0.1 s): smaller calls cost every step a fixed share (a Ray call,
    # per-key work), and on a busy machine a call's measured time also holds the time its
    # process waited for a core, so cutting finer than that costs more than it spreads
    ENGAGE = 10
    # and only for a receiver slower than this a record (a sleep, a request, a model call):
    # a fast one's parts would only cut the batches of the keyed steps after it, whose cost
    # per call grows with the keys it holds, not with its records (the W4 word count: 2.3x
    # slower at parallelism 2 with parts)
    SLOW_RECORD_S = 1e-4
    PROBE = 4
    SPREAD = 1.5  # sizes this far apart (max / min) let the fit tell fixed from per-record

    def __init__(self, target_s: float):
        self.target_s = target_s
        self.fixed_s = 0.0
        self.per_record_s: float | None = None  # None: no call measured yet
        self._calls: deque = deque(maxlen=self.SAMPLES)  # (rows, seconds)
        self._parts = 0
        self._warm = False  # the first call was seen (and left out)
        self.blind = False  # the receiver does not report its time: no pace to wait for

    def observe(self, rows: int, seconds: float) -> None:
        """A call of ``rows`` records took the receiver ``seconds``. The first call is not
        counted: it pays the receiver's warm-up (imports, first connections downstream),
        which made fast steps look slow."""
        if rows <= 0 or seconds < 0:
            return
        if not self._warm:
            self._warm = True
            return
        self._calls.append((rows, seconds))
        ns = [float(n) for n, _ in self._calls]
        ds = [d for _, d in self._calls]
        k = len(ns)
        if max(ns) >= self.SPREAD * min(ns):
            mn, md = sum(ns) / k, sum(ds) / k
            slope = sum((n - mn) * (d - md) for n, d in zip(ns, ds)) / \
                sum((n - mn) ** 2 for n in ns)
            fixed = md - slope * mn
            if slope <= 0:  # all fixed cost (within the noise)
                self.fixed_s, self.per_record_s = md, 0.0
            elif fixed < 0:  # all per-record cost
                self.fixed_s, self.per_record_s = 0.0, sum(ds) / sum(ns)
            else:
                self.fixed_s, self.per_record_s = fixed, slope
        else:  # one size: the fixed cost as last fitted, the rest per record
            self.per_record_s = max(0.0, (sum(ds) - k * self.fixed_s) / sum(ns))

    def rows(self) -> int | None:
        """Records one call should carry; None: no limit."""
        if self.target_s <= 0:
            return None
        if self.per_record_s is None:
            return self.FIRST_ROWS
        if self.per_record_s <= 0:
            return None
        budget = max(self.target_s - self.fixed_s, self.fixed_s)
        return max(1, int(budget / self.per_record_s * (1 + 1e-9)))  # (not 99.99999 -> 99)

    def next_part(self) -> int | None:
        """Records for the part that goes next: :meth:`rows`, or twice that for a probe."""
        n = self.rows()
        if n is None or self.per_record_s is None:
            return n
        self._parts += 1
        return 2 * n if self._parts % self.PROBE == 0 else n


def deal(n: int, rows_for: Callable[[int, int], int | None],
         choose: Callable[[], int] = lambda: 0) -> Iterator[tuple[int, int, int]]:
    """The parts of a batch of ``n`` records: ``(channel, lo, hi)``, consecutive records,
    each to the channel ``choose()`` names and at most what ``rows_for(channel, left)`` says
    for the ``left`` records still to go (None: no limit), both asked just before the part
    goes, so they see the latest calls. Records keep their order within each channel.

        >>> rr = iter([1, 0, 1])
        >>> list(deal(10, lambda c, left: {0: 4, 1: 3}[c], lambda: next(rr)))
        [(1, 0, 3), (0, 3, 7), (1, 7, 10)]
        >>> list(deal(10, lambda c, left: None))   # no limit: one part
        [(0, 0, 10)]
    """
    lo = 0
    while lo < n:
        ch = choose()
        most = rows_for(ch, n - lo)
        hi = n if most is None else min(n, lo + max(1, most))
        yield ch, lo, hi
        lo = hi


def least_loaded(loads: list[int], start: int) -> int:
    """The channel with the least load (the channels pass their records in flight); among
    equals, the first from ``start`` on (round-robin order), so equal receivers take turns
    and a slower one gets fewer parts.

        >>> least_loaded([2, 1, 1], 0), least_loaded([2, 1, 1], 2), least_loaded([0, 0], 1)
        (1, 2, 1)
    """
    k = len(loads)
    return min(range(start, start + k), key=lambda i: loads[i % k]) % k
