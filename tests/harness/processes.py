"""Start real servers for tests: the gateway as `mqgw serve` runs it, on free loopback ports.

Every child gets PR_SET_PDEATHSIG, so it dies with the test process even on a hard kill:
servers started for tests stop by themselves.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from bench.servers import check_for, die_with_parent

__all__ = ["REPO", "GatewayProcess", "check_for", "die_with_parent"]

REPO = Path(__file__).resolve().parents[2]


_READY = re.compile(r"AMQP on [^ ]+:(\d+), admin on (?:off|[^ ]+:(\d+))")


class GatewayProcess:
    """`mqgw serve` in a subprocess; ``url`` once started."""

    def __init__(
        self, data_dir: Path, args: Sequence[str] = (), env: dict[str, str] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.args = list(args)
        self.env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.amqp_port = 0
        self.admin_port = 0
        self.log_lines: list[str] = []
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    def start(self, timeout_s: float = 30) -> GatewayProcess:
        self._ready.clear()
        self.log_lines = []
        cmd = [
            sys.executable, "-m", "mqgw_cli.main", "serve",
            "--host", "127.0.0.1", "--amqp-port", "0", "--admin-port", "0",
            "--data-dir", str(self.data_dir), *self.args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(timeout_s) or self.proc.poll() is not None:
            self.kill()
            raise RuntimeError("gateway did not start:\n" + "".join(self.log_lines[-40:]))
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log_lines.append(line)
            match = _READY.search(line)
            if match and not self._ready.is_set():
                self.amqp_port = int(match.group(1))
                self.admin_port = int(match.group(2) or 0)
                self._ready.set()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
        """Send ``sig`` and wait; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return "".join(self.log_lines)
