"""The configuration tree: defaults file, layers (file, environment, keywords), errors that
name the key and where it came from, per-step options, and configuration reaching the steps
of a running job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

import rayflow as rf
from rayflow import config as cfgmod
from rayflow.cli import main
from rayflow.config import (
    DEFAULTS_PATH,
    STEP_OPTIONS,
    STEP_STREAM_OPTIONS,
    KafkaOptions,
    RayflowConfig,
    StreamOptions,
    load_config,
    render_defaults,
    validate_step_options,
    with_overrides,
)
from rayflow.errors import ConfigError, StepError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No RAYFLOW_* configuration from the machine running the tests."""
    import os

    for name in list(os.environ):
        if name.startswith("RAYFLOW_") and ("__" in name or name == "RAYFLOW_CONFIG"):
            monkeypatch.delenv(name)


# -- the defaults file ----------------------------------------------------------------------
def test_checked_in_defaults_file_is_current():
    assert DEFAULTS_PATH.read_text() == render_defaults(), \
        "rayflow/defaults.yaml is stale: run `rayflow config defaults --out rayflow/defaults.yaml`"


def test_defaults_file_holds_every_field_with_its_default_and_description():
    doc = yaml.safe_load(DEFAULTS_PATH.read_text())
    assert doc == RayflowConfig().model_dump()
    text = DEFAULTS_PATH.read_text()
    for section, sfield in RayflowConfig.model_fields.items():
        for name, field in sfield.annotation.model_fields.items():
            assert field.description, f"{section}.{name} has no description"
            # the comment right above the key starts with the description's first words
            block = text.split(f"\n{section}:\n", 1)[1]
            before = block.split(f"\n  {name}: ", 1)[0].splitlines()
            comment = []
            for line in reversed(before):
                if not line.startswith("  # "):
                    break
                comment.insert(0, line[4:])
            assert " ".join(comment).startswith(" ".join(field.description.split()[:4]))
    assert "linger_ms: 5.0" in text and "milliseconds" in text
    flat = " ".join(ln.strip().lstrip("#").strip() for ln in text.splitlines())
    assert "[one of: at_most_once, at_least_once, exactly_once]" in flat


def test_defaults_file_loads_as_a_config_file_to_the_defaults():
    assert load_config(DEFAULTS_PATH) == RayflowConfig()


def test_cli_config_defaults_prints_and_writes_the_file(tmp_path):
    r = CliRunner()
    out = r.invoke(main, ["config", "defaults"])
    assert out.exit_code == 0 and out.stdout == render_defaults()
    dest = tmp_path / "d.yaml"
    res = r.invoke(main, ["config", "defaults", "--out", str(dest)])
    assert res.exit_code == 0 and dest.read_text() == render_defaults()
    stale = tmp_path / "stale.yaml"
    stale.write_text("stream: {}\n")
    chk = r.invoke(main, ["config", "defaults", "--check", str(stale)])
    assert chk.exit_code == 1 and "stale" in chk.output
    assert r.invoke(main, ["config", "defaults", "--check", str(dest)]).exit_code == 0


