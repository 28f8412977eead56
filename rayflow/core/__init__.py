"""The contracts every layer shares, pure (no Ray, no connectors):

- :mod:`.operators`: ``StepContext``, ``Logic``, ``OperatorSpec``, ``Output``,
  ``DeadLetter`` (how a step's logic is built and what it returns);
- :mod:`.connectors`: the source, sink and split-enumerator contracts;
- :mod:`.records`: batches and the record and key helpers;
- :mod:`.messages`: what travels in the channels beside the batches (end of stream,
  barriers, watermarks, ticks).
"""
