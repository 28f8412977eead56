"""Submit a job to a Ray cluster from a laptop: Ray's job client plus the right runtime env.

    from rayflow.deploy.submit import submit
    result = submit(["python", "jobs/identity.py", "--address", "auto", "--bootstrap", bs],
                    address="http://127.0.0.1:8265", working_dir=".")
    result.exit_code, result.status, result.logs

The runtime environment uploads ``working_dir`` (the project: ``jobs/`` and their sibling
modules travel with the job) without what would bloat it past Ray's 100 MiB limit or leak
local state: ``.git``, virtualenvs, benchmark results, data and images (:data:`EXCLUDES`).
``RAY_AUTH_MODE=token`` goes to the job's environment, so its driver connects to the cluster
with token authentication on. The entrypoint runs in the head's Python, which must have
rayflow installed (the cluster specs' setup commands do it).
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayflow.errors import RayflowError

# gitignore-style patterns, as Ray's runtime_env "excludes" reads them
EXCLUDES = [
    ".git", ".venv", "venv", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache",
    ".mypy_cache", "*.egg-info", "benchmarks/results", "data", "*.png", "*.jpg", "*.npy", "*.parquet",
]
WORKING_DIR_LIMIT_BYTES = 100 * 1024 * 1024  # Ray's upload limit for a working_dir
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
CONNECT_TIMEOUT_S = 10.0  # the job API must answer within this, or submit says so
AGENT_WAIT_S = 60.0  # how long a cluster that answers may take to start its job agent
POLL_S = 1.0  # status polling when Ray's log tail is unavailable
_EXIT = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 143}


@dataclass
class SubmitResult:
    """What became of a submitted job."""

    job_id: str
    status: str
    exit_code: int
    logs: str
    submit_s: float                 # submit call until the job was accepted
    total_s: float                  # submit call until it ended
    working_dir_bytes: int
    message: str = ""
    runtime_env: dict[str, Any] = field(default_factory=dict)


def resolve_address(address: str | None) -> str:
    """The dashboard (job API) address: the argument, ``RAY_API_SERVER_ADDRESS``,
    ``RAY_ADDRESS`` if it is HTTP, or the local default."""
    address = address or os.environ.get("RAY_API_SERVER_ADDRESS")
    if not address:
        env = os.environ.get("RAY_ADDRESS", "")
        address = env if env.startswith("http") else DEFAULT_ADDRESS
    if "://" not in address:
        address = "http://" + address
    return address


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    parts = rel.split("/")
    for pat in patterns:
        if "/" in pat:
            if rel == pat or rel.startswith(pat.rstrip("/") + "/"):
                return True
        elif any(fnmatch.fnmatch(p, pat) for p in parts):
            return True
    return False


def working_dir_size(path: str | Path, excludes: Sequence[str] = EXCLUDES) -> int:
    """Bytes the working dir uploads with ``excludes`` applied (the 100 MiB limit check)."""
    root = Path(path).resolve()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirnames[:] = [d for d in dirnames if not _excluded(rel_dir + d, excludes)]
        for f in filenames:
            if not _excluded(rel_dir + f, excludes):
                try:
                    total += (Path(dirpath) / f).stat().st_size
                except OSError:
                    pass
    return total


def build_runtime_env(working_dir: str | Path | None, extra_excludes: Sequence[str] = (),
                      env_vars: dict[str, str] | None = None,
                      base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The runtime_env rayflow submits with: working dir, excludes, token auth on."""
    env = dict(base or {})
    if working_dir is not None:
        env["working_dir"] = str(Path(working_dir).resolve())
        env["excludes"] = list(dict.fromkeys([*EXCLUDES, *extra_excludes,
                                              *env.get("excludes", [])]))
    merged = {"RAY_AUTH_MODE": "token", **dict(env.get("env_vars", {})), **(env_vars or {})}
    env["env_vars"] = merged
    return env


