"""Processes and ports of this machine: free ports, liveness and ending processes by PID.

Shared by the embedded Kafka broker and the private local Ray heads, which both start
processes of their own and must end exactly those (never by name).
"""

from __future__ import annotations

import socket
from typing import Any


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (kept bound until all are chosen)."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = s.getsockname()[1]
            if port not in ports:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def port_free(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 can be bound now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def port_open(port: int) -> bool:
    """Whether something accepts connections on ``port`` of 127.0.0.1."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def live(procs: list[Any]) -> list[Any]:
    """The ``psutil.Process`` objects of ``procs`` that still run (zombies do not)."""
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def end_processes(procs: list[Any], timeout_s: float = 5.0) -> int:
    """End ``procs`` (``psutil.Process``): SIGTERM, then SIGKILL what still runs after
    ``timeout_s``; children of this process are reaped. Returns how many there were."""
    import psutil

    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(procs, timeout=timeout_s)
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=timeout_s)
    return len(procs)


def end_pid(pid: int, timeout_s: float = 5.0) -> None:
    """End process ``pid``: SIGTERM, then SIGKILL after ``timeout_s``."""
    import psutil

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    end_processes([proc], timeout_s)
