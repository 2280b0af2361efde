"""Servers a benchmark (or a test) starts for itself: the gateway and a storage broker.

Both listen on 127.0.0.1 only, on free ports, and are our direct children with
PR_SET_PDEATHSIG: when the bench (or test) process dies, they die too. The private RabbitMQ
node the benchmark compares with is bench.rabbitmq_node; the process helpers are
bench.processes.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.processes import check_for, die_with_parent
from localcluster.ports import free_port
from mqgw_cli.admin_client import admin_call  # readiness probe: our own raw client

# check_for and free_port are re-exported: dozens of tests import them from here.
__all__ = ["BrokerServer", "GatewayServer", "admin_call", "check_for", "free_port"]

_READY = re.compile(r"AMQP on [^ ]+:(\d+), admin on (?:off|[^ ]+:(\d+))")
_READY_TLS = re.compile(r"AMQPS on [^ ]+:(\d+),")


class GatewayServer:
    """`mqgw serve` in a subprocess on free loopback ports; ``url`` once started.

    The benchmark pins sync flush (the fair match for RabbitMQ's confirms); tests pass extra
    command-line ``args`` and ``env`` and may stop and start it again on the same data dir.
    """

    flush_policy = "sync flush: group-commit fsync before each confirm"
    _LOG_TAIL_LINES = 5000  # enough for any test's assertions, bounded for long benchmarks

    def __init__(
        self,
        data_dir: Path,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        flush: str | None = None,
        host: str | None = "127.0.0.1",
        launcher: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        # Arguments to Python before ``-m mqgw_cli.main`` (a profiler's: bench/profile.py).
        self.launcher = list(launcher)
        self.host = host  # None: no --host flag (e.g. MQGW_AMQP_HOST in env says where)
        self.args = list(args)
        self.env = dict(env or {})
        if flush is not None:
            self.env["MQGW_FLUSH"] = flush
        self.proc: subprocess.Popen[str] | None = None
        self.amqp_port = 0
        self.admin_port = 0
        self.tls_port = 0  # the AMQPS port, when tls_port is set
        self.log_lines: list[str] = []
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 30) -> GatewayServer:
        self._ready.clear()
        self.log_lines = []
        cmd = [
            sys.executable, *self.launcher, "-m", "mqgw_cli.main", "serve",
            *(["--host", self.host] if self.host is not None else []),
            "--amqp-port", "0", "--admin-port", "0",
            "--data-dir", str(self.data_dir), *self.args, *self._over_rocketmq(),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            env={**os.environ, **self.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509 (only prctl: safe)
        )
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(timeout_s) or self.proc.poll() is not None:
            self.kill()
            raise RuntimeError("gateway did not start:\n" + "".join(self.log_lines[-40:]))
        return self

    def _over_rocketmq(self) -> list[str]:
        """With MQGW_TEST_ROCKETMQ=NAMESRV (tests/rocketmq/test_suites_over_rocketmq.py), a
        gateway started with neither a store nor Redis stores its messages in that RocketMQ,
        in a namespace of its data directory's own (the same again at a restart)."""
        namesrv = os.environ.get("MQGW_TEST_ROCKETMQ")
        if not namesrv or {"--store", "--meta"} & set(self.args):
            return []
        namespace = "t" + hashlib.sha1(str(self.data_dir.resolve()).encode()).hexdigest()[:16]
        return ["--store", f"rocketmq://{namesrv}/{namespace}"]

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log_lines.append(line)
            if len(self.log_lines) > self._LOG_TAIL_LINES:
                del self.log_lines[: -self._LOG_TAIL_LINES]
            match = _READY.search(line)
            if match and not self._ready.is_set():
                self.amqp_port = int(match.group(1))
                self.admin_port = int(match.group(2) or 0)
                tls = _READY_TLS.search(line)
                self.tls_port = int(tls.group(1)) if tls else 0
                self._ready.set()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
        """Send ``sig`` and wait; returns the exit code (killed if it does not exit)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return "".join(self.log_lines)

    def admin(
        self,
        method: str,
        path: str,
        body: object = None,
        auth: tuple[str, str] | None = ("guest", "guest"),
    ) -> tuple[int, Any]:
        """Call the admin API (basic auth, guest by default): (status, decoded JSON or None)."""
        user, password = auth or (None, "")
        base = f"http://127.0.0.1:{self.admin_port}"
        return admin_call(base, method, path, body, user, password, timeout_s=30)


class BrokerServer:
    """`mqgw broker` on a fixed loopback port, logging to a file; restartable in place (same
    data directory, same port), as `mqgw cluster` and the tests run it."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        log_path: Path,
        group: str = "g1",
        broker_id: str = "a",
        meta: str | None = None,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        self.log_path = log_path
        self.args = list(args)
        self.group = group
        self.broker_id = broker_id
        self.meta = meta
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout_s: float = 30) -> BrokerServer:
        cmd = [
            sys.executable, "-m", "mqgw_cli.main", "broker",
            "--data-dir", str(self.data_dir), "--port", str(self.port),
            "--group", self.group, "--id", self.broker_id,
        ]  # fmt: skip
        if self.meta:
            cmd += ["--meta", self.meta]
        cmd += self.args
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                cmd,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # noqa: PLW1509 (only prctl: safe)
            )
        self.starts += 1
        name = re.escape(f"{self.group}/{self.broker_id}")
        ready = re.compile(rf"broker {name} ready on 127\.0\.0\.1:{self.port} data ")
        deadline = time.monotonic() + timeout_s
        while len(ready.findall(self.log())) < self.starts:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"broker not ready within {timeout_s} s:\n{self.log()}")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout_s)
