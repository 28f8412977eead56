"""Offline validation of KubeRay manifests (``cluster/k8s/``) against KubeRay's CRD schemas.

    from rayflow.deploy.k8s import validate_manifest_file
    report = validate_manifest_file("cluster/k8s/raycluster.yaml")  # ManifestError on the first error

The schemas are the ``openAPIV3Schema`` of the ``v1`` version of KubeRay's ``RayCluster`` and
``RayJob`` CRDs, vendored from the release in :data:`KUBERAY_VERSION`
(``ray-operator/config/crd/bases/ray.io_{rayclusters,rayjobs}.yaml``), trimmed of their
``description`` texts and of ``status`` (which a manifest never sets), otherwise unchanged;
:func:`vendor_crd` made them. ``Secret`` and ``ConfigMap`` are checked against a short schema
of the fields a manifest here uses (Kubernetes' own is much larger).

The API server prunes or rejects fields that a structural schema does not name, but a JSON
schema allows them unless ``additionalProperties`` says otherwise, so :func:`strict` closes
every object schema that lists its properties (except where Kubernetes keeps unknown fields,
``x-kubernetes-preserve-unknown-fields``): a misspelt field is an error here, as with
``kubectl apply --validate=strict``. ``jsonschema`` (a dependency for this) does the checks.

rayflow's own rules on top: Ray's token authentication is not turned off, worker groups have
``minReplicas <= replicas <= maxReplicas``, and a RayJob says where it runs (a
``clusterSelector`` or its own ``rayClusterSpec``).
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rayflow.config import did_you_mean, yaml_key_line
from rayflow.deploy.spec import unknown_schema_key
from rayflow.errors import ConfigError

KUBERAY_VERSION = "v1.7.0"
KUBERAY_COMMIT = "59d663aeec13760646da3db9c1cf8cfe883e30b7"
_CRDS = {("ray.io/v1", "RayCluster"): "rayclusters.v1.json.gz",
         ("ray.io/v1", "RayJob"): "rayjobs.v1.json.gz"}

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
    "namespace": {"type": "string"}, "labels": _STR_MAP, "annotations": _STR_MAP,
    "generateName": {"type": "string"}}}
_CORE = {
    ("v1", "Secret"): {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": _META,
        "type": {"type": "string"}, "immutable": {"type": "boolean"},
        "data": _STR_MAP, "stringData": _STR_MAP}},
    ("v1", "ConfigMap"): {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": _META,
        "immutable": {"type": "boolean"}, "data": _STR_MAP, "binaryData": _STR_MAP}},
}


class ManifestError(ConfigError):
    """A manifest is invalid: ``path`` is the dotted path to the bad field in document
    ``doc`` (0-based) of ``file``, ``line`` its line when known."""

    def __init__(self, file: str, path: str, message: str, line: int | None = None,
                 doc: int = 0):
        self.file, self.path, self.message, self.line, self.doc = file, path, message, line, doc
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {path or '<top>'}: {message}")

    def __reduce__(self):
        return (ManifestError, (self.file, self.path, self.message, self.line, self.doc))


@dataclass
class Resource:
    """One validated document."""

    api_version: str
    kind: str
    name: str
    summary: str = ""


@dataclass
class ManifestReport:
    file: str
    resources: list[Resource] = field(default_factory=list)

    @property
    def schema(self) -> str:
        kinds = {(r.api_version, r.kind) for r in self.resources}
        return (f"KubeRay {KUBERAY_VERSION} CRD schema" if kinds & set(_CRDS)
                else "Kubernetes core v1 fields")

    def as_dict(self) -> dict:
        return {"file": self.file, "valid": True, "schema": self.schema,
                "resources": [r.__dict__ for r in self.resources]}


def is_manifest(text: str) -> bool:
    """Whether YAML ``text`` holds Kubernetes objects (``apiVersion`` and ``kind``) rather
    than a Ray cluster-launcher spec."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        return False
    return bool(docs) and all(isinstance(d, dict) and "apiVersion" in d and "kind" in d
                              for d in docs)


def validate_manifest_file(path: str | Path) -> ManifestReport:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(str(path), "", f"cannot read: {exc.strerror or exc}") from None
    return validate_manifest_text(text, str(path))


def validate_manifest_text(text: str, name: str = "<manifest>") -> ManifestReport:
    """Validate every document of the YAML ``text``; raise :class:`ManifestError` on the
    first problem, naming the document's field path and line."""
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ManifestError(name, "", f"not valid YAML: {getattr(exc, 'problem', exc)}",
                            mark.line + 1 if mark else None) from None
    report = ManifestReport(name)
    for i, (doc, node) in enumerate(zip(docs, nodes)):
        if doc is None:
            continue

        def fail(p: str, msg: str, node=node, i=i) -> ManifestError:
            return ManifestError(name, p, msg, yaml_key_line(node, p), i)

        if not isinstance(doc, dict):
            raise fail("", f"a document must be a mapping, got {type(doc).__name__}")
        for field_name in ("apiVersion", "kind"):
            if not isinstance(doc.get(field_name), str):
                raise fail(field_name, f"missing {field_name} (a string)")
        schema = _schema((doc["apiVersion"], doc["kind"]))
        if schema is None:
            known = ", ".join(f"{k} {a}" for a, k in sorted({**_CRDS, **_CORE}))
            raise fail("kind", f"no schema for {doc['kind']} {doc['apiVersion']}; known: {known}")
        _check_schema(doc, schema, fail)
        errors = rayflow_rules(doc)
        if errors:
            raise fail(*errors[0])
        report.resources.append(Resource(doc["apiVersion"], doc["kind"],
                                         doc["metadata"]["name"], _summary(doc)))
    if not report.resources:
        raise ManifestError(name, "", "no Kubernetes object in the file")
    return report


