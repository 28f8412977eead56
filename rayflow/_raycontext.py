"""Connect to Ray, or start the embedded local instance.

Ray is imported lazily so that importing the rayflow API does not import Ray.
``RAY_AUTH_MODE=token`` must be in the environment before Ray is imported when a
client connects to a cluster by address (see RAY_NOTES: token auth is on by default),
so it is set here, once, for every entry point.
"""

from __future__ import annotations

import os
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
        ray.init(address="local", num_cpus=num_cpus, **kwargs)
    else:
        kwargs.pop("include_dashboard", None)
        ray.init(address=address, **kwargs)
    return ray