class Detached(KeyboardInterrupt):
    """Ctrl-C while following a job: rayflow stopped following it, the job runs on (as with
    ``ray job submit``). ``job_id`` names it for ``ray job logs -f`` or ``ray job stop``."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        super().__init__(f"detached from job {job_id}; it keeps running (follow it with "
                         f"`ray job logs -f {job_id}`, stop it with `ray job stop {job_id}`)")


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`RayflowError` unless something at ``address`` answers HTTP within
    ``timeout_s`` (connecting, then answering a request). Ray's job client waits forever on
    a port that accepts connections and never answers; this says so instead."""
    import http.client
    import ssl
    from urllib.parse import urlsplit

    u = urlsplit(address)
    if not u.hostname:
        raise ValueError(f"job submission: the address {address!r} names no host")
    https = u.scheme == "https"
    port = u.port or (443 if https else 80)
    if https:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            u.hostname, port, timeout=timeout_s, context=ssl._create_unverified_context())
    else:
        conn = http.client.HTTPConnection(u.hostname, port, timeout=timeout_s)
    try:
        try:
            conn.connect()
        except TimeoutError:
            raise RayflowError(f"cannot reach the Ray job API at {address}: no answer to "
                               f"connect within {timeout_s:g} s") from None
        except ssl.SSLError:
            return  # something speaks TLS there; the job client judges its certificate
        except OSError as exc:
            raise RayflowError(f"cannot reach the Ray job API at {address}: "
                               f"{exc.strerror or exc}") from None
        try:
            conn.request("GET", "/api/version")
            conn.getresponse().read()
        except TimeoutError:
            raise RayflowError(f"the Ray job API at {address} accepted the connection but "
                               f"sent no answer within {timeout_s:g} s: is this the Ray "
                               f"dashboard's port (8265 by default)?") from None
        except (OSError, http.client.HTTPException) as exc:
            raise RayflowError(f"the Ray job API at {address} did not answer HTTP: "
                               f"{type(exc).__name__}: {exc}") from None
    finally:
        conn.close()


