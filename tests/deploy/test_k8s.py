"""The KubeRay manifests of cluster/k8s/ validate offline against KubeRay's CRD schemas, and
broken ones are rejected naming what is wrong and where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rayflow.cli import main
from rayflow.deploy.k8s import (
    KUBERAY_VERSION,
    ManifestError,
    _schema,
    strict,
    validate_manifest_dir,
    validate_manifest_text,
)

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "cluster" / "k8s"
CLUSTER = (K8S / "raycluster.yaml").read_text()


def test_every_shipped_manifest_validates():
    reports = validate_manifest_dir(K8S)
    kinds = sorted((r.kind, r.name) for rep in reports for r in rep.resources)
    jobs = sorted(p.stem for p in (ROOT / "jobs").glob("*.py"))
    assert kinds == sorted([("RayCluster", "rayflow"), ("Secret", "rayflow-ray-token"),
                            ("ConfigMap", "rayflow-kafka")]
                           + [("RayJob", f"rayflow-{j.replace('_', '-')}") for j in jobs])


def test_the_cluster_autoscales_with_token_auth_and_every_job_runs_on_it():
    cluster = yaml.safe_load(CLUSTER)["spec"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["authOptions"] == {"mode": "token", "secretName": "rayflow-ray-token"}
    (group,) = cluster["workerGroupSpecs"]
    assert group["minReplicas"] < group["maxReplicas"]
    head_env = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "KAFKA_BOOTSTRAP", "valueFrom": {"configMapKeyRef": {
        "name": "rayflow-kafka", "key": "bootstrap"}}} in head_env
    for path in (K8S / "jobs").glob("*.yaml"):
        spec = yaml.safe_load(path.read_text())["spec"]
        assert spec["clusterSelector"] == {"ray.io/cluster": "rayflow"}, path.name
        script = spec["entrypoint"].split()[1]
        assert (ROOT / script).is_file(), path.name  # the job it runs exists
        if "--bootstrap" in spec["entrypoint"]:
            assert '--bootstrap "$KAFKA_BOOTSTRAP"' in spec["entrypoint"]


@pytest.mark.parametrize("edit, where, what", [
    # a misspelt field, under the worker group
    (("rayStartParams:\n        num-cpus", "rayStartParms:\n        num-cpus"),
     "spec.workerGroupSpecs.0.rayStartParms", "unknown field 'rayStartParms'; did you mean "
                                              "'rayStartParams'?"),
    # a wrong type
    (("maxReplicas: 8", "maxReplicas: eight"), "spec.workerGroupSpecs.0.maxReplicas",
     "must be of type integer, got str 'eight'"),
    (("containerPort: 8265", "containerPort: \"8265\""),
     "spec.headGroupSpec.template.spec.containers.0.ports.1.containerPort",
     "must be of type integer, got str '8265'"),
    # deep inside the pod template (Kubernetes' core schema, as the CRD embeds it)
    (("limits: {cpu: \"8\", memory: 16Gi}", "limitz: {cpu: \"8\", memory: 16Gi}"),
     "spec.workerGroupSpecs.0.template.spec.containers.0.resources.limitz",
     "unknown field 'limitz'; did you mean 'limits'?"),
    # rayflow's rules
    (("mode: token", "mode: disabled"), "spec.authOptions.mode",
     "token authentication must stay on (mode: token)"),
    (("replicas: 1\n", "replicas: 9\n"), "spec.workerGroupSpecs.0.replicas",
     "minReplicas 1 <= replicas 9 <= maxReplicas 8 fails"),
])
def test_a_broken_cluster_is_rejected_with_what_and_where(edit, where, what):
    text = CLUSTER.replace(*edit)
    assert text != CLUSTER
    with pytest.raises(ManifestError) as err:
        validate_manifest_text(text, "bad.yaml")
    e = err.value
    assert (e.path, e.message) == (where, what)
    changed = next(n for n, (a, b) in enumerate(zip(CLUSTER.splitlines(), text.splitlines()),
                                                1) if a != b)
    assert e.line == changed  # the line of the bad field
    assert str(e) == f"bad.yaml:{changed}: {where}: {what}"


def test_the_second_document_of_a_file_is_checked_and_named():
    text = (K8S / "kafka-configmap.yaml").read_text() + "---\n" + (
        K8S / "jobs" / "cg.yaml").read_text().replace("entrypoint:", "entrypont:")
    with pytest.raises(ManifestError) as err:
        validate_manifest_text(text, "two.yaml")
    assert (err.value.doc, err.value.path) == (1, "spec.entrypont")
    assert "did you mean 'entrypoint'?" in err.value.message


def test_unknown_kinds_and_missing_names_are_errors():
    with pytest.raises(ManifestError, match="no schema for RayService ray.io/v1; known: "):
        validate_manifest_text("apiVersion: ray.io/v1\nkind: RayService\nmetadata: {name: x}\n")
    with pytest.raises(ManifestError, match="metadata.name: missing required field 'name'"):
        validate_manifest_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\ndata: {a: b}\n")
    with pytest.raises(ManifestError, match="data.port: must be of type string, got int 9092"):
        validate_manifest_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: k}\n"
                               "data: {port: 9092}\n")


def test_strict_closes_listed_objects_but_keeps_preserved_ones_open():
    s = strict({"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {"type": "string"}}},
        "b": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
              "properties": {"y": {}}},
        "c": {"type": "object", "additionalProperties": {"type": "string"}}}})
    assert s["additionalProperties"] is False
    assert s["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in s["properties"]["b"]
    assert s["properties"]["c"]["additionalProperties"] == {"type": "string"}


def test_the_vendored_schemas_are_kuberays():
    cluster = _schema(("ray.io/v1", "RayCluster"))
    job = _schema(("ray.io/v1", "RayJob"))
    spec = cluster["properties"]["spec"]["properties"]
    assert {"headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling",
            "authOptions"} <= set(spec)
    assert "rayClusterSpec" in job["properties"]["spec"]["properties"]
    assert KUBERAY_VERSION == "v1.7.0"


def test_cli_validates_a_directory_and_reports_a_broken_file_as_json(tmp_path):
    r = CliRunner().invoke(main, ["cluster", "validate", str(K8S)])
    assert r.exit_code == 0, r.output
    assert f"raycluster.yaml: valid (RayCluster rayflow; KubeRay {KUBERAY_VERSION} CRD " \
           "schema)" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(CLUSTER.replace("rayVersion:", "rayVersoin:"))
    r = CliRunner().invoke(main, ["cluster", "validate", str(bad), "--json"])
    assert r.exit_code == 1
    out = json.loads(r.output)
    assert (out["valid"], out["path"], out["document"]) == (False, "spec.rayVersoin", 0)
    assert out["error"] == "unknown field 'rayVersoin'; did you mean 'rayVersion'?"
