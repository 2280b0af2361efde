"""A real redis-server for tests, on a free loopback port, with its data in a temp dir.

``RedisServer(dir).start()`` runs ``redis-server`` bound to 127.0.0.1 only (protected mode
on, no password: loopback clients only), with RDB snapshots off and the AOF on so that
``restart()`` keeps the data while the server gets a new run id, as a real restart does.
The child dies with the test process (PR_SET_PDEATHSIG), and ``stop()`` kills it.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from bench.processes import check_for, die_with_parent
from bench.servers import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(
        self, data_dir: Path, port: int | None = None, extra_args: Sequence[str] = ()
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.extra_args = list(extra_args)  # a replica's --replicaof, for one
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "yes",
            "--dir", str(self.data_dir),
            "--logfile", str(self.log_path),
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        try:
            check_for(
                timeout_s,
                lambda: self.proc is not None and self.proc.poll() is None and _ping(self.port),
            )
        except TimeoutError as error:
            self.stop()
            log = self.log_path.read_text() if self.log_path.exists() else ""
            raise RuntimeError(f"redis-server did not answer PING:\n{log[-2000:]}") from error
        return self

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Kill (default) or signal the server and wait for it to go."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> RedisServer:
        """Stop and start again on the same port and data dir (the AOF is replayed)."""
        self.stop(signal.SIGTERM)  # a clean stop flushes the AOF
        return self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@contextmanager
def redis_server(data_dir: Path) -> Iterator[RedisServer]:
    with RedisServer(data_dir) as server:
        yield server