def _client(address: str, connect_timeout_s: float = CONNECT_TIMEOUT_S):
    os.environ.setdefault("RAY_AUTH_MODE", "token")  # before Ray is imported
    check_reachable(address, connect_timeout_s)
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # noqa: BLE001 - connection refused, auth, ...
        raise RayflowError(f"cannot reach the Ray job API at {address}: "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None


def submit(entrypoint: Sequence[str] | str, *, address: str | None = None,
           working_dir: str | Path | None = ".", extra_excludes: Sequence[str] = (),
           env_vars: dict[str, str] | None = None, runtime_env: dict[str, Any] | None = None,
           wait: bool = True, timeout_s: float | None = None,
           on_log: Callable[[str], None] | None = None,
           submission_id: str | None = None,
           entrypoint_num_cpus: float | None = None,
           entrypoint_num_gpus: float | None = None,
           entrypoint_memory: int | None = None,
           connect_timeout_s: float = CONNECT_TIMEOUT_S) -> SubmitResult:
    """Submit ``entrypoint`` and (by default) follow it to the end.

    Args:
        entrypoint: the command, e.g. ``["python", "jobs/identity.py", "--address", "auto"]``.
        address: the dashboard address (``http://head:8265``); see :func:`resolve_address`.
        working_dir: uploaded as the job's working dir (``None``: nothing uploaded, or the
            ``working_dir`` of ``runtime_env``).
        extra_excludes: more gitignore-style patterns to leave out.
        env_vars: environment of the job's driver (``RAY_AUTH_MODE=token`` is always set).
        runtime_env: a base runtime_env (e.g. ``pip``) merged under rayflow's keys.
        wait: follow the job; otherwise return once it is accepted (status PENDING/RUNNING).
        timeout_s: stop the job if it runs longer (exit code 124).
        on_log: called with each new chunk of log text (e.g. ``sys.stdout.write``), as Ray
            streams it (``JobSubmissionClient.tail_job_logs``).
        submission_id: the job's id (Ray makes one when None).
        entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_memory: resources reserved
            for the entrypoint (the job's driver) itself, as ``ray job submit`` has them.
        connect_timeout_s: how long the job API may take to answer at all.

    Raises:
        Detached: Ctrl-C while following; the job keeps running.
    """
    from ray.job_submission import JobStatus

    cmd = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
    if not cmd.strip():
        raise ValueError("nothing to submit: give the job's command after --")
    size = 0
    if working_dir is not None:
        if not Path(working_dir).is_dir():
            raise RayflowError(f"working dir {working_dir} is not a directory")
        size = working_dir_size(working_dir, [*EXCLUDES, *extra_excludes])
        if size > WORKING_DIR_LIMIT_BYTES:
            raise RayflowError(f"working dir {working_dir} uploads {size / 2**20:.0f} MiB, over "
                               f"Ray's 100 MiB limit: add --exclude patterns")
    env = build_runtime_env(working_dir, extra_excludes, env_vars, runtime_env)
    address = resolve_address(address)
    client = _client(address, connect_timeout_s)
    t0 = time.time()
    resources = {k: v for k, v in (("entrypoint_num_cpus", entrypoint_num_cpus),
                                   ("entrypoint_num_gpus", entrypoint_num_gpus),
                                   ("entrypoint_memory", entrypoint_memory)) if v is not None}
    # the cluster answered; its job agent may still be starting (a head started moments ago,
    # a busy machine): wait for it longer than for a connection
    deadline = time.monotonic() + max(connect_timeout_s, AGENT_WAIT_S)
    while True:
        try:
            job_id = client.submit_job(entrypoint=cmd, runtime_env=env,
                                       submission_id=submission_id, **resources)
            break
        except RuntimeError as exc:
            # a dashboard whose job agent is not up yet answers 500 "No available agent to
            # submit job, please try again later": it is, until AGENT_WAIT_S
            if "No available agent" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    submit_s = time.time() - t0
    if not wait:
        st = client.get_job_status(job_id)
        return SubmitResult(job_id, str(st.value if hasattr(st, "value") else st), -1, "",
                            submit_s, time.time() - t0, size, runtime_env=env)
    terminal = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
    try:
        logs = _follow(client, job_id, on_log, timeout_s, t0, terminal)
    except KeyboardInterrupt:
        raise Detached(job_id) from None
    info = client.get_job_info(job_id)
    status = str(info.status.value)
    exit_code = getattr(info, "driver_exit_code", None)
    code = exit_code if isinstance(exit_code, int) else _EXIT.get(status, 1)
    if status == "SUCCEEDED":
        code = 0
    elif code == 0:
        code = _EXIT.get(status, 1)
    return SubmitResult(job_id, status, code, logs, submit_s, time.time() - t0, size,
                        message=info.message or "", runtime_env=env)


def _follow(client: Any, job_id: str, on_log: Callable[[str], None] | None,
            timeout_s: float | None, t0: float, terminal: tuple) -> str:
    """Stream the job's log to ``on_log`` until the job ends; return the whole log.

    Ray's websocket tail sends each chunk once. Should it close before the job ends, the
    status is polled instead and the rest of the log fetched once at the end.
    """
    import asyncio

    chunks: list[str] = []

    async def tail() -> None:
        async for text in client.tail_job_logs(job_id):
            chunks.append(text)
            if on_log:
                on_log(text)

    deadline = None if timeout_s is None else t0 + timeout_s

    def timed_out() -> TimeoutError:
        client.stop_job(job_id)
        return TimeoutError(f"job {job_id} still running after {timeout_s:g}s; stopped")

    left = None if deadline is None else max(0.0, deadline - time.time())
    try:
        asyncio.run(asyncio.wait_for(tail(), left))
    except asyncio.TimeoutError:
        raise timed_out() from None
    except Exception:  # noqa: BLE001 - the tail closed early (or cannot open): poll
        pass
    while client.get_job_status(job_id) not in terminal:
        if deadline is not None and time.time() > deadline:
            raise timed_out()
        time.sleep(POLL_S)
    seen = "".join(chunks)
    full = client.get_job_logs(job_id) if not seen else seen
    if not seen and full and on_log:
        on_log(full)
    return full
