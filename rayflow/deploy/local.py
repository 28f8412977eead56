"""Private local Ray heads: for job-submission tests and autoscaling experiments.

    head = start_head(num_cpus=2)                       # dashboard on a free port
    head.dashboard_url  # http://127.0.0.1:PORT  (for rayflow submit / JobSubmissionClient)
    head.address        # 127.0.0.1:PORT         (for ray.init / --address)
    stop_head(head)                                     # by PID, never `ray stop`

    head = start_head(autoscaling_config="cluster/local-autoscale.yaml")  # fake multi-node

A head is ``ray start --head --block`` in its own session, with its own ``--temp-dir`` and
every port chosen free, so it never meets another cluster on the machine (``ray stop`` would
kill every cluster of the user). It is ended by PID: the ``ray start`` process,
its descendants, and any process that names the head's temp dir or GCS port on its command
line (the fake provider's nodes are started by the autoscaler, outside that tree).
A record of the running head goes to ``<state dir>/head.json`` for ``rayflow cluster
down-local``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rayflow._procs import end_processes, free_ports, live, port_open
from rayflow.config import load_config
from rayflow.errors import RayflowError

STATE_DIR = Path(os.environ.get("RAYFLOW_STATE_DIR", Path.home() / ".rayflow"))
STATE_FILE = STATE_DIR / "head.json"
START_TIMEOUT_S = 90.0


@dataclass
class LocalHead:
    """A running private head."""

    pid: int
    address: str            # GCS host:port
    dashboard_url: str      # http://127.0.0.1:port ('' without dashboard)
    temp_dir: str
    log: str
    autoscaling: bool = False
    started_s: float = 0.0
    ports: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ray_exe() -> str:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else (shutil.which("ray") or "ray")


def head_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a head: token auth on, this Python first on PATH (so a job's
    ``python`` entrypoint is the one that has rayflow)."""
    env = dict(os.environ)
    env["RAY_AUTH_MODE"] = "token"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.update(extra or {})
    return env


def ensure_token() -> None:
    """Token auth needs a token before a head is started with ``ray start`` (``ray.init``
    writes one itself); generate the default one if it is missing."""
    if os.environ.get("RAY_AUTH_TOKEN") or (Path.home() / ".ray" / "auth_token").exists():
        return
    subprocess.run([_ray_exe(), "get-auth-token", "--generate"], env=head_env(),
                   check=False, capture_output=True, timeout=60)


