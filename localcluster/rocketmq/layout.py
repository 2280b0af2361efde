"""What a local RocketMQ is made of, and ``D/rocketmq.json``, which describes it.

    D/rocketmq.json          this file: the name server's address, every process, its ports
    D/rocketmq-home/         $ROCKETMQ_HOME (the JVMs refuse to start without one)
    D/namesrv/               namesrv.conf, console.log, home/ (user.home: RocketMQ's own
                             logs under home/logs/rocketmqlogs), controller/ (its Raft log)
    D/broker-N/              broker.conf, console.log, home/, store/ (commitlog, queues)

A later `up` on the same directory starts the same processes on the same ports over the
same data, so a broker keeps its identity in the controller's records.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localcluster.ports import HOST, free_port, port_free

STATE_FILE = "rocketmq.json"
CLUSTER = "mqgw"
BROKER_NAME = "broker-a"
CONTROLLER_GROUP = "mqgw"
NAMESRV = "namesrv"
DEFAULT_TIMEOUT_S = 60.0  # a JVM boots in seconds, more on a busy 2-core machine


class RocketMQError(Exception):
    """`mqgw rocketmq` cannot do what was asked: a message for people."""


@dataclass
class Process:
    """One JVM: the name server (with the controller embedded when replicated) or a broker."""

    name: str  # "namesrv", "broker-1", ...
    role: str  # "namesrv" | "broker"
    ports: dict[str, int]  # listen, and: controller | fast (listen - 2), ha
    dir: str
    pid: int | None = None

    @property
    def conf(self) -> str:
        return str(Path(self.dir) / f"{self.role}.conf")

    @property
    def log(self) -> str:
        """Its stdout and stderr: boot lines and fatal errors (RocketMQ's own logs: ``home``)."""
        return str(Path(self.dir) / "console.log")

    @property
    def home(self) -> str:
        return str(Path(self.dir) / "home")

    @property
    def address(self) -> str:
        return f"{HOST}:{self.ports['listen']}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(log=self.log, conf=self.conf, home=self.home)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Process:
        ports = {str(k): int(v) for k, v in data["ports"].items()}
        return cls(data["name"], data["role"], ports, data["dir"], data.get("pid"))


@dataclass
class Layout:
    """The whole of one local RocketMQ, as ``D/rocketmq.json`` holds it."""

    dir: Path
    version: str
    replicas: int
    lib: str
    processes: list[Process] = field(default_factory=list)
    cluster: str = CLUSTER
    broker_name: str = BROKER_NAME

    @property
    def namesrv(self) -> Process:
        return next(p for p in self.processes if p.role == NAMESRV)

    @property
    def brokers(self) -> list[Process]:
        return [p for p in self.processes if p.role == "broker"]

    @property
    def controller(self) -> str | None:
        """The controller's address (embedded in the name server), when replicated."""
        port = self.namesrv.ports.get("controller")
        return None if port is None else f"{HOST}:{port}"

    @property
    def rocketmq_home(self) -> Path:
        return self.dir / "rocketmq-home"

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "namesrv": self.namesrv.address,
            "cluster": self.cluster,
            "broker_name": self.broker_name,
            "replicas": self.replicas,
            "controller": self.controller,
            "processes": [p.to_json() for p in self.processes],
            "lib": self.lib,
        }

    def save(self) -> None:
        """Write rocketmq.json whole or not at all (a rename), so readers never see half."""
        path = self.dir / STATE_FILE
        tmp = path.with_name(f".{STATE_FILE}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)


def load(directory: Path) -> Layout | None:
    """The layout ``directory/rocketmq.json`` describes, or None if there is none."""
    path = directory / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise RocketMQError(f"{path} is unreadable ({error}): remove it to start afresh") from None
    processes = [Process.from_json(p) for p in data["processes"]]
    return Layout(
        directory,
        data["version"],
        int(data["replicas"]),
        data["lib"],
        processes,
        data.get("cluster", CLUSTER),
        data.get("broker_name", BROKER_NAME),
    )


def plan(directory: Path, version: str, replicas: int, lib: Path) -> Layout:
    """A new layout on free loopback ports: a name server (plus the controller when
    ``replicas`` ≥ 2) and ``replicas`` brokers."""
    taken: set[int] = set()

    def pick(*, with_fast: bool = False) -> int:
        while True:
            port = free_port()
            # A broker also listens on port - 2 (its "fast" channel, not configurable).
            others = [port - 2] if with_fast else []
            wanted = [port, *others]
            if not taken & set(wanted) and all(p > 1024 and port_free(p) for p in others):
                taken.update(wanted)
                return port

    ns_ports = {"listen": pick()}
    if replicas > 1:
        ns_ports["controller"] = pick()
    processes = [Process(NAMESRV, NAMESRV, ns_ports, str(directory / NAMESRV))]
    for n in range(1, replicas + 1):
        listen = pick(with_fast=True)
        ports = {"listen": listen, "fast": listen - 2, "ha": pick()}
        processes.append(Process(f"broker-{n}", "broker", ports, str(directory / f"broker-{n}")))
    return Layout(directory, version, replicas, str(lib), processes)
