"""One frozen configuration tree for rayflow.

Values come, lowest priority first, from the model defaults (documented in
``rayflow/defaults.yaml``), an optional YAML file, ``RAYFLOW_*`` environment variables
(nested with ``__``, e.g. ``RAYFLOW_STREAM__LINGER_MS=5``) and keyword arguments.

Example:
    >>> from rayflow.config import load_config
    >>> cfg = load_config(stream={"batch_size": 2048})
    >>> cfg.stream.batch_size
    2048
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class RayOptions(BaseModel):
    """Where Ray runs. ``address=None`` starts a private local Ray (the embedded default)."""

    model_config = _FROZEN
    address: str | None = None
    num_cpus: int | None = None
    include_dashboard: bool = False
    namespace: str = "rayflow"


class KafkaOptions(BaseModel):
    """Kafka client settings. ``bootstrap=None`` means: start the embedded Tansu broker."""

    model_config = _FROZEN
    bootstrap: str | None = None
    client: Literal["kafka-python", "confluent"] = "kafka-python"
    # Passed through to the clients unchanged: security_protocol, sasl_mechanism,
    # sasl_plain_username, ssl_cafile, ...
    options: dict[str, Any] = Field(default_factory=dict)
    max_message_bytes: int = 1_000_000
    startup_timeout_s: float = 20.0


class StreamOptions(BaseModel):
    """Streaming runtime defaults; each can be overridden per step."""

    model_config = _FROZEN
    batch_size: int = Field(16384, gt=0, description="records per source batch, at most")
    linger_ms: float = Field(5.0, ge=0, description="flush a partial batch after this long")
    channel_bytes: int = Field(32 * 1024 * 1024, gt=0, description="in-flight bytes per channel")
    channel_calls: int = Field(16, gt=0, description="in-flight batches per channel")
    on_error: Literal["raise", "dead_letter"] = "raise"
    actor_num_cpus: float = Field(
        0.0,
        ge=0,
        description="CPUs reserved per operator actor; 0 lets a graph larger than the core "
        "count be scheduled (operators are mostly waiting on I/O or each other)",
    )
    latency_sample_every: int = Field(16, gt=0, description="keep 1 latency sample in N")
    chaining: bool = Field(
        True,
        description="run a step in its upstream's actor when the edge is one-to-one (Flink's "
        "operator chaining): no serialization between them. Per step: start_new_chain=True "
        "or disable_chaining=True",
    )
    scheduling_strategy: Literal["SPREAD", "DEFAULT"] = Field(
        "SPREAD",
        description="SPREAD puts step actors on many nodes; DEFAULT packs them (lets an "
        "autoscaled cluster shrink after a job scales down)",
    )


class CheckpointOptions(BaseModel):
    """Checkpoints and delivery guarantees of streaming jobs."""

    model_config = _FROZEN
    processing_guarantee: Literal["at_most_once", "at_least_once", "exactly_once"] = (
        "at_least_once"
    )
    interval_s: float = Field(2.0, ge=0, description="between checkpoints; 0 disables them")
    timeout_s: float = Field(60.0, gt=0, description="a checkpoint slower than this aborts")
    state_backend: Literal["memory", "filesystem", "rocksdb"] = "memory"
    state_dir: str | None = Field(None, description="snapshot directory (filesystem, rocksdb)")
    max_restarts: int = Field(3, ge=0, description="recoveries before the job fails")
    tick_s: float = Field(0.2, gt=0, description="timer tick sent by idle sources")


class HpcOptions(BaseModel):
    """MPI-stage defaults."""

    model_config = _FROZEN
    backend: Literal["ray", "gloo"] = "ray"
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    gang_timeout_s: float = Field(30.0, gt=0)
    rank_num_cpus: float = Field(1.0, ge=0)
    max_stage_retries: int = Field(2, ge=0)


class RayflowConfig(BaseSettings):
    """The whole tree. Immutable: derive a new one with ``model_copy(update=...)``."""

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", env_prefix="RAYFLOW_", env_nested_delimiter="__"
    )
    ray: RayOptions = Field(default_factory=RayOptions)
    kafka: KafkaOptions = Field(default_factory=KafkaOptions)
    stream: StreamOptions = Field(default_factory=StreamOptions)
    checkpoint: CheckpointOptions = Field(default_factory=CheckpointOptions)
    hpc: HpcOptions = Field(default_factory=HpcOptions)


def load_config(path: str | Path | None = None, **overrides: Any) -> RayflowConfig:
    """Build the configuration from an optional YAML file, the environment and overrides.

    Keyword overrides win over the environment, which wins over the file.
    """
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    env_cfg = RayflowConfig()  # environment and defaults
    merged = _deep_merge(data, env_cfg.model_dump(exclude_defaults=True))
    merged = _deep_merge(merged, overrides)
    return RayflowConfig.model_validate(merged) if merged else env_cfg


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
