"""Windows over keyed streams: the windower × clock × aggregator split of Bytewax, with
Flink's accumulator quartet (create, add, merge, result).

- :class:`CountWindow` closes a key's window after ``size`` records (the study's W4).
- :class:`TumblingWindow` and :class:`SlidingWindow` group by time, on processing time
  (:class:`ProcessingTime`) or event time (:class:`EventTime`): event-time windows fire when
  the watermark that reaches the step passes their end (:mod:`rayflow.operators.watermarks`).

Records whose windows have all closed are *late*: they leave on the ``late`` output, counted,
never dropped silently. Window state lives in the step's state backend, so it is part of
every checkpoint. Pure logic: no Ray.

    >>> from rayflow.core.operators import StepContext
    >>> logic = Windowed(CountWindow(2), Count(), key_fn=str).build(StepContext("w", 0, 1))
    >>> [(r.key, r.value) for r in logic.process(["a", "b", "a"], None).items]
    [('a', 2)]
"""

from rayflow.operators.windows.aggregators import Aggregator, Count, MinMax, Reduce, Sum, column
from rayflow.operators.windows.clocks import EventTime, ProcessingTime
from rayflow.operators.windows.logic import Windowed
from rayflow.operators.windows.windowers import (
    CountWindow,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    WindowResult,
    result_times,
)

__all__ = ["Aggregator", "Count", "CountWindow", "EventTime", "MinMax", "ProcessingTime",
           "Reduce", "SessionWindow", "SlidingWindow", "Sum", "TumblingWindow", "WindowResult",
           "Windowed", "column", "result_times"]
