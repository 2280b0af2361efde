"""Servers a benchmark (or a test) starts for itself: the gateway and a private RabbitMQ node.

Both listen on 127.0.0.1 only, on free ports, and are our direct children with
PR_SET_PDEATHSIG: when the bench (or test) process dies, they die too.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench.load.connection import RawConnection
from localcluster.ports import free_port
from mqgw_cli.admin_client import admin_call  # readiness probe: our own raw client

T = TypeVar("T")

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
EPMD = "epmd"


def die_with_parent() -> None:
    """preexec_fn (or first call in a worker): SIGKILL us when our parent goes away."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def check_for(
    timeout_s: float,
    probe: Callable[[], T | None],
    interval_s: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns something truthy (nats-server's checkFor); ``what`` names
    the condition in the error."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as error:
            last_error = error
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not met within {timeout_s}s (last error: {last_error})")


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (beam.smp's helpers, say)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def tree_rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` and its descendants, in MB."""
    total_kb = 0
    for member in process_tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return round(total_kb / 1024, 1)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live descendants."""
    ticks = 0
    for member in process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


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
    ) -> None:
        self.data_dir = data_dir
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
            sys.executable, "-m", "mqgw_cli.main", "serve",
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


class RabbitMQProcess:
    """A RabbitMQ node and its epmd, both children of this process; ``url`` once started.

    The node runs from ``base_dir`` on free loopback ports with its own epmd on a private
    port, so it never touches a system RabbitMQ. If it cannot start, ``start`` raises.
    """

    flush_policy = "persistent messages in durable classic queues: confirms after fsync"

    def __init__(
        self,
        base_dir: Path,
        advanced_config: str = "[].",
        plugins: tuple[str, ...] = (),
    ) -> None:
        self.base_dir = base_dir
        self.advanced_config = advanced_config  # Erlang terms, e.g. [{rabbit, [...]}].
        # e.g. ("rabbitmq_management", "rabbitmq_tracing"); the management listener then
        # binds 127.0.0.1 on ``management_port`` (chosen at start).
        self.plugins = plugins
        self.management_port = 0
        self.node_name = f"mqgw-diff-{uuid.uuid4().hex[:8]}@localhost"
        self.amqp_port = 0
        self.epmd: subprocess.Popen[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._ctl_env: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def pid(self) -> int:
        """beam.smp itself (the start script execs it; see ``_env``)."""
        assert self.proc is not None
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.base_dir / "stdout.log"

    def _env(self, epmd_port: int, dist_port: int) -> dict[str, str]:
        config = self.base_dir / "rabbitmq.conf"
        lines = [f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}"]
        if self.management_port:
            lines += [
                f"management.tcp.port = {self.management_port}",
                "management.tcp.ip = 127.0.0.1",
            ]
        config.write_text("\n".join(lines) + "\n")
        plugins = self.base_dir / "enabled_plugins"
        plugins.write_text(f"[{','.join(self.plugins)}].\n")
        advanced = self.base_dir / "advanced.config"
        advanced.write_text(self.advanced_config + "\n")
        return {
            **os.environ,
            "HOME": str(self.base_dir),
            "RABBITMQ_NODENAME": self.node_name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.base_dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.base_dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(advanced),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd_port),
            # ALLOW_INPUT makes the script exec the VM instead of forking it, so beam.smp is
            # our direct child and keeps the parent-death signal; -noinput keeps it headless.
            # Our own epmd (below) is a child too, unlike the daemon erl would spawn.
            "RABBITMQ_ALLOW_INPUT": "true",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-noinput -start_epmd false",
        }

    def start(self, timeout_s: float = 60) -> RabbitMQProcess:
        if not RABBITMQ_SERVER.exists() or shutil.which(EPMD) is None:
            raise RuntimeError(
                f"{RABBITMQ_SERVER} or epmd is missing: run scripts/setup-dev (rabbitmq-server)"
            )
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.amqp_port = free_port()
        if any(p in self.plugins for p in ("rabbitmq_management", "rabbitmq_tracing")):
            self.management_port = free_port()  # tracing depends on management
        epmd_port, dist_port = free_port(), free_port()
        env = self._env(epmd_port, dist_port)
        self._ctl_env = env
        self.epmd = subprocess.Popen(
            [EPMD, "-port", str(epmd_port), "-address", "127.0.0.1"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # noqa: PLW1509 (only prctl: safe)
        )
        check_for(10, lambda: _port_open(epmd_port))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(RABBITMQ_SERVER)],
                cwd=self.base_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # noqa: PLW1509 (only prctl: safe)
            )
        try:
            check_for(timeout_s, self._ready, interval_s=0.2)
        except TimeoutError as error:
            self.stop()
            raise RuntimeError(f"rabbitmq-server did not start:\n{self.log_tail()}") from error
        return self

    def ctl(self, *args: str) -> str:
        """Run rabbitmqctl against this node (e.g. set_policy); its output, or it raises."""
        result = subprocess.run(
            [str(RABBITMQ_SERVER.with_name("rabbitmqctl")), "-n", self.node_name, *args],
            env=self._ctl_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {result.stderr or result.stdout}")
        return result.stdout

    def _ready(self) -> bool:
        """An AMQP handshake succeeds (the port opens before the broker is ready)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"rabbitmq-server exited with {self.proc.returncode}")
        RawConnection(self.url, timeout_s=1).close()
        return True

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM (the VM shuts RabbitMQ down cleanly), then stop our epmd; nothing is left."""
        for proc in (self.proc, self.epmd):
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
