"""One-shot checks that a process serves what it should. Each returns quickly (short socket
timeouts) and answers False/None rather than raising, so callers can poll them."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from localcluster.layout import HOST

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
_FRAME_METHOD = 1


def redis_ping(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def amqp_answers(port: int, timeout_s: float = 0.5) -> bool:
    """The port answers the AMQP 0-9-1 protocol header with a method frame on channel 0
    (connection.start): an open port alone could be a listener not yet serving."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
            sock.sendall(AMQP_HEADER)
            head = sock.recv(3)
    except OSError:
        return False
    return len(head) == 3 and head[0] == _FRAME_METHOD and head[1:3] == b"\x00\x00"


def gateway_health(admin_url: str, timeout_s: float = 1.0) -> dict[str, Any] | None:
    """GET /api/health (open without login): its JSON when it says "ok", else None."""
    try:
        with urllib.request.urlopen(f"{admin_url}/api/health", timeout=timeout_s) as response:
            if response.status != 200:
                return None
            body = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return body if isinstance(body, dict) and body.get("status") == "ok" else None


def log_since(path: Path, offset: int) -> str:
    """What ``path`` gained after byte ``offset`` (a restart appends to the same log)."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read().decode(errors="replace")
    except OSError:
        return ""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp for LISTEN


def listening(pid: int, port: int) -> bool:
    """Process ``pid`` has a TCP socket listening on ``port`` (Linux: its /proc/<pid>/fd
    against /proc/net/tcp{,6}). With SO_REUSEPORT several processes listen on one port and
    connecting to it says nothing of a particular one; this does."""
    inodes = set()
    try:
        entries = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone (or not ours)
        return False
    for entry in entries:
        try:
            link = str(entry.readlink())
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == _TCP_LISTEN and fields[9] in inodes:
                return True
    return False