def start_head(num_cpus: int = 2, *, dashboard: bool = True,
               autoscaling_config: str | Path | None = None, temp_dir: str | None = None,
               resources: dict[str, float] | None = None, object_store_mb: int = 200,
               env: dict[str, str] | None = None, timeout_s: float = START_TIMEOUT_S,
               record: bool = False) -> LocalHead:
    """Start a private head and wait until it (and its dashboard) answer.

    Args:
        num_cpus: logical CPUs of the head.
        dashboard: start the dashboard (the job API lives there).
        autoscaling_config: a fake multi-node spec; its ``provider.gcs_address`` is rewritten
            to this head, and the head runs with ``RAY_FAKE_CLUSTER=1``.
        temp_dir: Ray's temp dir (a fresh short one under /tmp when omitted; Unix socket
            paths must stay under ~100 characters).
        record: write the head to ``~/.rayflow/head.json`` (for ``down-local``).
    """
    t0 = time.time()
    ensure_token()
    temp_dir = temp_dir or tempfile.mkdtemp(prefix="rfh-", dir="/tmp")
    names = ["gcs", "dashboard", "client", "node_manager", "object_manager", "agent_listen",
             "agent_grpc", "runtime_env_agent", "metrics"]
    ports = dict(zip(names, free_ports(len(names))))
    cmd = [
        _ray_exe(), "start", "--head", "--block", "--disable-usage-stats",
        f"--port={ports['gcs']}", "--node-ip-address=127.0.0.1",
        f"--temp-dir={temp_dir}", f"--num-cpus={num_cpus}",
        f"--object-store-memory={object_store_mb * 1024 * 1024}",
        f"--ray-client-server-port={ports['client']}",
        f"--node-manager-port={ports['node_manager']}",
        f"--object-manager-port={ports['object_manager']}",
        f"--dashboard-agent-listen-port={ports['agent_listen']}",
        f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--runtime-env-agent-port={ports['runtime_env_agent']}",
        f"--metrics-export-port={ports['metrics']}",
        "--min-worker-port=0", "--max-worker-port=0",  # workers: any free port
    ]
    system_config = load_config().ray.system_config()  # as the local Ray rayflow starts
    if system_config:
        cmd.append("--system-config=" + json.dumps(system_config))
    if dashboard:
        cmd += ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                f"--dashboard-port={ports['dashboard']}"]
    else:
        cmd += ["--include-dashboard=false"]
    if resources:
        cmd += ["--resources", json.dumps(resources)]
    extra = dict(env or {})
    if autoscaling_config is not None:
        spec = yaml.safe_load(Path(autoscaling_config).read_text())
        spec["provider"]["gcs_address"] = f"127.0.0.1:{ports['gcs']}"
        spec_path = Path(temp_dir) / "autoscaling.yaml"
        spec_path.write_text(yaml.safe_dump(spec))
        cmd.append(f"--autoscaling-config={spec_path}")
        extra.setdefault("RAY_FAKE_CLUSTER", "1")
        extra.setdefault("AUTOSCALER_UPDATE_INTERVAL_S", "1")
    log = str(Path(temp_dir) / "ray-start.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env=head_env(extra), start_new_session=True)
    head = LocalHead(pid=proc.pid, address=f"127.0.0.1:{ports['gcs']}",
                     dashboard_url=f"http://127.0.0.1:{ports['dashboard']}" if dashboard else "",
                     temp_dir=temp_dir, log=log, autoscaling=autoscaling_config is not None,
                     ports=ports)
    try:
        _wait_ready(head, proc, timeout_s)
    except BaseException:
        stop_head(head)
        raise
    head.started_s = round(time.time() - t0, 2)
    if record:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(json.dumps(head.as_dict(), indent=2))
    return head


def _wait_ready(head: LocalHead, proc: subprocess.Popen, timeout_s: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = Path(head.log).read_text(errors="replace")[-1500:]
            raise RayflowError(f"the local head exited with {proc.returncode}: {tail}")
        if port_open(head.ports["gcs"]):
            if not head.dashboard_url:
                return
            try:
                with urllib.request.urlopen(head.dashboard_url + "/api/version", timeout=2):
                    return
            except OSError as exc:
                if getattr(exc, "code", None):  # an HTTP answer (e.g. 401): it is up
                    return
        time.sleep(0.5)
    raise TimeoutError(f"the local head did not answer within {timeout_s:g}s (log {head.log})")


def head_processes(head: LocalHead | dict) -> list[Any]:
    """Processes of a head: the ``ray start`` tree, plus processes naming its temp dir or GCS
    port (fake nodes, workers that were reparented)."""
    import psutil

    h = head if isinstance(head, dict) else head.as_dict()
    found: dict[int, Any] = {}
    try:
        root = psutil.Process(h["pid"])
        for p in [root, *root.children(recursive=True)]:
            found[p.pid] = p
        found = {k: p for k, p in found.items() if live([p])}
    except (psutil.NoSuchProcess, ValueError):
        pass
    markers = [h["temp_dir"], h["address"]]
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["pid"] in found or p.info["pid"] == me or \
                p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        if any(m and m in cmd for m in markers):
            found[p.info["pid"]] = p
    return list(found.values())


def stop_head(head: LocalHead | dict, timeout_s: float = 3.0, remove_temp: bool = True) -> int:
    """End a head by PID: SIGTERM, then SIGKILL what is left after ``timeout_s`` (the
    ``ray start --block`` process and the monitor ignore SIGTERM), and wait until they are
    gone; then the same for any process of the head that started meanwhile (a worker, a
    reparented child). Returns how many were ended."""
    h = head if isinstance(head, dict) else head.as_dict()
    procs = head_processes(h)
    end_processes(procs, timeout_s)
    ended = {p.pid for p in procs}
    for _ in range(3):
        left = head_processes(h)
        if not left:
            break
        end_processes(left, 1.0)
        ended |= {p.pid for p in left}
    try:  # reap the `ray start` process when it is our child
        os.waitpid(h["pid"], os.WNOHANG)
    except ChildProcessError:
        pass
    if remove_temp and h.get("temp_dir", "").startswith("/tmp/rfh-"):
        shutil.rmtree(h["temp_dir"], ignore_errors=True)
    return len(ended)


def recorded_head() -> dict | None:
    """The head ``rayflow cluster up-local`` recorded, if any."""
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None


def forget_recorded_head() -> None:
    try:
        STATE_FILE.unlink()
    except OSError:
        pass
