"""Ports in tests, without racing another process for one.

A port picked by binding 0 and closing is free only until someone else takes it: on a shared machine another
process can, and a test then talks to a stranger (issue 27: a 401 from somebody else's proxy). So a server under
test binds port 0 itself and the test reads the port back, from the server's own output or from the kernel's
table of the process's listening sockets (`listening_port`). `closed_port` is a port where nothing can answer,
because the test holds it bound without listening.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator

import psutil


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its own sockets, not its children's)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


def listening_port(proc: subprocess.Popen, *, timeout: float = 60, what: str = "the process") -> int:
    """The one port `proc` listens on once it does (it was started on port 0); fails if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited (code {proc.returncode}) before it listened")
        ports = listening_ports(proc.pid)
        if len(ports) == 1:
            return ports.pop()
        if len(ports) > 1:
            raise RuntimeError(f"{what} listens on several ports: {sorted(ports)}")
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen within {timeout:.0f} s")


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port where a connection is refused for as long as the block runs: held bound, never listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
    finally:
        sock.close()
