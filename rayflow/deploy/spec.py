"""Offline validation of Ray cluster-launcher YAML, plus rayflow's own rules.

    from rayflow.deploy.spec import validate_file
    report = validate_file("cluster/aws.yaml")     # raises ClusterSpecError on the first error
    report.warnings                                # soft findings, e.g. an unpinned Ray

Two layers:

1. Ray's own checks: ``prepare_config`` (merge the provider's defaults) then
   ``validate_config`` (the JSON schema, ``head_node_type``, ``min_workers`` sums) from
   ``ray.autoscaler._private.util``. That is a private API, so it is imported in one place
   (:func:`_ray_validators`), and the Ray versions it was checked against are pinned in
   :data:`TESTED_RAY`. The fake multi-node provider is validated without defaults: Ray's
   autoscaler reads such a file as it is (no ``prepare_config``), so it must be complete.
2. rayflow's rules (:func:`rayflow_rules`): every worker node type declares the CPUs that a
   gang rank asks for (``hpc.rank_num_cpus``), so the autoscaler can plan a gang; there is an
   explicit idle timeout, so a cluster shrinks after a job; min/max workers are consistent;
   cloud and on-prem nodes install rayflow in their setup commands (or run a container
   image, which must contain it); and Ray's token authentication is not turned off.

Every error names the path to the bad key (``available_node_types.cpu_worker.resources``)
and, when known, its line in the file.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rayflow.config import did_you_mean, yaml_key_line
from rayflow.errors import ConfigError

# Ray versions whose private validators (prepare_config / validate_config) rayflow was run
# against; another version still works, with a warning in the report.
TESTED_RAY = ("2.60",)

# providers that launch nodes from node types (the autoscaler needs each type's resources)
AUTOSCALING_PROVIDERS = {"aws", "gcp", "azure", "fake_multinode", "vsphere", "aliyun"}
KNOWN_PROVIDERS = AUTOSCALING_PROVIDERS | {"local", "kuberay", "external", "readonly",
                                          "fake_multinode_docker", "spark"}
_SETUP_KEYS = ("setup_commands", "head_setup_commands", "worker_setup_commands",
               "initialization_commands")


class ClusterSpecError(ConfigError):
    """A cluster spec is invalid. ``path`` is the dotted path to the bad key."""

    def __init__(self, file: str, path: str, message: str, line: int | None = None):
        self.file, self.path, self.message, self.line = file, path, message, line
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {path or '<top>'}: {message}")

    def __reduce__(self):
        return (ClusterSpecError, (self.file, self.path, self.message, self.line))


@dataclass(frozen=True)
class Finding:
    """One problem found by a rule: where (dotted key path) and what."""

    path: str
    message: str


@dataclass
class SpecReport:
    """The outcome of a successful validation."""

    file: str
    cluster_name: str
    provider: str
    node_types: dict[str, dict[str, Any]]
    max_workers: int | None
    idle_timeout_minutes: float | None
    warnings: list[Finding] = field(default_factory=list)
    ray_version: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "valid": True,
            "cluster_name": self.cluster_name,
            "provider": self.provider,
            "node_types": self.node_types,
            "max_workers": self.max_workers,
            "idle_timeout_minutes": self.idle_timeout_minutes,
            "warnings": [f"{w.path}: {w.message}" for w in self.warnings],
            "ray_version": self.ray_version,
        }


def validate_file(path: str | Path, rank_num_cpus: float | None = None) -> SpecReport:
    """Validate a cluster YAML file; raise :class:`ClusterSpecError` on the first error."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ClusterSpecError(str(path), "", f"cannot read: {exc.strerror or exc}") from None
    return validate_text(text, str(path), rank_num_cpus)


