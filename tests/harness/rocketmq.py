"""A real local RocketMQ for tests: `local_rocketmq(dir)` and the session fixture `rocketmq`.

The processes are those of `mqgw rocketmq up` (localcluster/rocketmq/), started from the test
process itself with a parent-death signal, so they die with the test run however it ends.
The session fixture is one name server and one broker shared by every test that asks for it:
each test uses its own topic names. The release comes from the cache scripts/setup-dev fills
(fetched here if it is missing).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from localcluster.rocketmq import conf, local, procs, remoting
from localcluster.rocketmq.layout import Layout
from tests.harness.processes import die_with_parent

__all__ = ["Broker", "LocalRocketMQ", "local_rocketmq", "rocketmq"]

_START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Broker:
    name: str  # as in rocketmq.json: "broker-1", ...
    address: str  # "127.0.0.1:PORT", what clients and the name server know it by
    pid: int | None  # None once killed
    role: str  # when read: "master", "slave" or "unregistered" (per the name server)


class LocalRocketMQ:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    @property
    def directory(self) -> Path:
        return self.layout.dir

    @property
    def namesrv(self) -> str:
        return self.layout.namesrv.address

    @property
    def controller(self) -> str | None:
        return self.layout.controller

    @property
    def cluster(self) -> str:
        return self.layout.cluster

    @property
    def broker_name(self) -> str:
        return self.layout.broker_name

    @property
    def brokers(self) -> list[Broker]:
        """Every broker, with its role as the name server has it now."""
        roles = local.broker_roles(self.layout)
        return [Broker(b.name, b.address, b.pid, roles[b.name]) for b in self.layout.brokers]

    def master(self) -> Broker | None:
        return next((b for b in self.brokers if b.role == "master"), None)

    def kill(self, name: str) -> None:
        """SIGKILL one process (as a crash)."""
        local.kill(self.layout, name)

    def kill_master(self) -> Broker:
        """SIGKILL the master broker; the one killed (as it was)."""
        master = self.master()
        assert master is not None, f"no master among {self.brokers}"
        self.kill(master.name)
        return master

    def wait_for_master(self, timeout_s: float, not_name: str | None = None) -> Broker:
        """A master other than ``not_name``, polled from the name server until ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            master = self.master()
            if master is not None and master.name != not_name:
                return master
            if time.monotonic() > deadline:
                raise AssertionError(f"no new master within {timeout_s} s: {self.brokers}")
            time.sleep(0.05)

    def has_topic(self, broker: Broker, topic: str) -> bool:
        """``broker`` has ``topic`` in its own topic table (a slave copies its master's every
        few seconds: until then a failover would leave the new master without it)."""
        body = remoting.fastjson(remoting.request(broker.address, remoting.GET_ALL_TOPIC_CONFIG))
        return topic in (body.get("topicConfigTable") or {})

    def wait_for_topic(self, topic: str, timeout_s: float = 30.0) -> None:
        """Until every running broker has ``topic``."""
        deadline = time.monotonic() + timeout_s
        while not all(self.has_topic(b, topic) for b in self.brokers if b.pid is not None):
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic} not on every broker within {timeout_s} s")
            time.sleep(0.2)

    def mqadmin(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """RocketMQ's admin tool against this name server (a JVM: about 4 s a call)."""
        return subprocess.run(
            conf.mqadmin_command(self.layout, *args),
            env=conf.environment(self.layout),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def stop(self) -> None:
        """SIGKILL everything: a test's data is thrown away, and a JVM's graceful stop is slow."""
        for process in self.layout.processes:
            procs.kill(process)
            process.pid = None
        self.layout.save()


@contextmanager
def local_rocketmq(directory: Path, replicas: int = 1) -> Iterator[LocalRocketMQ]:
    """A name server and a broker group (``replicas`` ≥ 2: controller mode) in ``directory``,
    running until the block ends."""
    layout = local.up(directory, replicas, _START_TIMEOUT_S, preexec=die_with_parent)
    running = LocalRocketMQ(layout)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRocketMQ]:
    """One shared single-broker RocketMQ for the whole session: use your own topic names."""
    with local_rocketmq(tmp_path_factory.mktemp("rocketmq")) as running:
        yield running
