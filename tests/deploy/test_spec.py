"""Cluster specs: every shipped file validates offline; broken ones fail naming the bad key."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rayflow.cli import main
from rayflow.deploy.spec import ClusterSpecError, validate_file, validate_text

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "cluster").glob("*.yaml"))


def test_three_specs_are_shipped():
    assert {p.name for p in SHIPPED} >= {"aws.yaml", "onprem.yaml", "local-autoscale.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_spec_validates(path):
    report = validate_file(path)
    assert report.warnings == []
    if report.provider != "local":
        workers = {k: v for k, v in report.node_types.items() if v["max_workers"]}
        assert workers and all(v["resources"]["CPU"] >= 1 for v in workers.values())
        assert report.idle_timeout_minutes > 0


def _mutate(name: str, fn) -> str:
    cfg = yaml.safe_load((ROOT / "cluster" / name).read_text())
    fn(cfg)
    return yaml.safe_dump(cfg, sort_keys=False)


def _set(path, value):
    def apply(cfg):
        *parents, last = path.split(".")
        node = cfg
        for p in parents:
            node = node[p]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return apply


_DELETE = object()

# (case id, base file, mutation, expected dotted key path, words in the message)
BROKEN = [
    ("unknown-top-key", "aws.yaml", _set("idle_timeout_minute", 5), "idle_timeout_minute",
     "unknown key; did you mean 'idle_timeout_minutes'?"),
    ("unknown-node-type-key", "aws.yaml",
     _set("available_node_types.cpu_worker.resourcez", {"CPU": 4}),
     "available_node_types.cpu_worker.resourcez", "unknown key; did you mean 'resources'?"),
    ("worker-without-cpus", "aws.yaml", _set("available_node_types.cpu_worker.resources", {}),
     "available_node_types.cpu_worker.resources.CPU", "declare the worker's CPUs"),
    ("cpu-not-integer", "local-autoscale.yaml",
     _set("available_node_types.cpu_worker.resources", {"CPU": "two"}),
     "available_node_types.cpu_worker.resources.CPU", "integer"),
    ("worker-too-small-for-a-rank", "local-autoscale.yaml",
     _set("available_node_types.cpu_worker.resources", {"CPU": 0}),
     "available_node_types", "hpc.rank_num_cpus"),
    ("min-over-max", "aws.yaml", _set("available_node_types.cpu_worker.min_workers", 9),
     "available_node_types.cpu_worker.min_workers", "min_workers 9 > max_workers 8"),
    ("head-type-missing", "aws.yaml", _set("head_node_type", "boss"), "head_node_type",
     "not one of"),
    ("no-idle-timeout", "aws.yaml", _set("idle_timeout_minutes", _DELETE),
     "idle_timeout_minutes", "explicitly"),
    ("negative-idle-timeout", "local-autoscale.yaml", _set("idle_timeout_minutes", -1),
     "idle_timeout_minutes", "> 0"),
    ("rayflow-not-installed", "aws.yaml", _set("setup_commands", ["pip install ray"]),
     "setup_commands", "installs rayflow"),
    ("auth-turned-off", "aws.yaml",
     _set("head_start_ray_commands", ["RAY_AUTH_MODE=disabled ray start --head"]),
     "head_start_ray_commands", "token authentication"),
    ("unknown-provider", "aws.yaml", _set("provider.type", "aws2"), "provider.type",
     "unknown provider"),
    ("fake-without-gcs-address", "local-autoscale.yaml", _set("provider.gcs_address", _DELETE),
     "provider.gcs_address", "required"),
    ("fake-incomplete", "local-autoscale.yaml", _set("cluster_synced_files", _DELETE),
     "cluster_synced_files", "rejected by Ray"),
    ("max-workers-below-min-sum", "aws.yaml", _set("max_workers", 0), "max_workers",
     "smaller than the sum"),
    ("local-with-node-types", "onprem.yaml",
     _set("available_node_types", {"x": {"resources": {}, "node_config": {}}}),
     "available_node_types", "head_ip"),
    ("ports-not-a-list", "aws.yaml", _set("worker_start_ray_commands", "ray start"),
     "worker_start_ray_commands", "not of type"),
]


@pytest.mark.parametrize("case,base,mutate,key,words", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_spec_names_the_bad_key(case, base, mutate, key, words):
    with pytest.raises(ClusterSpecError) as err:
        validate_text(_mutate(base, mutate), f"{case}.yaml")
    assert err.value.path == key, str(err.value)
    assert words in err.value.message, str(err.value)
    assert f"{key}:" in str(err.value)


def test_error_carries_the_line_of_the_bad_key():
    text = (ROOT / "cluster" / "aws.yaml").read_text().replace("resources: {CPU: 16}",
                                                               "resources: {GPU: 1}")
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "GPU: 1" in t)
    with pytest.raises(ClusterSpecError) as err:
        validate_text(text, "aws-gpu.yaml")
    assert err.value.line == line
    assert str(err.value).startswith(f"aws-gpu.yaml:{line}: available_node_types.cpu_worker")


def test_not_yaml_and_not_a_mapping(tmp_path):
    with pytest.raises(ClusterSpecError, match="not valid YAML"):
        validate_text("a: [1, 2", "x.yaml")
    with pytest.raises(ClusterSpecError, match="top level must be a mapping"):
        validate_text("- 1\n- 2\n", "x.yaml")
    with pytest.raises(ClusterSpecError, match="cannot read"):
        validate_file(tmp_path / "missing.yaml")


def test_gang_rank_size_rule_follows_the_config():
    text = (ROOT / "cluster" / "local-autoscale.yaml").read_text()
    validate_text(text, rank_num_cpus=2)
    with pytest.raises(ClusterSpecError, match="CPU >= 4"):
        validate_text(text, rank_num_cpus=4)


def test_cli_validate_ok_json_and_error(tmp_path):
    r = CliRunner()
    ok = r.invoke(main, ["cluster", "validate", str(ROOT / "cluster" / "aws.yaml"), "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["valid"] and doc["provider"] == "aws" and "cpu_worker" in doc["node_types"]
    plain = r.invoke(main, ["cluster", "validate", str(ROOT / "cluster" / "onprem.yaml")])
    assert plain.exit_code == 0 and "valid" in plain.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(_mutate("aws.yaml", _set("available_node_types.cpu_worker.resourcez", {})))
    res = r.invoke(main, ["cluster", "validate", str(bad)])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln]
    assert lines[0].startswith("error: ") and "available_node_types.cpu_worker.resourcez" in \
        lines[0]
    assert lines[1].startswith("hint: ") and "Traceback" not in res.output
    js = r.invoke(main, ["cluster", "validate", str(bad), "--json"])
    assert js.exit_code == 1
    doc = json.loads(js.stdout)
    assert doc["valid"] is False and doc["path"] == "available_node_types.cpu_worker.resourcez"


def _without_setup(cfg):
    del cfg["setup_commands"]


@pytest.mark.parametrize("image,warned", [("myorg/rayflow:0.1.0", False),
                                          ("myorg/stack:1", True)])
def test_container_cluster_with_rayflow_in_its_image_needs_no_setup(image, warned):
    def containerised(cfg):
        _without_setup(cfg)
        cfg["docker"] = {"image": image, "container_name": "rayflow"}

    report = validate_text(_mutate("aws.yaml", containerised), "docker.yaml")
    assert [(w.path, w.message) for w in report.warnings] == (
        [("docker.image", f"no setup command installs rayflow, so the image {image!r} must "
                          f"contain it")] if warned else [])


def test_missing_install_never_suggests_the_other_projects_pypi_name():
    with pytest.raises(ClusterSpecError) as err:
        validate_text(_mutate("aws.yaml", _without_setup), "nosetup.yaml")
    assert err.value.path == "setup_commands"
    assert "pip wheel --no-deps -w dist ." in err.value.message
    assert "pip install rayflow" not in str(err.value)
    sources = [*(ROOT / "rayflow" / "deploy").glob("*.py"), ROOT / "rayflow" / "cli.py",
               ROOT / "cluster" / "aws.yaml", ROOT / "cluster" / "onprem.yaml",
               ROOT / "docs" / "cluster.md"]
    offenders = [p for p in sources if re.search(
        r"pip install ['\"]?rayflow(\[|=|\s|$)", p.read_text())]
    assert offenders == []


def test_cluster_specs_install_the_wheel_of_this_version():
    from importlib.metadata import version

    wheel = f"rayflow_engine-{version('rayflow-engine')}-py3-none-any.whl"
    for name in ("aws.yaml", "onprem.yaml"):
        cfg = yaml.safe_load((ROOT / "cluster" / name).read_text())
        assert cfg["file_mounts"]["~/rayflow-dist"] == "./dist"
        setup = " ".join(cfg["setup_commands"])
        assert f"$HOME/rayflow-dist/{wheel}[" in setup, name
        assert not re.search(r"\brayflow(\[[^\]]*\])?==", setup), name  # no registry name


def test_documented_error_sample_is_what_validate_prints(tmp_path, monkeypatch):
    doc = (ROOT / "docs" / "cluster.md").read_text()
    cmd, out = re.search(r"Errors name the file.*?```bash\n(.*?)```\n\nprints\n\n"
                         r"(?:<!--[^\n]*-->\n)?```\n(.*?)```", doc, re.S).groups()
    sed_line, validate_line = cmd.strip().splitlines()
    (tmp_path / "cluster").symlink_to(ROOT / "cluster")
    subprocess.run(["bash", "-c", sed_line.split("#")[0]], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    args = validate_line.split("#")[0].split()
    assert args[:3] == ["rayflow", "cluster", "validate"]
    res = CliRunner().invoke(main, args[1:])
    assert res.exit_code == 1
    assert res.output == out
