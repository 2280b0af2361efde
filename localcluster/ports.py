"""Free loopback ports for the servers that tests, benchmarks and `mqgw cluster up` start.

A port taken with ``bind(0)`` and released comes from the kernel's ephemeral range, so the
kernel may hand the same port to the next ``bind(0)`` — say the gateway's own AMQP listener
on port 0 — before the server that was promised it binds it. Ports come from below the
ephemeral range instead, where ``bind(0)`` and outgoing connections never go, and never
twice from one process.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

HOST = "127.0.0.1"
_LOWEST = 10_000
_taken: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def port_free(port: int) -> bool:
    """Can a server bind ``port`` on loopback now? (SO_REUSEADDR, as servers bind: a port
    in TIME_WAIT after a stop counts as free.)"""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range, not handed out
    before by this process."""
    highest = _ephemeral_start() - 1
    if highest <= _LOWEST:  # an unusual range: let the kernel choose
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
            return port
    while True:
        port = random.randint(_LOWEST, highest)
        if port not in _taken and port_free(port):
            _taken.add(port)
            return port
