"""What both Kafka sink writers share: stamping, serializing, oversize records to the
dead-letter output, and the plain (at-least-once, at-most-once) writer itself."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rayflow.core.connectors import SinkWriter
from rayflow.core.operators import DeadLetter, StepContext
from rayflow.core.records import brief

if TYPE_CHECKING:
    from rayflow.connectors.kafka.sink import KafkaSink


def _to_bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    raise TypeError(f"KafkaSink needs bytes or str records (or a serializer), got {type(v).__name__}")


class _KafkaWriter(SinkWriter):
    def __init__(self, spec: KafkaSink, ctx: StepContext, producer):
        self.spec, self.ctx, self.p = spec, ctx, producer

    def write(self, items, event_times, in_time):
        values, keys, dead = self._encode(items, in_time)
        self.p.send_many(self.spec.topic, values, keys)
        return dead

    def _encode(self, items, in_time):
        spec = self.spec
        records = items if isinstance(items, list) else list(items)
        if spec.stamp is not None:
            out_time = time.time()
            records = [spec.stamp(r, in_time, out_time) for r in records]
        ser = spec.serializer or _to_bytes
        values = [ser(r) for r in records]
        keys = [spec.key(r) for r in records] if spec.key else None
        limit = spec.max_message_bytes
        dead = []
        if max(map(len, values), default=0) > limit:
            ok = [i for i, v in enumerate(values) if len(v) <= limit]
            dead = [
                DeadLetter(self.ctx.step_id, self.ctx.instance,
                           f"oversize record: {len(v)} bytes > max_message_bytes={limit}",
                           brief(records[i]), f"topic {spec.topic}")
                for i, v in enumerate(values) if len(v) > limit
            ]
            values = [values[i] for i in ok]
            keys = [keys[i] for i in ok] if keys else None
        return values, keys, dead

    def flush(self):
        self.p.flush()

    def close(self):
        self.p.close()
