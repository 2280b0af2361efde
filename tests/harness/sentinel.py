"""A real Redis Sentinel deployment for tests: a master, a replica and three sentinels, each
a redis-server on a free loopback port, all dying with the test process.

The sentinels watch the master as ``mymaster`` with a quorum of 2 and call it down after
``DOWN_AFTER_MS`` without an answer, so a killed master is replaced in a few seconds.
``url`` is the ``redis+sentinel://`` URL every mqgw process takes as ``--meta``.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.processes import check_for, die_with_parent
from bench.servers import free_port
from tests.harness.redis_server import REDIS_SERVER, RedisServer

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


def _ask(port: int, command: bytes) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(command)
            return sock.recv(4096)
    except OSError:
        return b""


class Sentinels:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.master = RedisServer(root / "redis-a")
        self.replica = RedisServer(
            root / "redis-b", extra_args=["--replicaof", "127.0.0.1", str(self.master.port)]
        )
        self.ports = [free_port() for _ in range(3)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> Sentinels:
        self.master.start()
        self.replica.start()
        check_for(10, lambda: b"master_link_status:up" in self._info(self.replica.port))
        for index, port in enumerate(self.ports):
            home = self.root / f"sentinel-{index}"
            home.mkdir(parents=True, exist_ok=True)
            conf = home / "sentinel.conf"  # sentinel rewrites its file: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {home}\n"
                f"logfile {home / 'sentinel.log'}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self.procs.append(
                subprocess.Popen(
                    [REDIS_SERVER, str(conf), "--sentinel"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    preexec_fn=die_with_parent,
                )
            )

        def all_see_the_replica() -> bool:
            return all(b"slaves=1" in _ask(p, b"INFO sentinel\r\n") for p in self.ports)

        check_for(10, all_see_the_replica)
        return self

    def _info(self, port: int) -> bytes:
        return _ask(port, b"INFO replication\r\n")

    def master_port(self) -> int | None:
        """The port the sentinels name as master now (None while they disagree)."""
        answers = set()
        for port in self.ports:
            reply = _ask(port, f"SENTINEL get-master-addr-by-name {SERVICE}\r\n".encode())
            answers.add(reply.split(b"\r\n")[-2] if reply.count(b"\r\n") >= 4 else b"")
        (answer,) = answers if len(answers) == 1 else (b"",)
        return int(answer) if answer.isdigit() else None

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.procs.clear()
        self.replica.stop()
        self.master.stop()


@contextmanager
def sentinels(root: Path) -> Iterator[Sentinels]:
    deployment = Sentinels(root)
    try:
        yield deployment.start()
    finally:
        deployment.stop()
