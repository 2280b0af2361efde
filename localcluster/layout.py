"""What a local cluster runs and where, and ``D/cluster.json`` that records it.

Ports are chosen once (free loopback ports) and kept in cluster.json, so that restarting one
process (`mqgw cluster start NAME`) finds it where clients and the other processes expect it,
and `mqgw cluster up` after `down` reuses them when they are still free.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localcluster.broker_names import broker_name
from localcluster.ports import free_port, port_free

FORMAT = 2  # cluster.json's format version: bump when a reader must change
# Format 1 (cluster part 1) is format 2 without controllers, watcher, epochs and replication:
# read as such, so a cluster started by an older mqgw can still be stopped by this one.
READABLE_FORMATS = (1, 2)
STATE_FILE = "cluster.json"
BACKENDS = ("mqgw", "rocketmq")  # where the gateways keep messages: mqgw brokers, or RocketMQ
ROCKETMQ_DIR = "rocketmq"  # D/rocketmq: `mqgw rocketmq up`'s directory, with rocketmq.json
HOST = "127.0.0.1"  # every process binds loopback only
DEFAULT_TIMEOUT_S = 30.0  # to become ready; also the SIGTERM grace before SIGKILL


class ClusterError(Exception):
    """A cluster command cannot do what was asked; the message says why (shown as is)."""


@dataclass(kw_only=True)
class Member:
    """One process of the cluster. ``pid`` is None and ``alive`` False once it is stopped."""

    name: str
    role: str
    pid: int | None = None
    alive: bool = False
    data_dir: str
    log: str

    @property
    def ports(self) -> list[int]:
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        """Where clients reach it, for tables."""
        raise NotImplementedError


@dataclass(kw_only=True)
class RedisMember(Member):
    role: str = "redis"
    port: int
    url: str

    @property
    def ports(self) -> list[int]:
        return [self.port]

    @property
    def endpoint(self) -> str:
        return self.url


@dataclass(kw_only=True)
class BrokerMember(Member):
    # Unreplicated: always "master". Replicated: "master", "slave" or "none", as Redis says
    # (localcluster/roles.py), with the epoch it has it at.
    role: str = "master"
    group: str
    broker_id: str
    port: int
    address: str
    replication: str = "off"  # `mqgw broker --replication`: "sync" in a group of replicas
    epoch: int = 0
    in_sync: bool = True  # in its group's in-sync set (a lone master always is)

    @property
    def replicated(self) -> bool:
        return self.replication != "off"

    @property
    def ports(self) -> list[int]:
        return [self.port]

    @property
    def endpoint(self) -> str:
        return self.address


@dataclass(kw_only=True)
class GatewayMember(Member):
    role: str = "gateway"
    amqp_port: int
    admin_port: int
    amqp_url: str
    admin_url: str

    @property
    def ports(self) -> list[int]:
        return [self.amqp_port, self.admin_port]

    @property
    def endpoint(self) -> str:
        return f"amqp://{HOST}:{self.amqp_port} {self.admin_url}"


@dataclass(kw_only=True)
class ControllerMember(Member):
    """`mqgw controller`: no ports, no data (its state is in Redis): ``data_dir`` is ""."""

    role: str = "controller"
    url: str  # the Redis it decides through (--meta)
    leader: bool = False  # holds the controller lease, as last read

    @property
    def ports(self) -> list[int]:
        return []

    @property
    def endpoint(self) -> str:
        return "leader" if self.leader else "standby"


@dataclass(kw_only=True)
class WatcherMember(Member):
    """`python -m localcluster.watch D`: rewrites roles, epochs and the controller leader in
    cluster.json when they change. ``data_dir`` is D, whose cluster.json it keeps."""

    role: str = "watcher"

    @property
    def ports(self) -> list[int]:
        return []

    @property
    def endpoint(self) -> str:
        return STATE_FILE


@dataclass(kw_only=True)
class RocketMQMember(Member):
    """A JVM of the cluster's RocketMQ, for status and down: D/rocketmq/rocketmq.json describes
    it (not cluster.json) and localcluster.rocketmq.local starts and stops it."""

    address: str  # "127.0.0.1:PORT", where it listens for clients
    listen_ports: list[int] = field(default_factory=list)

    @property
    def ports(self) -> list[int]:
        return list(self.listen_ports)

    @property
    def endpoint(self) -> str:
        return self.address


@dataclass
class Cluster:
    dir: Path
    redis: RedisMember
    brokers: list[BrokerMember] = field(default_factory=list)
    gateways: list[GatewayMember] = field(default_factory=list)
    controllers: list[ControllerMember] = field(default_factory=list)
    watcher: WatcherMember | None = None
    retired: list[str] = field(default_factory=list)  # groups removed: names not used again
    backend: str = "mqgw"  # one of BACKENDS
    store_url: str | None = None  # the gateways' --store (rocketmq://NAMESRV), None: mqgw's

    @property
    def meta_url(self) -> str:
        return self.redis.url

    @property
    def rocketmq_dir(self) -> Path:
        return self.dir / ROCKETMQ_DIR

    @property
    def state_path(self) -> Path:
        return self.dir / STATE_FILE

    def members(self) -> list[Member]:
        """In start order: Redis, controllers, brokers, gateways, the watcher."""
        watcher = [self.watcher] if self.watcher is not None else []
        return [self.redis, *self.controllers, *self.brokers, *self.gateways, *watcher]

    def replicated_groups(self) -> list[str]:
        return sorted({b.group for b in self.brokers if b.replicated})

    def find(self, name: str) -> Member:
        for member in self.members():
            if member.name == name:
                return member
        names = ", ".join(m.name for m in self.members())
        rocketmq = ""
        if self.backend == "rocketmq":  # its JVMs are one unit: `up` and `down` move them
            rocketmq = f"; RocketMQ's: `mqgw rocketmq status --dir {self.rocketmq_dir}`"
        raise ClusterError(
            f"no process named {name!r} in {self.state_path} (there are: {names}{rocketmq})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dir": str(self.dir),
            "updated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "meta_url": self.meta_url,
            # Additions to format 2 that an older reader skips: it stops the gateways and
            # Redis of a RocketMQ-backed cluster, and `mqgw rocketmq down` the rest.
            "backend": self.backend,
            "store_url": self.store_url,
            "redis": asdict(self.redis),
            "controllers": [asdict(c) for c in self.controllers],
            "brokers": [asdict(b) for b in self.brokers],
            "gateways": [asdict(g) for g in self.gateways],
            "watcher": asdict(self.watcher) if self.watcher is not None else None,
            "retired_groups": list(self.retired),
        }

    def save(self) -> None:
        """Write cluster.json atomically: a reader never sees half a file."""
        temporary = self.state_path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        temporary.replace(self.state_path)


def load(directory: Path) -> Cluster:
    """The cluster described by ``directory``/cluster.json; ClusterError if there is none."""
    path = directory / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterError(
            f"no cluster in {directory} ({STATE_FILE} is missing): "
            f"`mqgw cluster up --dir {directory}` starts one"
        ) from None
    except (OSError, ValueError) as error:
        raise ClusterError(f"cannot read {path}: {error}") from None
    if data.get("format") not in READABLE_FORMATS:
        raise ClusterError(
            f"{path} has format {data.get('format')!r}; this mqgw reads formats "
            f"{', '.join(map(str, READABLE_FORMATS))} (a newer mqgw wrote it: use that one)"
        )
    try:
        watcher = data.get("watcher")
        return Cluster(
            dir=directory,
            redis=RedisMember(**data["redis"]),
            brokers=[BrokerMember(**b) for b in data["brokers"]],
            gateways=[GatewayMember(**g) for g in data["gateways"]],
            controllers=[ControllerMember(**c) for c in data.get("controllers", [])],
            watcher=WatcherMember(**watcher) if watcher is not None else None,
            retired=[str(g) for g in data.get("retired_groups", [])],
            backend=str(data.get("backend", "mqgw")),
            store_url=data.get("store_url"),
        )
    except (KeyError, TypeError) as error:
        raise ClusterError(f"{path} is not a cluster description: {error}") from None


class _Ports:
    """Hands out distinct loopback ports: a previous one when it is still free, else a new
    one the kernel says is free now."""

    def __init__(self, taken: Iterable[int] = ()) -> None:
        self._taken: set[int] = set(taken)  # the cluster's other members' ports, when adding

    def take(self, previous: int | None = None) -> int:
        if previous and previous not in self._taken and port_free(previous):
            self._taken.add(previous)
            return previous
        while True:
            port = free_port()
            if port not in self._taken:
                self._taken.add(port)
                return port


@dataclass(frozen=True)
class Shape:
    """What `mqgw cluster up` was asked for."""

    gateways: int = 1
    groups: int = 1
    replicas: int = 1  # brokers per group; 2 or more: replicated (`--replication sync`)
    controllers: int = 0
    # "rocketmq": no mqgw brokers, controllers or watcher; RocketMQ's own processes instead,
    # ``replicas`` brokers (2: master and slave in its controller mode).
    backend: str = "mqgw"


def plan(
    directory: Path, shape: Shape, previous: Cluster | None, taken: Iterable[int] = ()
) -> Cluster:
    """The processes of a new cluster in ``directory``: names, ports, data dirs and logs.
    Names that ``previous`` had keep their ports where they can (same data, same place);
    none gets a port of ``taken`` (a stopped RocketMQ's, which it gets back)."""
    ports = _Ports(taken)
    old: dict[str, Member] = {m.name: m for m in previous.members()} if previous else {}

    def old_port(name: str, index: int = 0) -> int | None:
        member = old.get(name)
        return member.ports[index] if member is not None else None

    def logfile(name: str) -> str:
        return str(directory / "logs" / f"{name}.log")

    redis_port = ports.take(old_port("redis"))
    redis = RedisMember(
        name="redis",
        port=redis_port,
        url=f"redis://{HOST}:{redis_port}/0",
        data_dir=str(directory / "redis"),
        log=logfile("redis"),
    )
    # Over RocketMQ: none of mqgw's storage tiers (RocketMQ's controller elects its masters).
    ours = shape.backend != "rocketmq"
    controllers = [
        ControllerMember(name=f"c{n}", url=redis.url, data_dir="", log=logfile(f"c{n}"))
        for n in range(1, (shape.controllers if ours else 0) + 1)
    ]
    replicated = shape.replicas > 1 and ours
    brokers = []
    for number in range(1, (shape.groups if ours else 0) + 1):
        brokers += group_members(directory, f"g{number}", shape.replicas, ports, old_port)
    watcher = None
    if replicated or controllers:  # roles or a leader that can change while it runs
        watcher = WatcherMember(name="watcher", data_dir=str(directory), log=logfile("watcher"))
    members = []
    for number in range(1, shape.gateways + 1):
        name = f"gw{number}"
        amqp_port, admin_port = ports.take(old_port(name, 0)), ports.take(old_port(name, 1))
        members.append(
            GatewayMember(
                name=name,
                amqp_port=amqp_port,
                admin_port=admin_port,
                amqp_url=f"amqp://guest:guest@{HOST}:{amqp_port}/%2F",
                admin_url=f"http://{HOST}:{admin_port}",
                data_dir=str(directory / "gateways" / name),
                log=logfile(name),
            )
        )
    return Cluster(directory, redis, brokers, members, controllers, watcher, backend=shape.backend)


def group_members(
    directory: Path,
    group: str,
    replicas: int,
    ports: _Ports,
    old_port: Callable[[str], int | None] = lambda _name: None,
) -> list[BrokerMember]:
    """The brokers of one group (by `up`, and by `add-group` for a group added later)."""
    replicated = replicas > 1
    members = []
    for broker_id in range(replicas):
        name = broker_name(group, str(broker_id))
        port = ports.take(old_port(name))
        members.append(
            BrokerMember(
                name=name,
                group=group,
                broker_id=str(broker_id),
                port=port,
                address=f"{HOST}:{port}",
                data_dir=str(directory / "brokers" / f"{group}-{broker_id}"),
                log=str(directory / "logs" / f"{name}.log"),
                # A replicated broker's role is the controller's to give: none until it does.
                replication="sync" if replicated else "off",
                role="none" if replicated else "master",
                in_sync=not replicated,
            )
        )
    return members


def new_group(cluster: Cluster, replicas: int) -> list[BrokerMember]:
    """The brokers of a group added to ``cluster``: g<N+1> after its highest g<N>, on ports
    none of its members has (a stopped member keeps its ports for its restart)."""
    names = [b.group for b in cluster.brokers] + cluster.retired
    numbers = [int(g[1:]) for g in names if g[1:].isdigit()]
    group = f"g{max(numbers, default=0) + 1}"
    taken = [port for member in cluster.members() for port in member.ports]
    return group_members(cluster.dir, group, replicas, _Ports(taken))