def validate_text(text: str, name: str = "<spec>",
                  rank_num_cpus: float | None = None) -> SpecReport:
    """Validate the YAML ``text`` of a cluster spec (``name`` is used in messages)."""
    try:
        config = yaml.safe_load(text)
        lines = _line_index(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ClusterSpecError(name, "", f"not valid YAML: {getattr(exc, 'problem', exc)}",
                               mark.line + 1 if mark else None) from None
    if not isinstance(config, dict):
        raise ClusterSpecError(name, "", f"top level must be a mapping, got "
                                         f"{type(config).__name__}")

    def fail(p: str, msg: str) -> ClusterSpecError:
        return ClusterSpecError(name, p, msg, _line_of(lines, p))

    if rank_num_cpus is None:
        from rayflow.config import load_config

        rank_num_cpus = load_config().hpc.rank_num_cpus
    # rayflow's rules first: they name the key a user must fix before Ray's schema errors
    # (which cover the same keys less clearly) and need no defaults
    errors, warnings = rayflow_rules(config, rank_num_cpus)
    if errors:
        raise fail(errors[0].path, errors[0].message)
    prepared = _ray_validate(config, fail)
    ray_version, version_note = _ray_version_note()
    if version_note:
        warnings.append(Finding("", version_note))
    types = prepared.get("available_node_types") or {}
    return SpecReport(
        file=name,
        cluster_name=str(config.get("cluster_name", "")),
        provider=config["provider"]["type"],
        node_types={k: {"resources": v.get("resources", {}),
                        "min_workers": v.get("min_workers", 0),
                        "max_workers": v.get("max_workers")} for k, v in types.items()},
        max_workers=prepared.get("max_workers"),
        idle_timeout_minutes=prepared.get("idle_timeout_minutes"),
        warnings=warnings,
        ray_version=ray_version,
    )


# -- rayflow's rules ------------------------------------------------------------------------
def rayflow_rules(config: dict[str, Any], rank_num_cpus: float = 1.0
                  ) -> tuple[list[Finding], list[Finding]]:
    """rayflow's own checks of a raw (not yet defaulted) spec: ``(errors, warnings)``."""
    errors: list[Finding] = []
    warnings: list[Finding] = []
    provider = config.get("provider")
    if not isinstance(provider, dict) or "type" not in provider:
        return [Finding("provider.type", "required: the node provider (aws, local, "
                                         "fake_multinode, ...)")], warnings
    ptype = provider["type"]
    if ptype not in KNOWN_PROVIDERS:
        errors.append(Finding("provider.type", f"unknown provider {ptype!r}; known: "
                                               f"{', '.join(sorted(KNOWN_PROVIDERS))}"))
        return errors, warnings
    if ptype == "fake_multinode":
        for key in ("gcs_address", "disable_launch_config_check"):
            if key not in provider:
                errors.append(Finding(f"provider.{key}", "required by rayflow for the fake "
                                      "multi-node provider (see cluster/local-autoscale.yaml)"))
    idle = config.get("idle_timeout_minutes")
    if ptype != "local" and idle is None:
        errors.append(Finding("idle_timeout_minutes", "set it explicitly: it decides when "
                                                      "idle workers go (and what they cost)"))
    elif idle is not None and (not isinstance(idle, (int, float)) or idle <= 0):
        errors.append(Finding("idle_timeout_minutes", f"must be a number > 0, got {idle!r}"))

    types = config.get("available_node_types")
    if ptype in AUTOSCALING_PROVIDERS:
        if not isinstance(types, dict) or not types:
            errors.append(Finding("available_node_types", "required: a head type and at "
                                                          "least one worker type"))
            return errors, warnings
        head = config.get("head_node_type")
        if head not in types:
            errors.append(Finding("head_node_type", f"{head!r} is not one of "
                                                    f"available_node_types {sorted(types)}"))
            return errors, warnings
        total_max = 0
        fits_rank = False
        for tname, t in types.items():
            base = f"available_node_types.{tname}"
            if not isinstance(t, dict):
                errors.append(Finding(base, "must be a mapping"))
                continue
            if tname == head:
                continue
            res = t.get("resources")
            if not isinstance(res, dict) or "CPU" not in res:
                errors.append(Finding(f"{base}.resources.CPU", "declare the worker's CPUs: "
                                      "the autoscaler plans gangs and actors from it"))
                continue
            cpu = res["CPU"]
            if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu < 0:
                errors.append(Finding(f"{base}.resources.CPU", f"must be a whole number of "
                                      f"CPUs >= 0 (an integer, as Ray's schema says), got {cpu!r}"))
                continue
            if cpu >= rank_num_cpus:
                fits_rank = True
            lo, hi = t.get("min_workers", 0), t.get("max_workers")
            if hi is None:
                warnings.append(Finding(f"{base}.max_workers", "unset: falls back to the "
                                        "global max_workers"))
            elif isinstance(lo, int) and isinstance(hi, int) and lo > hi:
                errors.append(Finding(f"{base}.min_workers",
                                      f"min_workers {lo} > max_workers {hi}"))
            total_max += hi or 0
        if not errors and not fits_rank:
            errors.append(Finding("available_node_types",
                                  f"no worker node type has CPU >= {rank_num_cpus:g}, what one "
                                  "MPI gang rank asks for (hpc.rank_num_cpus): gangs would "
                                  "never be placed on workers"))
        gmax = config.get("max_workers")
        if isinstance(gmax, int) and total_max and gmax > total_max:
            warnings.append(Finding("max_workers", f"{gmax} exceeds the node types' sum "
                                                   f"{total_max}; the sum is the real limit"))
    elif ptype == "local" and types:
        errors.append(Finding("available_node_types", "the local provider takes "
                              "provider.head_ip and provider.worker_ips, not node types"))

    setup = _setup_text(config)
    images = _docker_images(config)
    if ptype not in ("fake_multinode", "fake_multinode_docker", "kuberay", "spark"):
        if "rayflow" not in setup and images:
            # a container cluster whose image has rayflow baked in needs no setup command;
            # an image whose name does not say so gets a reminder
            for where, image in images:
                if "rayflow" not in image:
                    warnings.append(Finding(where, f"no setup command installs rayflow, so "
                                            f"the image {image!r} must contain it"))
        elif "rayflow" not in setup:
            errors.append(Finding("setup_commands", "no setup command installs rayflow: jobs "
                                  "import it on every node. Build its wheel in the checkout "
                                  "(pip wheel --no-deps -w dist .), mount it with "
                                  "file_mounts and pip install the mounted file (as "
                                  "cluster/aws.yaml does), or use an image that has it"))
        elif "ray" in setup and not re.search(r"ray\[[^\]]*\]\s*==|ray==", setup):
            warnings.append(Finding("setup_commands", "Ray is not pinned: the head, workers "
                                    "and your laptop should run the same Ray version"))
    starts = " ".join(str(c) for k in ("head_start_ray_commands", "worker_start_ray_commands")
                      for c in (config.get(k) or []))
    if re.search(r"RAY_AUTH_MODE=(?!token)", starts + " " + setup):
        errors.append(Finding("head_start_ray_commands", "token authentication is turned "
                              "off; rayflow keeps RAY_AUTH_MODE=token (see docs/cluster.md)"))
    return errors, warnings


def _setup_text(config: dict[str, Any]) -> str:
    return " ".join(str(c) for k in _SETUP_KEYS for c in (config.get(k) or []))


def _docker_images(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(dotted path, image) of every container image the spec names: the cluster's
    ``docker`` section and each node type's."""
    keys = ("image", "head_image", "worker_image")
    found = []
    docker = config.get("docker")
    if isinstance(docker, dict):
        found += [(f"docker.{k}", str(docker[k])) for k in keys if docker.get(k)]
    for tname, t in (config.get("available_node_types") or {}).items():
        d = t.get("docker") if isinstance(t, dict) else None
        if isinstance(d, dict):
            found += [(f"available_node_types.{tname}.docker.{k}", str(d[k]))
                      for k in keys if d.get(k)]
    return found


# -- Ray's checks (a private API, wrapped here) ---------------------------------------------
def _ray_validators():
    try:
        from ray.autoscaler._private import util
    except ImportError as exc:  # pragma: no cover - depends on the installed Ray
        raise ConfigError(f"this Ray has no cluster-spec validators ({exc}); rayflow was "
                          f"tested with Ray {', '.join(TESTED_RAY)}") from None
    return util.prepare_config, util.validate_config


def _ray_version_note() -> tuple[str, str]:
    import ray

    v = ray.__version__
    if not any(v == t or v.startswith(t + ".") for t in TESTED_RAY):
        return v, (f"validated with Ray {v}'s private validators; rayflow pins them for "
                   f"{', '.join(TESTED_RAY)}")
    return v, ""


def _ray_validate(config: dict[str, Any], fail) -> dict[str, Any]:
    """Ray's prepare + validate; errors become ClusterSpecError with the key path."""
    import logging

    import jsonschema

    prepare, validate = _ray_validators()
    config = copy.deepcopy(config)
    # Ray's validators log defaults they fill in ("setting max workers for head node type
    # to 0") at INFO: not a finding, and it broke the one-line error output
    ray_log = logging.getLogger("ray.autoscaler._private.util")
    old_level = ray_log.level
    ray_log.setLevel(logging.WARNING)
    try:
        # the autoscaler reads a fake multi-node spec as it is (no defaults): validate it so
        prepared = config if config["provider"]["type"] == "fake_multinode" else prepare(config)
        validate(prepared)
    except jsonschema.ValidationError as exc:
        raise fail(_schema_path(exc), _schema_message(exc)) from None
    except SystemExit as exc:  # cli_logger.abort in prepare_local
        raise fail("provider", f"rejected by Ray: {exc}") from None
    except (ValueError, RuntimeError, KeyError, TypeError, NotImplementedError) as exc:
        msg = str(exc).strip("'\"")
        raise fail(_guess_path(msg), f"rejected by Ray: {msg}") from None
    except Exception as exc:  # noqa: BLE001 - click.Abort etc. from Ray's CLI logger
        raise fail("provider", f"rejected by Ray: {type(exc).__name__}: {exc}") from None
    finally:
        ray_log.setLevel(old_level)
    return prepared


def unknown_schema_key(exc) -> tuple[str | None, list[str]]:
    """Of a jsonschema ``additionalProperties`` error: the first key the schema does not
    know (None for another error), and the keys it knows."""
    if exc.validator != "additionalProperties" or not isinstance(exc.instance, dict):
        return None, []
    allowed = sorted((exc.schema or {}).get("properties", {}))
    extra = sorted(str(k) for k in exc.instance if k not in allowed)
    return (extra[0] if extra else None), allowed


def _schema_path(exc) -> str:
    parts = [str(p) for p in exc.absolute_path]
    unknown, _ = unknown_schema_key(exc)
    if unknown is not None:
        parts.append(unknown)
    elif exc.validator == "required" and isinstance(exc.validator_value, list):
        missing = [k for k in exc.validator_value if k not in (exc.instance or {})]
        if missing:
            parts.append(str(missing[0]))
    return ".".join(parts)


def _schema_message(exc) -> str:
    if exc.validator == "additionalProperties":
        unknown, allowed = unknown_schema_key(exc)
        hint = did_you_mean(unknown, allowed) if unknown is not None else ""
        return f"unknown key{hint} ({exc.message.split('(')[-1].rstrip(')')})"
    if exc.validator == "required":
        return exc.message
    return f"{exc.message} (schema rule {exc.validator!r})"


def _guess_path(msg: str) -> str:
    for key in ("head_node_type", "max_workers", "available_node_types", "provider",
                "cluster_synced_files", "file_mounts_sync_continuously", "docker"):
        if key in msg:
            return key
    return ""


# -- line numbers ---------------------------------------------------------------------------
def _line_index(text: str) -> Any:
    return yaml.compose(text, Loader=yaml.SafeLoader)


def _line_of(root: Any, dotted: str) -> int | None:
    """Line (1-based) of the key at ``dotted`` in the composed YAML, or its nearest parent."""
    return yaml_key_line(root, dotted)