def validate_manifest_dir(path: str | Path) -> list[ManifestReport]:
    """Every ``*.yaml`` under ``path`` (recursively), in name order."""
    files = sorted(Path(path).rglob("*.yaml"))
    if not files:
        raise ManifestError(str(path), "", "no *.yaml file in the directory")
    return [validate_manifest_file(f) for f in files]


def rayflow_rules(doc: dict) -> list[tuple[str, str]]:
    """rayflow's rules beyond the schema: ``(path, message)`` of each problem."""
    errors: list[tuple[str, str]] = []
    spec = doc.get("spec") or {}
    if doc["kind"] == "RayJob":
        if not spec.get("clusterSelector") and not spec.get("rayClusterSpec"):
            errors.append(("spec", "a RayJob needs spec.clusterSelector (an existing "
                                   "RayCluster) or spec.rayClusterSpec (its own)"))
        if not spec.get("entrypoint"):
            errors.append(("spec.entrypoint", "missing: the command the job runs"))
        cluster, prefix = spec.get("rayClusterSpec") or {}, "spec.rayClusterSpec"
    elif doc["kind"] == "RayCluster":
        cluster, prefix = spec, "spec"
    else:
        return errors
    if (cluster.get("authOptions") or {}).get("mode") == "disabled":
        errors.append((f"{prefix}.authOptions.mode", "token authentication must stay on "
                                                     "(mode: token)"))
    for n, group in enumerate(cluster.get("workerGroupSpecs") or []):
        lo, hi = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
        want = group.get("replicas", lo)
        if not lo <= want <= hi:
            errors.append((f"{prefix}.workerGroupSpecs.{n}.replicas",
                           f"minReplicas {lo} <= replicas {want} <= maxReplicas {hi} fails"))
    return errors


def _summary(doc: dict) -> str:
    spec = doc.get("spec") or {}
    if doc["kind"] == "RayCluster":
        groups = ", ".join(f"{g['groupName']} {g.get('minReplicas', 0)}.."
                           f"{g.get('maxReplicas', '?')}"
                           for g in spec.get("workerGroupSpecs") or [])
        auto = "autoscaling" if spec.get("enableInTreeAutoscaling") else "fixed size"
        return f"{auto}; worker groups: {groups or 'none'}"
    if doc["kind"] == "RayJob":
        return str(spec.get("entrypoint", ""))
    return ", ".join(sorted((doc.get("data") or {}) | (doc.get("stringData") or {})))


# -- schemas --------------------------------------------------------------------------------
@functools.cache
def _schema(key: tuple[str, str]) -> dict | None:
    if key in _CORE:
        return strict(_CORE[key])
    name = _CRDS.get(key)
    if name is None:
        return None
    raw = resources.files("rayflow.deploy").joinpath("kuberay").joinpath(name).read_bytes()
    schema = json.loads(gzip.decompress(raw))
    schema["properties"]["metadata"] = _META  # a CRD schema says only "object"
    return strict(schema)


def strict(schema: Any) -> Any:
    """A copy of ``schema`` in which every object schema that lists its ``properties`` and
    says nothing of others allows no others (what the API server's pruning means), unless
    it keeps unknown fields (``x-kubernetes-preserve-unknown-fields``)."""
    schema = copy.deepcopy(schema)

    def close(s: Any) -> None:
        if isinstance(s, dict):
            if ("properties" in s and "additionalProperties" not in s
                    and not s.get("x-kubernetes-preserve-unknown-fields")):
                s["additionalProperties"] = False
            for v in s.values():
                close(v)
        elif isinstance(s, list):
            for v in s:
                close(v)

    close(schema)
    return schema


def _check_schema(doc: dict, schema: dict, fail) -> None:
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: (list(map(str, e.absolute_path)),
                                                              e.validator != "additionalProperties"))
    if not errors:
        return
    exc = errors[0]
    parts = [str(p) for p in exc.absolute_path]
    unknown, allowed = unknown_schema_key(exc)
    if unknown is not None:
        hint = did_you_mean(unknown, allowed) or (
            f"; known: {', '.join(allowed)}" if len(allowed) <= 12 else "")
        raise fail(".".join(parts + [unknown]), f"unknown field {unknown!r}{hint}")
    if exc.validator == "required":
        missing = [k for k in exc.validator_value if k not in (exc.instance or {})]
        raise fail(".".join(parts + missing[:1]), f"missing required field {missing[0]!r}")
    if exc.validator == "type":
        want = exc.validator_value
        raise fail(".".join(parts), f"must be of type {want}, got "
                                    f"{type(exc.instance).__name__} {exc.instance!r}")
    raise fail(".".join(parts), f"{exc.message} (schema rule {exc.validator!r})")


def vendor_crd(crd_yaml: str | Path, out: str | Path, version: str = "v1") -> None:
    """Write the trimmed ``openAPIV3Schema`` of ``version`` of the CRD file ``crd_yaml`` (from
    KubeRay's ``ray-operator/config/crd/bases/``) to ``out`` (gzipped JSON)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(Path(crd_yaml).read_text(), Loader=loader)
    ver = next(v for v in crd["spec"]["versions"] if v["name"] == version)

    def trim(o: Any) -> Any:
        if isinstance(o, dict):
            return {k: trim(v) for k, v in o.items() if k != "description"}
        if isinstance(o, list):
            return [trim(v) for v in o]
        return o

    schema = trim(ver["schema"]["openAPIV3Schema"])
    schema.get("properties", {}).pop("status", None)
    text = json.dumps(schema, separators=(",", ":"), sort_keys=True)
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        f.write(text.encode())
