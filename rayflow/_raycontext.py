"""Connect to Ray, or start the embedded local instance.

Ray is imported lazily so that importing the rayflow API does not import Ray.
``RAY_AUTH_MODE=token`` must be in the environment before Ray is imported when a
client connects to a cluster by address (Ray 2.60 turns token authentication on by
default), so it is set here, once, for every entry point, unless the program imported Ray
first (:func:`auth_mode`). The public entry point is :func:`rayflow.init`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


def auth_mode() -> None:
    """Ask for Ray's token authentication (``RAY_AUTH_MODE=token``) unless the environment
    says otherwise, if Ray is not imported yet. Ray reads the mode when it is imported: when
    a program imported Ray before rayflow, setting it now would start a local instance
    whose processes want a token that this process does not send (``InvalidAuthToken``), so
    it is left as Ray read it."""
    if "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")


auth_mode()

# The GCS address of the local instance this process started (None: none, or it was
# connected to by address), so that callers can tell the embedded Ray from a cluster.
_embedded_gcs: str | None = None


def ensure_ray(address: str | None = None, num_cpus: int | None = None, **kwargs: Any) -> Any:
    """Return the ``ray`` module, initialised.

    Args:
        address: a cluster address (``ray://`` or ``host:port`` or ``auto``). ``None`` starts a
            private local instance with ``address="local"``, never attaching to another
            cluster on the machine by accident.
        num_cpus: logical CPUs of the local instance (ignored when connecting).
        **kwargs: passed to ``ray.init`` (e.g. ``include_dashboard``, ``namespace``), except
            ``process_profile``: the named profile (``ray.process_profiles``) whose
            environment every worker process of the job gets (default: the configured
            ``ray.process_profile``): on a cluster through the job's runtime env; locally the
            local instance's processes inherit it (with a runtime env only when the caller
            gives one with more than variables); variables given in ``runtime_env`` win over
            it; and ``process_env``: that environment itself (a job passes its own
            configuration's profile).
    """
    import ray

    if ray.is_initialized():
        return ray
    kwargs.setdefault("log_to_driver", True)
    kwargs.setdefault("ignore_reinit_error", True)
    from rayflow.config import load_config

    # the job's runtime env: the process profile's variables, under those the caller gives
    given = kwargs.pop("process_env", None)  # a job's own configuration resolved it
    name = kwargs.pop("process_profile", None)
    profile = dict(given) if given is not None else load_config().ray.process_env(name)
    runtime_env = dict(kwargs.pop("runtime_env", None) or {})
    env_vars = {**profile, **runtime_env.get("env_vars", {})}
    if address is None:
        if "include_dashboard" not in kwargs:  # e.g. RAYFLOW_RAY__INCLUDE_DASHBOARD=1
            kwargs["include_dashboard"] = load_config().ray.include_dashboard
        # Workers of the local instance run on this machine: give them the driver's import
        # path, so functions from a script's sibling modules (not installed) unpickle there.
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        env_vars.setdefault("PYTHONPATH", os.pathsep.join(paths))
        # the configured settings (ray.inline_bytes) under the caller's
        system_config = {**load_config().ray.system_config(),
                         **(kwargs.pop("_system_config", None) or {})}
        # free dead objects every 100 ms instead of every second: with large batches in
        # flight the store otherwise holds several windows' worth of garbage
        system_config.setdefault("free_objects_period_milliseconds", 100)
        if set(runtime_env) - {"env_vars"}:  # a working_dir, pip...: Ray's runtime env
            runtime_env["env_vars"] = env_vars
            ray.init(address="local", num_cpus=num_cpus, runtime_env=runtime_env,
                     _system_config=system_config, **kwargs)
        else:
            # Only variables: the local instance's processes inherit them from this one,
            # and so do the workers they start. As a job's runtime env, every worker would
            # wait for Ray's runtime-env agent, and no pre-started worker would serve an
            # actor: starting three actors took 2-3x as long on a 2-core machine.
            with _environment(env_vars):
                ray.init(address="local", num_cpus=num_cpus, _system_config=system_config,
                         **kwargs)
        global _embedded_gcs
        _embedded_gcs = ray.get_runtime_context().gcs_address
    else:
        kwargs.pop("include_dashboard", None)
        if env_vars:  # Ray merges them with a submitted job's own runtime env
            runtime_env["env_vars"] = env_vars
        try:
            ray.init(address=address, runtime_env=runtime_env or None, **kwargs)
        except ray.exceptions.AuthenticationError as exc:
            if os.environ.get("RAY_AUTH_MODE") == "token":
                raise
            raise ConnectionError(
                f"Ray at {address} wants a token, and this process imported Ray without "
                "RAY_AUTH_MODE=token: set RAY_AUTH_MODE=token in the environment, or import "
                "rayflow before ray") from exc
    return ray


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment while the block runs (for the processes it
    starts), the previous values back afterwards."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def is_embedded() -> bool:
    """Whether this process is connected to the local Ray it started itself (which no
    autoscaler grows: what it has is all there will be)."""
    import ray

    return (_embedded_gcs is not None and ray.is_initialized()
            and ray.get_runtime_context().gcs_address == _embedded_gcs)


def ensure_ray_default() -> Any:
    """Ray for a library call made before anything started it (``BlockDataset``, ``mpimap``).

    Inside a process that Ray started for a job (``RAY_ADDRESS`` holds a cluster address)
    this connects to that cluster, as ``ray.init()`` would; anywhere else it starts the
    embedded local instance, as :func:`rayflow.init` does by default.
    """
    import ray

    if ray.is_initialized():
        return ray
    address = os.environ.get("RAY_ADDRESS") or None
    if address is not None and "://" in address and not address.startswith("ray://"):
        address = None  # a dashboard URL (for job submission), not a cluster to join
    return ensure_ray(address)


def dashboard_available() -> bool:
    """Whether this Python can run Ray's dashboard (``ray[default]`` is installed)."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401 - the import is the check Ray does
    except ImportError:
        return False
    return True


def dashboard_url() -> str | None:
    """``http://host:port`` of the dashboard of the Ray this process is connected to, or
    None. (Ray's public ``get_dashboard_url`` is deprecated in favour of the context that
    ``ray.init`` returns, which a caller of :func:`ensure_ray` does not hold.)"""
    import ray

    if not ray.is_initialized():
        return None
    try:
        node = ray._private.worker._global_node
        url = node.webui_url if node is not None else None
    except Exception:  # noqa: BLE001 - a private attribute: absent in another Ray
        return None
    if not url:
        return None
    return url if "://" in url else "http://" + url
