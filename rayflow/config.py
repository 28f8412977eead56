"""One frozen configuration tree for rayflow (one module: the tree, its layers and the
defaults file rendered from it are read together).

Values come, lowest priority first, from

1. the model defaults below (written out, with their descriptions, in ``rayflow/defaults.yaml``
   by ``rayflow config defaults``),
2. a YAML file: ``load_config(path)``, or the file named by ``RAYFLOW_CONFIG``,
3. environment variables ``RAYFLOW_<SECTION>__<FIELD>`` (e.g. ``RAYFLOW_STREAM__LINGER_MS=5``;
   mappings as JSON: ``RAYFLOW_KAFKA__OPTIONS='{"security_protocol": "SSL"}'``),
4. keyword arguments (``load_config(stream={"batch_size": 2048})``, ``rayflow.run(flow, ...)``).

A key no model declares is an error in every layer, named with the layer (file or variable)
and the closest valid key.

Example:
    >>> from rayflow.config import load_config
    >>> cfg = load_config(stream={"batch_size": 2048})
    >>> cfg.stream.batch_size
    2048
"""

from __future__ import annotations

import difflib
import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from rayflow.errors import ConfigError

CONFIG_ENV = "RAYFLOW_CONFIG"
ENV_PREFIX = "RAYFLOW_"
DEFAULTS_PATH = Path(__file__).with_name("defaults.yaml")

_FROZEN = ConfigDict(frozen=True, extra="forbid")

_MIB = 1 << 20
# The built-in process profiles (ray.process_profiles): environments of worker processes.
# glibc malloc, measured by the W1 image benchmark (docs/images.md): glibc's adaptive mmap
# threshold lets a worker's heap keep freed large buffers (+120-180 MB per actor at 1200 px);
# a fixed 32 MiB threshold serves them from the heap (a 256 KiB one made every image a fresh
# mmap, 15% slower), a 4 MiB trim threshold gives freed ones back to the OS, and two arenas
# stop the control threads from keeping heaps of their own.
_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 * _MIB), "MALLOC_TRIM_THRESHOLD_": str(4 * _MIB),
           "MALLOC_ARENA_MAX": "2"}
PROCESS_PROFILES: dict[str, dict[str, str]] = {
    "default": _MALLOC,
    # large buffers cross actors (a split pipeline): mmap from 1 MiB, so that a freed buffer
    # goes back to the OS at once (W1 at 1200 px: job USS 221 MB against 263-404 MB)
    "split_pipeline": {**_MALLOC, "MALLOC_MMAP_THRESHOLD_": str(_MIB)},
    # each chain runs the whole pipeline: keep up to 64 MiB of freed heap, which the next
    # image allocates again (W1 at 1200 px: 1.87x the loop against 1.73-1.78x; more memory)
    "whole_pipeline": {**_MALLOC, "MALLOC_TRIM_THRESHOLD_": str(64 * _MIB)},
    "glibc": {},  # glibc's own adaptive settings
}


