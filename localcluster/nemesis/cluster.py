"""The cluster the nemesis works on, one host (network namespace) per machine:

    r1   Redis (the first master) and a sentinel       ctl1, ctl2  `mqgw controller`
    r2   Redis (its replica) and a sentinel            b0, b1, b2  `mqgw broker`, group g1, sync
    s3   a sentinel                                    gw1, gw2    `mqgw serve`

Every process talks to Redis through the sentinels (``redis+sentinel://``). Each listens on
its host's address only; the test process reaches the gateways through the bridge's own
address. A host is a machine: ``kill`` SIGKILLs every process on it, ``restart`` starts them
again with the same data and configuration files (Redis and the sentinels rewrite theirs, so
a host comes back in the role the last failover gave it), ``pause`` SIGSTOPs them all.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from localcluster.nemesis.hosts import Hosts

HOSTS = ("r1", "r2", "s3", "ctl1", "ctl2", "b0", "b1", "b2", "gw1", "gw2")
RESTARTABLE = HOSTS  # every host's processes start again after a kill
GATEWAYS = ("gw1", "gw2")
REDIS_HOSTS = ("r1", "r2")
BROKERS = ("b0", "b1", "b2")
SERVICE = "mymaster"
REDIS_PORT = 6379
SENTINEL_PORT = 26379
BROKER_PORT = 7000
AMQP_PORT = 5672
ADMIN_PORT = 15672
DOWN_AFTER_MS = 2000  # a sentinel's patience: a pause past it is a failover
FAILOVER_TIMEOUT_MS = 6000
START_TIMEOUT_S = 60.0
START_FAILURE = "cannot start:"  # the one line a foreseeable start failure ends with


@dataclass
class Process:
    host: str
    role: str  # "redis", "sentinel", "controller", "broker", "gateway"
    argv: list[str]
    port: int | None  # what answers when it is up (None: nothing to probe)
    proc: subprocess.Popen[bytes] | None = None


def redis_server() -> str:
    return shutil.which("redis-server") or "/usr/bin/redis-server"


class NemesisCluster:
    def __init__(self, net: Hosts, root: Path) -> None:
        self.net = net
        self.root = root
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.processes: list[Process] = []
        self.down: set[str] = set()  # hosts killed and not restarted
        self.paused: set[str] = set()
        self.start_failures = 0  # processes started again after giving up at start
        self._define()

    # -- what runs where ----------------------------------------------------------------------

    def address(self, host: str) -> str:
        return self.net.addresses[host]

    @property
    def meta_url(self) -> str:
        sentinels = ",".join(f"{self.address(h)}:{SENTINEL_PORT}" for h in ("r1", "r2", "s3"))
        return f"redis+sentinel://{sentinels}/{SERVICE}/0"

    def amqp_url(self, gateway: str) -> str:
        # heartbeat and socket timeouts well under a fault's length: a client behind a
        # partition finds out and reconnects (to either gateway) instead of hanging.
        return (
            f"amqp://guest:guest@{self.address(gateway)}:{AMQP_PORT}/%2F"
            "?heartbeat=4&socket_timeout=5&blocked_connection_timeout=10&connection_attempts=1"
        )

    def admin_url(self, gateway: str) -> str:
        return f"http://{self.address(gateway)}:{ADMIN_PORT}"

    def _define(self) -> None:
        mqgw = [sys.executable, "-m", "mqgw_cli.main"]
        for host in ("r1", "r2"):
            home = self.root / host
            home.mkdir(parents=True, exist_ok=True)
            conf = home / "redis.conf"
            if not conf.exists():  # Redis rewrites it at a failover: kept across restarts
                replica = f"replicaof {self.address('r1')} {REDIS_PORT}\n" if host == "r2" else ""
                conf.write_text(
                    f"port {REDIS_PORT}\nbind {self.address(host)}\nprotected-mode no\n"
                    f'save ""\nappendonly yes\ndir {home}\ndaemonize no\n{replica}'
                )
            self.processes.append(Process(host, "redis", [redis_server(), str(conf)], REDIS_PORT))
        for host in ("r1", "r2", "s3"):
            home = self.root / host
            home.mkdir(parents=True, exist_ok=True)
            conf = home / "sentinel.conf"
            if not conf.exists():
                conf.write_text(
                    f"port {SENTINEL_PORT}\nbind {self.address(host)}\nprotected-mode no\n"
                    f"daemonize no\ndir {home}\n"
                    f"sentinel monitor {SERVICE} {self.address('r1')} {REDIS_PORT} 2\n"
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                    f"sentinel parallel-syncs {SERVICE} 1\n"
                )
            self.processes.append(
                Process(host, "sentinel", [redis_server(), str(conf), "--sentinel"], SENTINEL_PORT)
            )
        for host in ("ctl1", "ctl2"):
            argv = [*mqgw, "controller", "--meta", self.meta_url, "--name", host]
            self.processes.append(Process(host, "controller", argv, None))
        for index, host in enumerate(BROKERS):
            argv = [
                *mqgw, "broker",
                "--data-dir", str(self.root / host / "data"),
                "--host", self.address(host), "--port", str(BROKER_PORT),
                "--group", "g1", "--id", str(index), "--meta", self.meta_url,
                "--replication", "sync", "--min-in-sync", "2", "--replica-standing",
            ]  # fmt: skip
            self.processes.append(Process(host, "broker", argv, BROKER_PORT))
        for host in GATEWAYS:
            argv = [
                *mqgw, "serve",
                "--meta", self.meta_url,
                "--data-dir", str(self.root / host / "data"), "--node-name", host,
                "--host", self.address(host),
                "--amqp-port", str(AMQP_PORT), "--admin-port", str(ADMIN_PORT),
            ]  # fmt: skip
            self.processes.append(Process(host, "gateway", argv, AMQP_PORT))

    # -- life ---------------------------------------------------------------------------------

    def _start(self, process: Process) -> None:
        log = (self.root / "logs" / f"{process.host}-{process.role}.log").open("ab")
        env = {**os.environ, "MQGW_LOOPBACK_USERS": "[]", "PYTHONUNBUFFERED": "1"}
        process.proc = self.net.start(
            process.host, process.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
            stdin=subprocess.DEVNULL, cwd=str(self.root),
        )  # fmt: skip
        log.close()

    def start(self) -> None:
        """Everything, in dependency order, each answering before the next starts."""
        for role in ("redis", "sentinel", "controller", "broker", "gateway"):
            for process in self.processes:
                if process.role == role:
                    self._start(process)
            for process in self.processes:
                if process.role == role and process.port is not None:
                    self.wait_port(process.host, process.port, START_TIMEOUT_S)
        for gateway in GATEWAYS:
            self.wait_healthy(gateway, START_TIMEOUT_S)

    def on(self, host: str) -> list[Process]:
        return [p for p in self.processes if p.host == host]

    def kill(self, host: str) -> None:
        for process in self.on(host):
            if process.proc is not None and process.proc.poll() is None:
                process.proc.kill()
                process.proc.wait()
        self.down.add(host)
        self.paused.discard(host)

    def kill_role(self, host: str, role: str) -> None:
        """SIGKILL one kind of process on ``host`` (Redis, leaving its sentinel)."""
        for process in self.on(host):
            if process.role == role and process.proc is not None and process.proc.poll() is None:
                process.proc.kill()
                process.proc.wait()
        self.down.add(host)

    def restart(self, host: str) -> None:
        for process in self.on(host):
            if process.proc is None or process.proc.poll() is not None:
                self._start(process)
        self.down.discard(host)

    def pause(self, host: str) -> None:
        self._signal(host, signal.SIGSTOP)
        self.paused.add(host)

    def resume(self, host: str) -> None:
        self._signal(host, signal.SIGCONT)
        self.paused.discard(host)

    def _signal(self, host: str, sig: int) -> None:
        # ``ip netns exec`` execs the command: the Popen pid is the process itself.
        for process in self.on(host):
            if process.proc is not None and process.proc.poll() is None:
                os.kill(process.proc.pid, sig)

    def heal_processes(self) -> None:
        for host in sorted(self.paused):
            self.resume(host)
        for host in sorted(self.down):
            self.restart(host)

    def restart_failed_starts(self) -> int:
        """Start again, as a supervisor would (systemd's Restart=on-failure), every process
        that gave up starting with the product's one clear line (``cannot start: ...``, exit
        status 1: a gateway restarted while its broker group had no master for longer than
        its start waits). Any other exit stays a crash. Returns how many were started."""
        started = 0
        for process in self.processes:
            if process.proc is None or process.proc.poll() != 1 or process.host in self.down:
                continue
            tail = self.log_tail(process.host, process.role, 600).strip().splitlines()
            if tail and START_FAILURE in tail[-1]:
                self._start(process)
                self.start_failures += 1
                started += 1
        return started

    def crashed(self) -> list[str]:
        """Processes that exited though nobody killed them (every killed host was restarted
        by the heal): each one is a bug, with the tail of its log."""
        found = []
        for process in self.processes:
            if process.proc is not None and process.proc.poll() is not None:
                tail = self.log_tail(process.host, process.role, 600).strip().splitlines()
                last = tail[-1] if tail else ""
                found.append(f"{process.host} {process.role} exited {process.proc.returncode}: "
                             f"{last}")  # fmt: skip
        return found

    def stop(self) -> None:
        for process in self.processes:
            if process.proc is not None and process.proc.poll() is None:
                if process.host in self.paused:
                    os.kill(process.proc.pid, signal.SIGCONT)
                process.proc.kill()
                process.proc.wait()

    # -- probes -------------------------------------------------------------------------------

    def wait_port(self, host: str, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection((self.address(host), port), timeout=0.5):
                    return
            except OSError as error:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{host}:{port} did not answer: {error}") from None
            self._exited_early(host)
            time.sleep(0.1)

    def healthy(self, gateway: str) -> bool:
        try:
            with urllib.request.urlopen(f"{self.admin_url(gateway)}/api/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_healthy(self, gateway: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy(gateway):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{gateway} did not become healthy in {timeout_s:g} s")
            self.restart_failed_starts()
            self._exited_early(gateway)
            time.sleep(0.2)

    def _exited_early(self, host: str) -> None:
        for process in self.on(host):
            if process.proc is not None and process.proc.poll() is not None:
                tail = self.log_tail(host, process.role)
                raise RuntimeError(f"{host} {process.role} exited at start:\n{tail}")

    def log_tail(self, host: str, role: str, chars: int = 3000) -> str:
        path = self.root / "logs" / f"{host}-{role}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""