def test_cli_config_show_prints_the_effective_tree(tmp_path, monkeypatch):
    f = tmp_path / "c.yaml"
    f.write_text("stream:\n  batch_size: 123\n")
    monkeypatch.setenv("RAYFLOW_CONFIG", str(f))
    monkeypatch.setenv("RAYFLOW_HPC__BACKEND", "gloo")
    res = CliRunner().invoke(main, ["config", "show", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["stream"]["batch_size"] == 123 and doc["hpc"]["backend"] == "gloo"
    assert doc == {**RayflowConfig().model_dump(), "stream": {**doc["stream"]},
                   "hpc": {**doc["hpc"]}}


# -- layers ---------------------------------------------------------------------------------
def test_file_override_by_path_and_by_rayflow_config(tmp_path, monkeypatch):
    f = tmp_path / "job.yaml"
    f.write_text("stream:\n  batch_size: 100\ncheckpoint:\n  interval_s: 0.5\n")
    by_path = load_config(f)
    assert by_path.stream.batch_size == 100 and by_path.checkpoint.interval_s == 0.5
    assert by_path.stream.linger_ms == StreamOptions().linger_ms  # the rest: defaults
    monkeypatch.setenv("RAYFLOW_CONFIG", str(f))
    assert load_config() == by_path


def test_env_overrides_nested_fields_and_json_mappings(monkeypatch):
    monkeypatch.setenv("RAYFLOW_STREAM__LINGER_MS", "7.5")
    monkeypatch.setenv("RAYFLOW_CHECKPOINT__PROCESSING_GUARANTEE", "exactly_once")
    monkeypatch.setenv("RAYFLOW_KAFKA__OPTIONS", '{"security_protocol": "SSL", "retries": 3}')
    cfg = load_config()
    assert cfg.stream.linger_ms == 7.5
    assert cfg.checkpoint.processing_guarantee == "exactly_once"
    assert cfg.kafka.options == {"security_protocol": "SSL", "retries": 3}


def test_priority_is_file_then_env_then_keywords(tmp_path, monkeypatch):
    f = tmp_path / "c.yaml"
    f.write_text("stream: {batch_size: 100, linger_ms: 1.0, channel_calls: 3}\n")
    # the environment sets batch_size back to its default value: it still wins over the file
    monkeypatch.setenv("RAYFLOW_STREAM__BATCH_SIZE", str(StreamOptions().batch_size))
    monkeypatch.setenv("RAYFLOW_STREAM__LINGER_MS", "2.0")
    cfg = load_config(f, stream={"linger_ms": 3.0})
    assert (cfg.stream.batch_size, cfg.stream.linger_ms, cfg.stream.channel_calls) == \
        (16384, 3.0, 3)


def test_with_overrides_merges_over_a_given_config():
    base = load_config(stream={"batch_size": 10, "linger_ms": 1.0})
    cfg = with_overrides(base, stream={"batch_size": 7}, hpc={"backend": "gloo"})
    assert (cfg.stream.batch_size, cfg.stream.linger_ms, cfg.hpc.backend) == (7, 1.0, "gloo")
    assert with_overrides(base) is base
    with pytest.raises(ConfigError, match=r"keyword overrides: stream\.batchsize: unknown key; "
                                          r"did you mean 'batch_size'\?"):
        with_overrides(base, stream={"batchsize": 7})


# -- errors name the key and where it came from ------------------------------------------------
def test_unknown_key_in_file_names_file_line_key_and_closest(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("stream:\n  batch_size: 10\n  lingerms: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert str(err.value).startswith(f"{f}:3: stream.lingerms: unknown key; did you mean "
                                     f"'linger_ms'?")
    f.write_text("straem:\n  batch_size: 10\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:1: straem: unknown key; did you mean "
                                          r"'stream'\?"):
        load_config(f)


def test_invalid_yaml_and_bad_values_in_file(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("stream:\n  batch_size: [1, 2\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+: not valid YAML"):
        load_config(f)
    f.write_text("- stream\n")
    with pytest.raises(ConfigError, match="broken.yaml: the top level must be a mapping"):
        load_config(f)
    f.write_text("stream:\n  batch_size: -1\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:2: stream.batch_size: Input should be "
                                          r"greater than 0 \(got -1\)"):
        load_config(f)
    f.write_text("checkpoint:\n  state_backend: filesystem\n")
    with pytest.raises(ConfigError, match="broken.yaml:1: checkpoint: .*needs state_dir"):
        load_config(f)
    f.write_text("checkpoint:\n  unaligned: true\n")  # the default guarantee: at_least_once
    with pytest.raises(ConfigError, match="broken.yaml:1: checkpoint: .*unaligned checkpoints "
                                          "need processing_guarantee 'exactly_once'"):
        load_config(f)
    with pytest.raises(ConfigError, match="configuration file .*missing.yaml: cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_env_errors_name_the_variable(monkeypatch):
    monkeypatch.setenv("RAYFLOW_STREAM__BATCHSIZE", "7")
    with pytest.raises(ConfigError, match=r"environment variable RAYFLOW_STREAM__BATCHSIZE: "
                                          r"stream.batchsize: unknown key; did you mean "
                                          r"'batch_size'\?"):
        load_config()
    monkeypatch.delenv("RAYFLOW_STREAM__BATCHSIZE")
    monkeypatch.setenv("RAYFLOW_STRAEM__BATCH_SIZE", "7")
    with pytest.raises(ConfigError, match=r"RAYFLOW_STRAEM__BATCH_SIZE: no section 'straem'; "
                                          r"did you mean 'stream'\?"):
        load_config()
    monkeypatch.delenv("RAYFLOW_STRAEM__BATCH_SIZE")
    monkeypatch.setenv("RAYFLOW_STREAM__BATCH_SIZE", "many")
    with pytest.raises(ConfigError, match=r"RAYFLOW_STREAM__BATCH_SIZE: stream.batch_size: "
                                          r"Input should be a valid integer"):
        load_config()


def test_unknown_keyword_section_is_an_error():
    with pytest.raises(ConfigError, match=r"keyword overrides: streams: unknown key; did you "
                                          r"mean 'stream'\?"):
        load_config(streams={"batch_size": 1})


# -- per-step options -----------------------------------------------------------------------
def test_step_options_come_from_the_stream_model():
    assert set(STEP_STREAM_OPTIONS) <= set(StreamOptions.model_fields)
    assert set(STEP_OPTIONS) == set(STEP_STREAM_OPTIONS) | {
        "start_new_chain", "disable_chaining", "actor_env", "process_profile"}


@pytest.mark.parametrize("typo,closest", [("batchsize", "batch_size"),
                                          ("dissable_chaining", "disable_chaining"),
                                          ("linger", "linger_ms"),
                                          ("actor_num_cpu", "actor_num_cpus")])
def test_misspelt_step_option_fails_at_definition(typo, closest):
    flow = rf.Dataflow("typo")
    src = flow.source("src", rf.MemorySource([1]))
    with pytest.raises(ConfigError) as err:
        src.map("m", str, **{typo: 10})
    assert str(err.value).startswith(f"step 'm': unknown option {typo!r}; did you mean "
                                     f"{closest!r}?")
    assert "m" not in {s.step_id for s in flow.steps}  # nothing half-added


def test_every_step_kind_checks_its_options():
    flow = rf.Dataflow("kinds")
    with pytest.raises(ConfigError, match="step 'src': unknown option 'batchsize'"):
        flow.source("src", rf.MemorySource([1]), batchsize=3)
    s = flow.source("src", rf.MemorySource([1]))
    with pytest.raises(ConfigError, match="step 'out': unknown option 'paralelism'"):
        s.sink("out", rf.CollectSink(), paralelism=2)
    with pytest.raises(ConfigError, match="step 'mb': unknown option"):
        s.map_batches("mb", len, chaining=False)  # job-wide only, not per step


def test_a_misspelt_keyword_of_the_method_is_named_with_the_closest_one():
    """The methods' own keywords (parallelism, on_error, ttl_s...) are not step options, but
    a misspelling of one is an unknown option whose error names the method's keywords and
    the closest of them."""
    flow = rf.Dataflow("typo-kw")
    src = flow.source("src", rf.MemorySource([1]))
    with pytest.raises(ConfigError) as err:
        src.map("m", str, paralelism=2)
    assert str(err.value).startswith("step 'm': unknown option 'paralelism'; did you mean "
                                     "'parallelism'?")
    assert str(err.value).endswith("; map() takes fn, parallelism, on_error)")
    with pytest.raises(ConfigError, match="did you mean 'ttl_s'.*stateful_map\\(\\) takes "
                                          "fn, ttl_s, parallelism, on_error"):
        src.key_by(str).stateful_map("n", lambda s, v: (s, v), ttl=3)
    with pytest.raises(ConfigError, match="'on_eror'; did you mean 'on_error'"):
        src.sink("out", rf.CollectSink(), on_eror="raise")
    with pytest.raises(ConfigError, match="source\\(\\) takes spec, parallelism"):
        flow.source("src2", rf.MemorySource([1]), paralellism=2)


def test_step_option_values_are_checked_and_typed():
    with pytest.raises(ConfigError, match=r"step 'm': option batch_size: Input should be "
                                          r"greater than 0 \(got 0\)"):
        validate_step_options("m", {"batch_size": 0})
    with pytest.raises(ConfigError, match="option scheduling_strategy"):
        validate_step_options("m", {"scheduling_strategy": "PACKED"})
    assert validate_step_options("m", {"linger_ms": 2, "start_new_chain": True,
                                       "actor_env": {"A": "1"}}) == \
        {"linger_ms": 2.0, "start_new_chain": True, "actor_env": {"A": "1"}}
    flow = rf.Dataflow("ok")
    flow.source("s", rf.MemorySource([1])).map("m", str, disable_chaining=True, batch_size=5)
    assert flow.step("m").options == {"disable_chaining": True, "batch_size": 5}


# -- Kafka client options -------------------------------------------------------------------
def test_kafka_options_are_one_spelling_for_both_clients_under_the_connectors_own():
    k = KafkaOptions(options={"security.protocol": "SSL", "retries": 1,
                              "ssl_cafile": "/ca.pem"})
    assert k.client == "confluent"
    assert k.client_options() == k.client_options("confluent") == \
        {"security.protocol": "SSL", "retries": 1, "ssl.ca.location": "/ca.pem"}
    assert k.client_options("kafka-python", {"retries": 5}) == \
        {"security_protocol": "SSL", "retries": 5, "ssl_cafile": "/ca.pem"}
    with pytest.raises(ConfigError, match="Kafka client 'rdkafka'"):
        k.client_options("rdkafka")
    with pytest.raises(ConfigError, match="kafka.options: option 'ssl.engine.location' has "
                                          "no kafka-python counterpart"):
        KafkaOptions(options={"ssl.engine.location": "/e"}).client_options("kafka-python")


def test_kafka_confluent_options_is_an_error_that_says_where_they_went():
    with pytest.raises(ConfigError, match="kafka.confluent_options is gone: put those "
                                          "options in kafka.options"):
        load_config(kafka={"confluent_options": {"security.protocol": "SSL"}})
    assert load_config(kafka={"client": "kafka-python"}).kafka.client == "kafka-python"
    with pytest.raises(ConfigError, match="client"):
        load_config(kafka={"client": "librdkafka"})


# -- the configuration reaches the running steps -----------------------------------------------
def test_run_keyword_overrides_reach_the_steps_with_and_without_a_config(ray_session):
    def flow(name):
        f = rf.Dataflow(name)
        (f.source("src", rf.MemorySource(list(range(20))))
          .map_batches("sizes", lambda b: [len(b)])
          .sink("out", rf.CollectSink()))
        return f

    base = load_config(stream={"batch_size": 16384, "linger_ms": 1000.0})
    assert rf.run(flow("a"), config=base, stream={"batch_size": 7}).collect("out") == [7, 7, 6]
    assert rf.run(flow("b"), stream={"batch_size": 9}).collect("out") == [9, 9, 2]
    assert rf.run(flow("c"), config=base).collect("out") == [20]


def test_per_step_batch_size_reaches_its_source(ray_session):
    f = rf.Dataflow("per-step")
    (f.source("src", rf.MemorySource(list(range(10))), batch_size=4)
      .map_batches("sizes", lambda b: [len(b)])
      .sink("out", rf.CollectSink()))
    assert rf.run(f, stream={"linger_ms": 1000.0}).collect("out") == [4, 4, 2]


def test_steps_read_the_jobs_config_not_their_nodes(ray_session):
    f = rf.Dataflow("current")
    (f.source("src", rf.MemorySource([0]))
      .map("read", lambda _: cfgmod.current().kafka.options)
      .sink("out", rf.CollectSink()))
    job = rf.run(f, kafka={"options": {"client_id": "from-the-job"}})
    assert job.collect("out") == [{"client_id": "from-the-job"}]


def test_collect_of_an_unknown_step_names_the_sinks(ray_session):
    f = rf.Dataflow("collect")
    f.source("src", rf.MemorySource([1, 2])).map("m", str).sink("out", rf.CollectSink())
    job = rf.run(f)
    assert job.collect("out") == ["1", "2"]
    with pytest.raises(ConfigError, match="job 'collect' has no step 'typo'; its sinks: 'out'"):
        job.collect("typo")
    with pytest.raises(ConfigError, match="'m' is an operator step, not a sink of job "
                                          "'collect'; its sinks: 'out'"):
        job.collect("m")


# -- start-up failures are one StepError ---------------------------------------------------------
class _Unbuildable(rf.MemorySource):
    def build(self, ctx, resume_state=None):
        raise OSError(f"cannot open the thing of instance {ctx.instance}")


@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_step_that_fails_to_build_is_one_step_error(ray_session, parallelism):
    f = rf.Dataflow(f"unbuildable-{parallelism}")
    (f.source("src", _Unbuildable([1, 2]), parallelism=parallelism)
      .map("m", str)
      .sink("out", rf.CollectSink()))
    with pytest.raises(StepError) as err:
        rf.run(f)
    e = err.value
    assert (e.step_id, e.record) == ("src", "(start-up)")
    assert e.reason == f"OSError: cannot open the thing of instance {e.instance}"
    assert str(e) == (f"step 'src' instance {e.instance} failed to start: OSError: cannot "
                      f"open the thing of instance {e.instance}")


def test_missing_image_directory_at_parallelism_1_names_the_step(ray_session, tmp_path):
    from rayflow.connectors.images import DirectorySource

    f = rf.Dataflow("nodir")
    f.source("images", DirectorySource(str(tmp_path / "nope"))).sink("out", rf.CollectSink())
    with pytest.raises(StepError) as err:
        rf.run(f)
    assert err.value.step_id == "images" and "is not a directory" in err.value.reason


def test_missing_kafka_topic_names_the_step(ray_session, kafka_broker):
    f = rf.Dataflow("notopic")
    (f.source("read", rf.KafkaSource("no-such-topic-x", bootstrap=kafka_broker.bootstrap,
                                     bounded=True))
      .sink("out", rf.CollectSink()))
    with pytest.raises(StepError) as err:
        rf.run(f)
    assert err.value.step_id == "read" and err.value.record == "(start-up)"
    assert "'no-such-topic-x' does not exist" in err.value.reason


# -- process profiles: the one home of the workers' malloc settings ---------------------------
def test_process_profiles_are_named_in_the_config_and_extendable():
    ray_opts = load_config().ray
    assert ray_opts.process_profile == "default"
    assert ray_opts.process_env() == {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                                      "MALLOC_TRIM_THRESHOLD_": str(4 << 20),
                                      "MALLOC_ARENA_MAX": "2"}
    assert ray_opts.process_env("split_pipeline")["MALLOC_MMAP_THRESHOLD_"] == str(1 << 20)
    assert ray_opts.process_env("glibc") == {}
    mine = load_config(ray={"process_profiles": {"mine": {"MALLOC_ARENA_MAX": "4"}},
                            "process_profile": "mine"}).ray
    assert mine.process_env() == {"MALLOC_ARENA_MAX": "4"}
    assert "default" in mine.process_profiles  # added to the built-in ones, not instead
    with pytest.raises(ConfigError, match=r"process_profile 'nope' is not one of the "
                                          r"process_profiles: \['default', 'glibc'"):
        load_config(ray={"process_profile": "nope"})
    with pytest.raises(ConfigError, match="ray.process_profiles has no profile 'nope'"):
        ray_opts.process_env("nope")


@pytest.mark.parametrize("address", [None, "127.0.0.1:6379"])
def test_the_process_profile_reaches_the_jobs_runtime_env_locally_and_on_a_cluster(
        monkeypatch, address):
    import ray

    from rayflow import _raycontext

    seen: dict = {}

    def init(**kw):
        # locally the variables are in the environment the local instance starts with
        seen.update(kw, environ=dict(os.environ))

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type(
        "C", (), {"gcs_address": "x"})())
    monkeypatch.setattr(_raycontext, "_embedded_gcs", None)
    monkeypatch.setenv("RAYFLOW_RAY__PROCESS_PROFILE", "whole_pipeline")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    _raycontext.ensure_ray(address, runtime_env={"env_vars": {"MALLOC_ARENA_MAX": "8"}})
    env = seen["runtime_env"]["env_vars"] if address else seen["environ"]
    assert address or "runtime_env" not in seen  # (a runtime env slows every actor's start)
    assert env["MALLOC_TRIM_THRESHOLD_"] == str(64 << 20)  # the configured profile
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20)
    assert env["MALLOC_ARENA_MAX"] == "8"  # the caller's variables win
    if address is None:  # local workers share the driver's import path
        assert set(env["PYTHONPATH"].split(os.pathsep)) >= {p for p in sys.path
                                                             if p and os.path.isdir(p)}
    else:
        assert "PYTHONPATH" not in env
    assert "MALLOC_TRIM_THRESHOLD_" not in os.environ  # the driver's environment is as it was
    seen.clear()
    _raycontext.ensure_ray(address, process_profile="glibc")
    env = (seen.get("runtime_env") or {}).get("env_vars", {}) if address else seen["environ"]
    assert "MALLOC_TRIM_THRESHOLD_" not in env
    if address is None:  # a runtime env with more than variables is Ray's to apply
        seen.clear()
        _raycontext.ensure_ray(None, runtime_env={"working_dir": ".",
                                                  "env_vars": {"MALLOC_ARENA_MAX": "8"}})
        got = seen["runtime_env"]
        assert got["working_dir"] == "." and got["env_vars"]["MALLOC_ARENA_MAX"] == "8"
        assert "PYTHONPATH" in got["env_vars"]  # local workers share the driver's path


_INLINE_PROBE = """
import json, os, sys, time
import numpy as np
import ray
from rayflow._raycontext import ensure_ray

@ray.remote
def half_a_megabyte():
    return np.zeros(500_000, np.uint8)

seen = []
for inline in (None, "0"):  # the default, then Ray's own threshold (100 KiB)
    if inline is not None:
        os.environ["RAYFLOW_RAY__INLINE_BYTES"] = inline
    ensure_ray(None, num_cpus=1, include_dashboard=False)
    ref = half_a_megabyte.remote()
    assert ray.get(ref).nbytes == 500_000
    # a stored object's location reaches the owner asynchronously: under load it can come
    # a moment after the value (the inlined one never has one: read once)
    for _ in range(100):
        nodes = ray.experimental.get_object_locations([ref])[ref]["node_ids"]
        if nodes or inline is None:
            break
        time.sleep(0.1)
    seen.append(nodes)
    ray.shutdown()
print("NODES", json.dumps(seen))
"""


def test_the_local_ray_passes_calls_up_to_inline_bytes_inside_the_call(tmp_path):
    """A half-megabyte result stays out of the object store (no node holds it) at the
    default ``ray.inline_bytes`` (1 MiB); with 0 (Ray's 100 KiB) it goes through it."""
    env = {k: v for k, v in os.environ.items()
           if k != "RAY_ADDRESS" and not k.startswith("RAYFLOW_RAY__")}
    proc = subprocess.run([sys.executable, "-c", _INLINE_PROBE], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    inline, stored = json.loads(proc.stdout.split("NODES", 1)[1])
    assert inline == [] and len(stored) == 1
    assert load_config().ray.inline_bytes == 1 << 20


def test_channel_target_follows_the_checkpoint_interval_of_aligned_exactly_once_jobs():
    def target(**kw):
        return load_config(**kw).job_stream().channel_target_s

    eo = {"processing_guarantee": "exactly_once", "interval_s": 2.0}
    assert target(checkpoint=eo) == 0.4
    assert target(checkpoint={**eo, "unaligned": True}) == 0.0  # barriers overtake
    assert target(checkpoint={**eo, "interval_s": 0}) == 0.0  # no periodic checkpoints
    assert target(checkpoint={"processing_guarantee": "at_least_once"}) == 0.0
    assert target(checkpoint=eo, stream={"channel_target_s": 0.0}) == 0.0  # set: kept
    assert target(checkpoint=eo, stream={"channel_target_s": 0.3}) == 0.3
    # every step chained to its source: no channel, nothing to debloat
    assert load_config(checkpoint=eo).job_stream(channels=False).channel_target_s == 0.0
    assert load_config().stream.channel_target_s is None