class RayOptions(BaseModel):
    """Where Ray runs."""

    model_config = _FROZEN
    address: str | None = Field(
        None, description="cluster to connect to (auto, host:6379 or ray://host:10001); null "
        "starts a private local Ray")
    num_cpus: int | None = Field(
        None, ge=1, description="logical CPUs of the private local Ray; null: the machine's "
        "cores (ignored when connecting)")
    include_dashboard: bool = Field(
        False, description="start the dashboard with the private local Ray (needs "
        "ray[default]; adds seconds to the start)")
    inline_bytes: int = Field(
        1 << 20, ge=0, description="the private local Ray's max_direct_call_object_size: "
        "a call's arguments and results up to this many bytes travel inside the call, not "
        "through the object store. A stream batch is one call's argument: at Ray's 100 KiB "
        "most batches of a few thousand records went through the store, and the store's "
        "round trips cost more than the records' own work (the word count at 1,024 "
        "sentences a batch: 48k -> 73k sentences/s; 4,096: 91k -> 108k; 2-core VM). 0 keeps "
        "Ray's; a cluster takes it from its head: ray start --head "
        "--system-config='{\"max_direct_call_object_size\": 1048576}'")
    namespace: str = Field(
        "rayflow", description="Ray namespace of the driver when rayflow starts or connects "
        "to Ray (named actors live in it)")
    process_profile: str = Field(
        "default", description="the named profile (process_profiles) every worker process of "
        "the job starts with: inherited by the processes of the local Ray rayflow starts, set in "
        "the job's runtime env when it connects to a cluster; a step's actor_env goes on top")
    process_profiles: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {k: dict(v) for k, v in PROCESS_PROFILES.items()},
        description="named environments of worker processes (by default glibc malloc "
        "settings, measured by the image benchmark: docs/images.md); profiles given in a file "
        "or variable are added to these")

    @field_validator("process_profiles", mode="before")
    @classmethod
    def _add_to_built_in_profiles(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {**PROCESS_PROFILES, **value}
        return value

    @model_validator(mode="after")
    def _known_profile(self) -> RayOptions:
        if self.process_profile not in self.process_profiles:
            raise ValueError(f"process_profile {self.process_profile!r} is not one of the "
                             f"process_profiles: {sorted(self.process_profiles)}")
        return self

    def system_config(self) -> dict[str, int]:
        """The Ray system settings of a Ray that rayflow starts (the local instance, local
        heads): ``inline_bytes`` as Ray's ``max_direct_call_object_size``."""
        return {"max_direct_call_object_size": self.inline_bytes} if self.inline_bytes else {}

    def process_env(self, profile: str | None = None) -> dict[str, str]:
        """The environment variables of ``profile`` (default: the job's ``process_profile``).

        Raises:
            ConfigError: no such profile.
        """
        name = self.process_profile if profile is None else profile
        if name not in self.process_profiles:
            raise ConfigError(f"ray.process_profiles has no profile {name!r}; known: "
                              f"{sorted(self.process_profiles)}")
        return dict(self.process_profiles[name])


class KafkaOptions(BaseModel):
    """Defaults of every Kafka connector (KafkaSource, KafkaSink and the image connectors)."""

    model_config = _FROZEN
    bootstrap: str | None = Field(
        None, description="host:port[,host:port] of connectors without bootstrap=; null: "
        "such connectors fail (start the embedded broker with `rayflow kafka up`)")
    client: Literal["confluent", "kafka-python"] = Field(
        "confluent", description="the client of every Kafka connector without client=: "
        "confluent (confluent-kafka on librdkafka, the client of Bytewax and Quix) or "
        "kafka-python (pure Python; its transactions are about 15x slower here)")
    options: dict[str, Any] = Field(
        default_factory=dict, description="client options of every Kafka connector, in "
        "Kafka's dotted names (security.protocol, sasl.mechanism, sasl.username, "
        "ssl.ca.location, ...) or kafka-python's (security_protocol, ...): each is "
        "translated for the connector's client, and one with no counterpart there is an "
        "error; a connector's own options= win")
    startup_timeout_s: float = Field(
        20.0, gt=0, description="seconds the embedded broker may take to answer after it "
        "starts (`rayflow kafka up`, `rayflow demo`)")

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "confluent_options" in data:
            raise ConfigError("kafka.confluent_options is gone: put those options in "
                              "kafka.options, which takes librdkafka's dotted names and "
                              "kafka-python's, for both clients")
        return data

    def client_options(self, client: str | None = None,
                       explicit: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The options a client is built with: this section's, under the connector's
        ``explicit`` ones, both in the names of ``client`` (``confluent`` or
        ``kafka-python``; default: ``kafka.client``).

        Raises:
            ConfigError: an unknown client, or an option with no counterpart in it.
        """
        from rayflow.connectors.kafka.options import for_client

        client = client or self.client
        return {**for_client(client, self.options, "kafka.options"),
                **for_client(client, explicit or {}, "the connector's options=")}


class StreamOptions(BaseModel):
    """Streaming runtime defaults. batch_size, linger_ms, channel_bytes, channel_calls,
    latency_sample_every, actor_num_cpus and scheduling_strategy can be set per step too:
    .map("m", fn, batch_size=1000)."""

    model_config = _FROZEN
    batch_size: int = Field(16384, gt=0, description="records per source batch, at most")
    linger_ms: float = Field(5.0, ge=0, description="milliseconds a partial source batch "
                             "waits for more records before it is sent")
    channel_bytes: int = Field(32 * 1024 * 1024, gt=0,
                               description="bytes in flight per channel before the sender waits")
    channel_calls: int = Field(
        2, gt=0, description="batches in flight per channel before the sender waits: with 2 "
        "(as Flink's 2 buffers per channel) one is handled while the next waits, so the "
        "receiver does not idle, and an aligned barrier waits behind little. With 16 the "
        "checkpoint benchmark's exactly-once word count (4,096 sentences a batch, 2-core VM) "
        "checkpointed in 0.9-1.6 s against 0.34-0.55 s, and delivered no more (70-83k "
        "against 85-91k sentences/s)")
    channel_target_s: float | None = Field(
        None, ge=0, description="seconds of work a channel may queue at its receiver: fewer "
        "batches fly when each takes long, and sources batch less (as Flink's buffer "
        "debloating), so barriers wait less and checkpoints are shorter, at a cost in "
        "throughput; 0 (off) keeps channel_calls and batch_size always; null: a fifth of "
        "checkpoint.interval_s in an exactly-once job with aligned checkpoints (its output "
        "waits for each checkpoint, which must cross every step behind the queued work; the "
        "checkpoint benchmark's word count at a 0.5 s interval, 2-core VM: 0.47 s median "
        "checkpoints against 0.65 s with 0, at 0.89x the sentences/s), else 0 (and 0 where "
        "every step is chained to its source: no channel to wait in)")
    batch_target_s: float = Field(
        0.1, ge=0, description="seconds of work one part of a batch brings a slow step "
        "behind a rebalance, as the calls it completed show: a batch that would cost an "
        "instance more than ten times this goes in parts dealt over the instances (a slow "
        "step scales without a hand-set batch_size) and sources poll less; fast steps (under "
        "0.1 ms a record) and other edges keep whole batches; 0 (off) sends batches whole")
    on_error: Literal["raise", "dead_letter"] = Field(
        "raise", description="a record that makes user code raise fails the job (raise) or "
        "becomes a dead letter (dead_letter); per step: on_error=")
    actor_num_cpus: float = Field(
        0.0, ge=0,
        description="CPUs reserved per step actor; 0 lets a graph larger than the core "
        "count be scheduled (steps mostly wait on I/O or each other)",
    )
    latency_sample_every: int = Field(16, gt=0,
                                      description="keep 1 latency sample in this many records")
    chaining: bool = Field(
        True,
        description="run a step in its upstream's actor when the edge is one-to-one (Flink's "
        "operator chaining): no serialization between them. Per step: start_new_chain=True "
        "or disable_chaining=True",
    )
    gc_threshold: list[NonNegativeInt] | None = Field(
        [200_000, 20, 100], min_length=3, max_length=3,
        description="Python's cyclic garbage collector thresholds (gc.set_threshold) in each "
        "step actor: with Python's own (700, 10, 10) a step that makes many small objects "
        "(window accumulators, results) spends most of its time in collections over a Ray "
        "worker's large heap (the word count: 2-3x slower). The first is above what one "
        "batch of 16,384 sentences leaves alive while the word count handles it, so a batch "
        "is not walked by collections that free nothing (at 50,000: 11% of the window "
        "step's time). null keeps Python's, a first 0 turns collection off")
    gc_freeze: bool = Field(
        True, description="gc.freeze() each step actor once its steps are built: what was "
        "alive then (modules, Ray's objects, restored state) is left out of later collections")
    scheduling_strategy: Literal["SPREAD", "DEFAULT"] = Field(
        "SPREAD",
        description="SPREAD deals step actors over the nodes; DEFAULT lets Ray pack them (an "
        "autoscaled cluster can then shrink after a job scales down)",
    )


class StepOnlyOptions(BaseModel):
    """Per-step options that have no job-wide default."""

    model_config = _FROZEN
    start_new_chain: bool = Field(False, description="never chain this step to its upstream")
    disable_chaining: bool = Field(False, description="chain this step to neither neighbour")
    actor_env: dict[str, str | int | float] = Field(
        default_factory=dict, description="environment variables of this step's actor "
        "process, merged over the job's runtime_env")
    process_profile: str | None = Field(
        None, description="a named profile (ray.process_profiles) for this step's actor "
        "process instead of the job's: its variables go under the step's actor_env")


# The stream settings a step may override; the rest (chaining, on_error) are job-wide or
# have their own parameter.
STEP_STREAM_OPTIONS = ("batch_size", "linger_ms", "channel_bytes", "channel_calls",
                       "channel_target_s", "batch_target_s",
                       "latency_sample_every", "actor_num_cpus", "scheduling_strategy")
STEP_OPTIONS = STEP_STREAM_OPTIONS + tuple(StepOnlyOptions.model_fields)


class CheckpointOptions(BaseModel):
    """Checkpoints and delivery guarantees of streaming jobs."""

    model_config = _FROZEN
    processing_guarantee: Literal["at_most_once", "at_least_once", "exactly_once"] = Field(
        "at_least_once", description="what a failure may do to the output: lose records "
        "(at_most_once), repeat them (at_least_once) or neither (exactly_once)")
    interval_s: float = Field(2.0, ge=0, description="seconds from the start of one "
                              "checkpoint to the start of the next (Flink's interval: one "
                              "that takes longer is followed at once, one at a time); 0 "
                              "disables them")
    min_pause_s: float = Field(0.0, ge=0, description="seconds from the end of one "
                               "checkpoint to the start of the next, at least (Flink's "
                               "min-pause): room for the job between checkpoints that take "
                               "about the interval")
    timeout_s: float = Field(60.0, gt=0, description="seconds after which an unfinished "
                             "checkpoint is aborted")
    state_backend: Literal["memory", "filesystem", "rocksdb"] = Field(
        "memory", description="where operator state snapshots go")
    state_dir: str | None = Field(
        None, description="snapshot directory of the filesystem backend (required) and the "
        "rocksdb one (null: a temporary directory); on a cluster, storage every node sees")
    rocksdb_cache_entries: int = Field(
        65_536, ge=0, description="state entries of each rocksdb step instance kept in memory "
        "between batches (recently read or written; writes reach RocksDB at each snapshot, "
        "keys beyond a full cache go to RocksDB at once); 0: none")
    max_restarts: int = Field(3, ge=0, description="recoveries from Ray failures before the "
                              "job fails")
    failover_strategy: Literal["region", "full"] = Field(
        "region", description="what a failure restarts: the failed region only, the instances "
        "that exchange records with the failed ones (region), or every instance (full)")
    tick_s: float = Field(0.2, gt=0, description="seconds between the timer ticks an idle "
                          "source sends (they close processing-time windows)")
    unaligned: bool = Field(
        False, description="unaligned checkpoints (exactly_once only): barriers overtake the "
        "batches queued in the channels and those batches are stored with the checkpoint, so "
        "a checkpoint does not wait for a backpressured job to work through its queues; "
        "savepoints stay aligned")

    @model_validator(mode="after")
    def _filesystem_needs_a_directory(self) -> CheckpointOptions:
        if self.state_backend == "filesystem" and not self.state_dir:
            raise ValueError("state_backend 'filesystem' needs state_dir")
        if self.unaligned and self.processing_guarantee != "exactly_once":
            raise ValueError(f"unaligned checkpoints need processing_guarantee "
                             f"'exactly_once', not {self.processing_guarantee!r}")
        return self


class HpcOptions(BaseModel):
    """MPI-stage defaults."""

    model_config = _FROZEN
    backend: Literal["ray", "gloo"] = Field(
        "ray", description="rank-to-rank transport: direct shared memory and TCP after a Ray rendezvous (ray), or torch gloo")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="placement-group strategy of a gang")
    gang_timeout_s: float = Field(30.0, gt=0, description="seconds a gang may wait to be "
                                  "placed before GangSchedulingError")
    rank_num_cpus: float = Field(1.0, ge=0, description="CPUs one gang rank reserves")
    max_stage_retries: int = Field(2, ge=0, description="re-runs of a stage after rank "
                                   "deaths")
    warm_gang_idle_s: float = Field(10.0, ge=0, description="seconds the gang of a finished "
                                    "stage stays started for the next stage (0: shut down)")
    check_collectives: bool = Field(
        False, description="rooted collectives (bcast, gather, scatter, reduce) check that "
        "every rank passed the same root and buffer, raising on every rank instead of "
        "hanging; each rank then hears from every other (3-5x a small unchecked call)")


class RayflowConfig(BaseSettings):
    """The whole tree. Immutable: derive a new one with :func:`with_overrides`.

    Building one reads nothing but its arguments; :func:`load_config` layers the file and
    the environment (this class is a pydantic-settings class so that the environment is
    parsed by pydantic-settings' own source, with the ``RAYFLOW_`` prefix and ``__`` nesting).
    """

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", env_prefix=ENV_PREFIX, env_nested_delimiter="__"
    )
    ray: RayOptions = Field(default_factory=RayOptions)
    kafka: KafkaOptions = Field(default_factory=KafkaOptions)
    stream: StreamOptions = Field(default_factory=StreamOptions)
    checkpoint: CheckpointOptions = Field(default_factory=CheckpointOptions)
    hpc: HpcOptions = Field(default_factory=HpcOptions)

    def job_stream(self, channels: bool = True) -> StreamOptions:
        """The stream options a job runs with: ``channel_target_s`` null resolved (a fifth
        of the checkpoint interval for exactly-once jobs with aligned checkpoints, else 0).
        ``channels``: whether the job sends batches between actors at all; where every step
        is chained to its source, a barrier waits behind no queue, and it stays 0.

            >>> load_config(checkpoint={"processing_guarantee": "exactly_once",
            ...             "interval_s": 0.5}).job_stream().channel_target_s
            0.1
            >>> load_config().job_stream().channel_target_s  # at least once: off
            0.0
        """
        if self.stream.channel_target_s is not None:
            return self.stream
        chk = self.checkpoint
        aligned = chk.processing_guarantee == "exactly_once" and not chk.unaligned
        target = chk.interval_s / 5 if channels and aligned and chk.interval_s > 0 else 0.0
        return self.stream.model_copy(update={"channel_target_s": target})

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,
                                   dotenv_settings, file_secret_settings):
        return (init_settings,)  # the other layers are load_config's, each named in errors


# -- loading ------------------------------------------------------------------------------
def load_config(path: str | Path | None = None, **overrides: Any) -> RayflowConfig:
    """Build the configuration: defaults, the YAML file, the environment, then ``overrides``.

    Args:
        path: a YAML file; when None, the file named by ``RAYFLOW_CONFIG`` (if set).
        **overrides: sections, e.g. ``stream={"batch_size": 1000}``.

    Raises:
        ConfigError: a file that is not YAML or not a mapping, or a key or value no model
            accepts; the message names the layer (file, variable) and the key.
    """
    if path is None and os.environ.get(CONFIG_ENV):
        path = os.environ[CONFIG_ENV]
    layers: list[dict[str, Any]] = []
    if path is not None:
        layers.append(_file_layer(Path(path)))
    layers.append(_env_layer())
    layers.append(_checked(overrides, "keyword overrides"))
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = _deep_merge(merged, layer)
    return RayflowConfig.model_validate(merged)


def with_overrides(config: RayflowConfig, **overrides: Any) -> RayflowConfig:
    """``config`` with ``overrides`` (sections of fields) merged over it, validated.

        >>> with_overrides(RayflowConfig(), stream={"batch_size": 7}).stream.batch_size
        7
    """
    if not overrides:
        return config
    top = _checked(overrides, "keyword overrides")
    return RayflowConfig.model_validate(_deep_merge(config.model_dump(), top))


_current: RayflowConfig | None = None


def set_current(config: RayflowConfig | None) -> None:
    """Make ``config`` what :func:`current` returns in this process (a job's step actors
    get the job's configuration this way; None goes back to :func:`load_config`)."""
    global _current
    _current = config


def current() -> RayflowConfig:
    """The configuration of the job this process runs steps for, else :func:`load_config`.

    Code that runs inside steps (connectors building their clients) reads its defaults
    here, so that ``rayflow.run(flow, kafka={...})`` reaches it on every node.
    """
    return _current if _current is not None else load_config()


def _file_layer(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"configuration file {path}: cannot read: "
                          f"{exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: "
                          f"{getattr(exc, 'problem', None) or exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections "
                          f"({', '.join(RayflowConfig.model_fields)}), got "
                          f"{type(data).__name__}")
    return _checked(data, str(path), lines=yaml.compose(text, Loader=yaml.SafeLoader))


def _env_layer() -> dict[str, Any]:
    sections = RayflowConfig.model_fields
    for name in os.environ:
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue  # RAYFLOW_CONFIG, RAYFLOW_DEBUG, RAYFLOW_STATE_DIR: not in the tree
        section = name[len(ENV_PREFIX):].split("__", 1)[0].lower()
        if section not in sections:
            raise ConfigError(f"environment variable {name}: no section {section!r}"
                              f"{did_you_mean(section, sections)} (sections: "
                              f"{', '.join(sections)})")
    try:
        data = EnvSettingsSource(RayflowConfig)()
    except Exception as exc:  # noqa: BLE001 - pydantic-settings' SettingsError: bad JSON
        raise ConfigError(f"environment: {exc}") from None
    try:
        return _checked(data, "environment")
    except _LayerError as err:
        loc = err.loc
        nested = f"{ENV_PREFIX}{loc[0]}__{loc[1]}".upper() if len(loc) > 1 else ""
        name = nested if nested in os.environ else f"{ENV_PREFIX}{loc[0]}".upper()
        raise ConfigError(f"environment variable {name}: {'.'.join(loc)}: {err.message}"
                          ) from None


class _LayerError(ConfigError):
    def __init__(self, source: str, loc: tuple[str, ...], message: str,
                 line: int | None = None):
        self.loc, self.message = loc, message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {'.'.join(loc) or '<top>'}: {message}")


def _checked(data: dict[str, Any], source: str, lines: Any = None) -> dict[str, Any]:
    """``data`` validated as one layer of the tree: the fields it sets, typed."""
    try:
        return RayflowConfig.model_validate(data).model_dump(exclude_unset=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            valid = _fields_at(loc[:-1])
            message = f"unknown key{did_you_mean(loc[-1], valid)}"
            if valid:
                message += f" (valid here: {', '.join(valid)})"
        else:
            message = f"{err['msg']} (got {err['input']!r})"
        raise _LayerError(source, loc, message, yaml_key_line(lines, loc)) from None


def _fields_at(loc: tuple[str, ...]) -> list[str]:
    model: Any = RayflowConfig
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def did_you_mean(name: str, valid) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``valid`` to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def yaml_key_line(root: Any, path: tuple[str, ...] | str) -> int | None:
    """Line (1-based) of the key at ``path`` in a composed YAML document
    (``yaml.compose``), or of its nearest parent that exists; None without a document."""
    if root is None:
        return None
    parts = [p for p in (path.split(".") if isinstance(path, str) else path) if p]
    node, line = root, None
    for part in parts:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == part:
                    node, line = v, k.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and \
                int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            return line
    return line


# -- per-step options ---------------------------------------------------------------------
def validate_step_options(step_id: str, options: Mapping[str, Any],
                          method: str = "", keywords: Sequence[str] = ()) -> dict[str, Any]:
    """Check the keyword options of a step (``.map("m", fn, batch_size=100)``).

    Valid: :data:`STEP_OPTIONS`, with the constraints of their :class:`StreamOptions` and
    :class:`StepOnlyOptions` fields. Returns the options as validated (typed). ``method``
    and its own ``keywords`` (``map``: ``parallelism``, ``on_error``) are named in the
    error, and the closest name may be one of them (``paralelism``).

    Raises:
        ConfigError: an unknown option (naming the closest valid one) or a bad value.
    """
    for name in options:
        if name not in STEP_OPTIONS:
            own = (f"; {method}() takes {', '.join(keywords)}" if method and keywords
                   else "")
            raise ConfigError(f"step {step_id!r}: unknown option {name!r}"
                              f"{did_you_mean(name, (*keywords, *STEP_OPTIONS))} (step "
                              f"options: {', '.join(STEP_OPTIONS)}{own})")
    stream = {k: v for k, v in options.items() if k in STEP_STREAM_OPTIONS}
    only = {k: v for k, v in options.items() if k not in STEP_STREAM_OPTIONS}
    out: dict[str, Any] = {}
    for model, part in ((StreamOptions, stream), (StepOnlyOptions, only)):
        try:
            out.update(model.model_validate(part).model_dump(include=set(part)))
        except ValidationError as exc:
            err = exc.errors()[0]
            name = ".".join(str(p) for p in err["loc"])
            raise ConfigError(f"step {step_id!r}: option {name}: {err['msg']} "
                              f"(got {err['input']!r})") from None
    given = {k: out[k] for k in options}
    if given.get("process_profile") is not None:
        # a profile is environment variables of the step's actor, as actor_env is
        try:
            env = load_config().ray.process_env(given["process_profile"])
        except ConfigError as exc:
            raise ConfigError(f"step {step_id!r}: option process_profile: {exc}") from None
        given["actor_env"] = {**env, **given.get("actor_env", {})}
    return given


# -- the commented defaults file ----------------------------------------------------------
_HEADER = """\
# rayflow's configuration defaults. GENERATED from the models in rayflow/config.py by
# `rayflow config defaults --out rayflow/defaults.yaml`: edit the models, not this file.
#
# Override any of them, lowest priority first, with a YAML file of the same shape
# (RAYFLOW_CONFIG=path.yaml), environment variables RAYFLOW_<SECTION>__<FIELD>
# (RAYFLOW_STREAM__BATCH_SIZE=4096; mappings as JSON), or keyword arguments
# (rayflow.run(flow, stream={"batch_size": 4096})). Unknown keys are errors."""


def render_defaults() -> str:
    """The text of ``defaults.yaml``: every section and field with its default, and the
    model's description (units, choices) as comments."""
    out = [_HEADER]
    for section, sfield in RayflowConfig.model_fields.items():
        model = sfield.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel), section
        out.append("")
        out.extend(f"# {ln}" for ln in _wrap(_first_paragraph(model.__doc__), 88))
        out.append(f"{section}:")
        for name, field in model.model_fields.items():
            note = field.description or ""
            choices = _choices(field.annotation)
            if choices:
                note += f" [one of: {', '.join(choices)}]"
            out.extend(f"  # {ln}" for ln in _wrap(note, 86))
            value = field.get_default(call_default_factory=True)
            out.append(f"  {name}: {_yaml_scalar(value)}")
    return "\n".join(out) + "\n"


def write_defaults(path: str | Path = DEFAULTS_PATH) -> Path:
    """Write :func:`render_defaults` to ``path`` (the package's ``defaults.yaml``)."""
    path = Path(path)
    path.write_text(render_defaults())
    return path


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _choices(annotation: Any) -> list[str]:
    if typing.get_origin(annotation) is Literal:
        return [str(a) for a in typing.get_args(annotation)]
    return []


def _yaml_scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or []
