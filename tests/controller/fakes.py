"""Real `mqgw controller` processes, and brokers that speak the heartbeat contract without
storing anything (replication is not built yet: these stand in for its broker side)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from meta.groups.link import GroupLink
from meta.groups.records import SEQ_BOOT_SHIFT, GroupRecord, LagReport, ReplicaReport
from tests.harness.processes import REPO, die_with_parent
from tests.harness.waiting import eventually


class ControllerProcess:
    def __init__(self, name: str, url: str, log_path: Path, *flags: str) -> None:
        self.name, self.url, self.log_path, self.flags = name, url, log_path, flags
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ControllerProcess:
        command = [sys.executable, "-m", "mqgw_cli.main", "controller", "--meta", self.url,
                   "--name", self.name, *self.flags]  # fmt: skip
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
            )  # fmt: skip
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def leads(self) -> bool:
        return f"controller {self.name} leads" in self.log()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait: the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(10)


async def wait_for(what: str, probe: object, timeout_s: float) -> float:
    """Poll ``probe()`` (sync or async) until truthy; the seconds it took."""
    return (await eventually(timeout_s, probe, what))[1]  # type: ignore[arg-type]


@dataclass
class FakeBroker:
    """Heartbeats every 200 ms and follows the answers: its role, epoch and fence come from
    the group record only. As master it asks for ``caught_up`` to join the in-sync set."""

    link: GroupLink
    group: str
    broker_id: str
    end: int = 10
    caught_up: frozenset[str] = frozenset()
    boot: int = 1
    record: GroupRecord | None = None
    beats: int = 0
    epoch: int = 0
    role: str = "none"
    fenced_version: int = 0
    stopped: bool = False
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    def start(self) -> FakeBroker:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        """Silence, as a kill -9 would."""
        self.stopped = True
        if self._task is not None:
            self._task.cancel()

    async def beat(self) -> GroupRecord:
        self.beats += 1
        report = ReplicaReport(
            self.group, self.broker_id, self.boot << SEQ_BOOT_SHIFT | self.beats, self.epoch,
            self.role, log_epoch=self.epoch, end=self.end, confirmed=self.end,  # type: ignore[arg-type]
            fenced_version=self.fenced_version, address=f"fake-{self.broker_id}",
        )  # fmt: skip
        lag = None
        if self.role == "master":
            lag = LagReport(self.group, self.broker_id, self.epoch, caught_up=self.caught_up)
        _, record = await self.link.heartbeat(report, lag)
        before = (self.role, self.epoch, self.fenced_version)
        self.record, self.epoch = record, max(self.epoch, record.epoch)
        self.role = "master" if record.master == self.broker_id else "slave"
        if record.master != self.broker_id:
            self.role = "slave" if record.master else "none"
        self.fenced_version = record.fence_version if self.role == "master" else 0
        if (self.role, self.epoch, self.fenced_version) != before:
            return await self.beat()  # the contract: say a change of role or fence at once
        return record

    async def _run(self) -> None:
        while not self.stopped:
            await self.beat()
            await asyncio.sleep(0.2)
