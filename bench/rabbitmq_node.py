"""A private RabbitMQ node for the side-by-side benchmark and the differential tests.

``RabbitMQProcess`` starts rabbitmq-server and its own epmd from a base directory, on free
loopback ports (a private epmd port too), both as our children with the parent-death signal,
so it never touches a system RabbitMQ and nothing outlives the bench or test that started it.
It writes the node's configuration files, waits for an AMQP handshake, runs rabbitmqctl
against the node and stops both processes cleanly.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import uuid
from pathlib import Path

from bench.load.connection import RawConnection
from bench.processes import check_for, die_with_parent
from localcluster.ports import free_port

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
EPMD = "epmd"


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


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
