"""What a comparison compares, and how each side is started and stopped.

- the embedded node: `mqgw serve` with its own store, sync flush (fsync before each confirm);
- RabbitMQ: a private node, persistent messages in durable classic queues (fsync, confirm);
- over RocketMQ: a local RocketMQ 5 (`mqgw rocketmq up`'s processes) and a gateway with
  `--store rocketmq://`, its CPU per process (gateway, name server, broker);
- a cluster: Redis, one storage broker (no replicas) and N gateways, started with the code of
  `mqgw cluster up` in a private directory, the broker with sync flush too (the store is
  where flushing happens; the gateways get the same setting). Publishers and consumers are
  spread over its gateways (``Target.urls``).

Each side is a context manager yielding a ``Side``; leaving it stops everything it started,
also on an exception or Ctrl-C.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import re
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.cpu_cap import CapStats, CpuCap, describe
from bench.load.runner import Target, console
from bench.processes import die_with_parent
from bench.rabbitmq_node import RabbitMQProcess
from bench.servers import GatewayServer
from localcluster import control
from localcluster.layout import Member, Shape
from localcluster.rocketmq import local

CLUSTER_START_TIMEOUT_S = 60.0
CLUSTER_STOP_TIMEOUT_S = 20.0
ROCKETMQ_START_TIMEOUT_S = 120.0
Counters = dict[str, dict[str, int]]  # gateway name -> {"publish": n, "deliver": m}


@dataclass
class Side:
    """One started system of a comparison."""

    name: str  # "cluster-2gw", "embedded", "rabbitmq": the key in results and tables
    target: Target
    gateways: int | None = None  # a cluster's gateway count; None for a single node
    pids: list[int] = field(default_factory=list)  # every process it runs, to check they go
    counters: Callable[[], Counters] | None = None  # per gateway totals, now
    cap_stats: Callable[[], CapStats] | None = None  # its capped gateways' CPU, now
    other_pids: dict[str, int] = field(default_factory=dict)  # processes beside the target's

    @property
    def is_cluster(self) -> bool:
        return self.gateways is not None


@contextlib.contextmanager
def gateway_target(root: Path, launcher: Sequence[str] = ()) -> Iterator[Target]:
    """A gateway (sync flush) on free loopback ports; ``launcher``: Python's arguments before
    the gateway's module (a profiler's, bench/profile.py)."""
    server = GatewayServer(root / "gateway-data", flush="sync", launcher=launcher).start()
    try:
        yield Target(
            server.url, "mqgw", f"mqgw: {server.flush_policy}", server.pid, root / "gateway-data"
        )
    finally:
        server.stop()


@contextlib.contextmanager
def rabbitmq_target(root: Path) -> Iterator[Target]:
    server = RabbitMQProcess(root / "rabbitmq").start()
    try:
        yield Target(
            server.url, "rabbitmq", f"rabbitmq: {server.flush_policy}", server.pid,
            root / "rabbitmq" / "mnesia",
        )  # fmt: skip
    finally:
        server.stop()


@contextlib.contextmanager
def embedded_side(root: Path, cap: CpuCap | None = None) -> Iterator[Side]:
    """The embedded node; with ``cap``, under the same CPU cap as each cluster gateway."""
    console.print("starting the embedded node (sync flush)")
    with gateway_target(root) as target:
        assert target.pid is not None
        side = Side("embedded", target, pids=[target.pid])
        if cap is not None:
            cap.cap("embedded", target.pid)
            side.target = replace(target, policy=f"{target.policy}; {describe(cap.cores)}")
            side.cap_stats = functools.partial(cap.stats, ["embedded"])
        yield side


@contextlib.contextmanager
def rabbitmq_side(root: Path) -> Iterator[Side]:
    console.print("starting RabbitMQ")
    server = RabbitMQProcess(root / "rabbitmq").start()
    try:
        target = Target(
            server.url, "rabbitmq", f"rabbitmq: {server.flush_policy}", server.pid,
            root / "rabbitmq" / "mnesia",
        )  # fmt: skip
        pids = [p.pid for p in (server.proc, server.epmd) if p is not None]
        yield Side("rabbitmq", target, pids=pids)
    finally:
        server.stop()


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set environment variables for the processes started inside (they inherit ours)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def cluster_side(root: Path, gateways: int, cap: CpuCap | None = None) -> Iterator[Side]:
    """A cluster; with ``cap``, each gateway in a cgroup of its own (not Redis, not the
    broker)."""
    name = f"cluster-{gateways}gw"
    directory = root / name
    console.print(f"starting {name}: redis, 1 broker (sync flush), {gateways} gateway(s)")

    def on_ready(member: Member, seconds: float) -> None:
        console.print(f"  {name}: {member.name} ready in {seconds:.1f} s (pid {member.pid})")

    with _environment(MQGW_FLUSH="sync"):
        cluster = control.up(directory, Shape(gateways=gateways), CLUSTER_START_TIMEOUT_S, on_ready)
    try:
        urls = tuple(g.amqp_url for g in cluster.gateways)
        broker = cluster.brokers[0]
        policy = (
            f"cluster: {gateways} gateway(s) -> 1 broker, sync flush: group-commit fsync "
            "before each confirm"
        )
        capped: list[str] = []
        if cap is not None:
            for gateway in cluster.gateways:
                assert gateway.pid is not None
                capped.append(f"{name}-{gateway.name}")
                cap.cap(capped[-1], gateway.pid)
            policy += f"; {describe(cap.cores)}"
        target = Target(urls[0], name, policy, None, Path(broker.data_dir), urls=urls)
        admins = {g.name: g.admin_url for g in cluster.gateways}
        pids = [m.pid for m in cluster.members() if m.pid is not None]
        side = Side(name, target, gateways, pids, lambda: gateway_counters(admins))
        if cap is not None:
            side.cap_stats = functools.partial(cap.stats, capped)
        yield side
    finally:
        stopped = control.down(directory, CLUSTER_STOP_TIMEOUT_S)
        left = [s.member.name for s in stopped if not s.gone]
        if left:
            console.print(f"[red]{name}: still running after down: {', '.join(left)}")


@contextlib.contextmanager
def rocketmq_side(root: Path) -> Iterator[Side]:
    """A gateway over a local RocketMQ (one name server, one broker, sync flush); the CPU of
    its JVMs is reported per process (``Side.other_pids``)."""
    console.print("starting RocketMQ (name server, broker: sync flush) and a gateway over it")
    layout = local.up(root / "rocketmq", 1, ROCKETMQ_START_TIMEOUT_S, preexec=die_with_parent)
    try:
        store = f"rocketmq://{layout.namesrv.address}/bench"
        server = GatewayServer(root / "gateway-on-rocketmq", ["--store", store]).start()
        try:
            policy = "mqgw over RocketMQ 5: confirm after the broker's sync flush"
            target = Target(server.url, "rocketmq", policy, server.pid, root / "rocketmq")
            jvms = {p.name: p.pid for p in layout.processes if p.pid is not None}
            side = Side("over-rocketmq", target, pids=[server.pid, *jvms.values()])
            side.other_pids = jvms
            yield side
        finally:
            server.stop()
    finally:
        local.down(root / "rocketmq", purge=True)


def gateway_counters(admin_urls: dict[str, str]) -> Counters:
    """Each gateway's own publishes and deliveries so far, from its /metrics (its
    /api/overview counts the whole cluster, as a RabbitMQ node's does)."""
    counters: Counters = {}
    for name, url in admin_urls.items():
        request = urllib.request.Request(url.rstrip("/") + "/metrics")
        request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read().decode()
        except OSError:
            text = ""
        counters[name] = {
            "publish": _metric(text, "rabbitmq_global_messages_received_total"),
            "deliver": _metric(text, "rabbitmq_global_messages_delivered_total"),
        }
    return counters


def _metric(text: str, name: str) -> int:
    """The value of counter ``name`` in a Prometheus text page (0 when it is not there)."""
    found = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else 0


def counters_delta(before: Counters, after: Counters) -> Counters:
    return {
        name: {key: value - before.get(name, {}).get(key, 0) for key, value in now.items()}
        for name, now in after.items()
    }


def pid_alive(pid: int) -> bool:
    """``pid`` still runs (a zombie of ours counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
