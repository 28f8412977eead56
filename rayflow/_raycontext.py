"""Connect to Ray, or start the embedded local instance.

Ray is imported lazily so that importing the rayflow API does not import Ray.
``RAY_AUTH_MODE=token`` must be in the environment before Ray is imported when a
client connects to a cluster by address (see RAY_NOTES: token auth is on by default),
so it is set here, once, for every entry point.
"""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "token")


def ensure_ray(address: str | None = None, num_cpus: int | None = None, **kwargs: Any) -> Any:
    """Return the ``ray`` module, initialised.

    Args:
        address: a cluster address (``ray://`` or ``host:port`` or ``auto``). ``None`` starts a
            private local instance with ``address="local"``, never attaching to another
            cluster on the machine by accident.
        num_cpus: logical CPUs of the local instance (ignored when connecting).
        **kwargs: passed to ``ray.init`` (e.g. ``include_dashboard``, ``namespace``).
    """
    import ray

    if ray.is_initialized():
        return ray
    kwargs.setdefault("log_to_driver", True)
    kwargs.setdefault("ignore_reinit_error", True)
    if address is None:
        kwargs.setdefault("include_dashboard", False)
        # Workers of the local instance run on this machine: give them the driver's import
        # path, so functions from a script's sibling modules (not installed) unpickle there.
        runtime_env = dict(kwargs.pop("runtime_env", None) or {})
        env_vars = dict(runtime_env.get("env_vars", {}))
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        env_vars.setdefault("PYTHONPATH", os.pathsep.join(paths))
        # glibc's adaptive mmap threshold lets a worker's heap keep freed large buffers
        # (images, batches): +120-180 MB per actor at 1200 px images. Fixed thresholds
        # return them to the OS (measured by the W1 benchmark).
        env_vars.setdefault("MALLOC_MMAP_THRESHOLD_", "262144")
        env_vars.setdefault("MALLOC_TRIM_THRESHOLD_", "1048576")
        runtime_env["env_vars"] = env_vars
        # free dead objects every 100 ms instead of every second: with large batches in
        # flight the store otherwise holds several windows' worth of garbage
        system_config = dict(kwargs.pop("_system_config", None) or {})
        system_config.setdefault("free_objects_period_milliseconds", 100)
        ray.init(address="local", num_cpus=num_cpus, runtime_env=runtime_env,
                 _system_config=system_config, **kwargs)
    else:
        kwargs.pop("include_dashboard", None)
        ray.init(address=address, **kwargs)
    return ray
