"""`mqgw serve --workers N`: the cluster topology on one host, supervised by one command.

It starts, as its own children (localcluster/launch.py builds the Redis and broker command
lines, as for `mqgw cluster up`):

- ``redis``: a private `redis-server` from the PATH on a free loopback port, its AOF in
  ``<data-dir>/redis`` (the metadata: queues, bindings, users, leases);
- ``broker``: one `mqgw broker` with its store in ``<data-dir>/broker`` (the messages; the
  store settings, flush mode first, are the ones `mqgw serve` would use);
- ``w1`` … ``wN``: N `mqgw serve --meta redis://…` gateways, all on the SAME AMQP and admin
  ports (SO_REUSEPORT, the ``reuse_port`` setting): the kernel spreads incoming connections
  over them, and each queue partition is delivered by one of them (delivery leases).

Every other flag of `mqgw serve` (and the MQGW_* environment, and --config) applies to each
worker; node names get a ``-wK`` suffix; each worker's own directory is
``<data-dir>/workers/wK``. Logs are in ``<data-dir>/logs/<name>.log``. docs/cluster.md has
more ("One host, several cores").
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any

from gateway.config.settings import GatewaySettings
from gateway.config.sources import HOST as HOST_KEY
from gateway.config.sources import flag_name
from localcluster import launch, probes
from localcluster.layout import HOST, BrokerMember, Cluster, ClusterError, RedisMember
from localcluster.ports import free_port, port_free
from mqgw_cli.broker_command import STORE_KEYS
from mqgw_cli.config_commands import DEST
from mqgw_cli.supervisor import Child, StartFailed, Supervisor

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
BROKER_GROUP, BROKER_ID = "g1", "0"
# Set per worker here, whatever the command line said.
_OWN_KEYS = {"meta", "data_dir", "node_name", "reuse_port", "amqp_port", "admin_port"}


def _say(text: str) -> None:
    print(text, flush=True)


def passthrough_flags(args: argparse.Namespace) -> list[str]:
    """The settings flags given to `mqgw serve`, as they were given (flags are only recorded
    when given), minus those set per worker."""
    flags: list[str] = []
    for dest, raw in sorted(vars(args).items()):
        if not dest.startswith(DEST):
            continue
        key = dest[len(DEST) :]
        if key in _OWN_KEYS:
            continue
        name = "--host" if key == HOST_KEY else flag_name(key)
        if isinstance(raw, bool):
            flags.append(name if raw else "--no-" + name[2:])
        elif isinstance(raw, list):
            for item in raw:
                flags += [name, str(item)]
        else:
            flags += [name, str(raw)]
    return flags


def store_flags(settings: GatewaySettings) -> list[str]:
    """The effective store settings (from any source) as `mqgw broker` flags."""
    flags: list[str] = []
    for key in STORE_KEYS:
        if key in ("config_file", "data_dir"):
            continue
        value: Any = getattr(settings, key)
        name = flag_name(key)
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(name if value else "--no-" + name[2:])
        else:
            flags += [name, str(value.value if isinstance(value, Enum) else value)]
    return flags


def _redis_child(cluster: Cluster, logs: Path) -> Child:
    redis = cluster.redis
    return Child(
        name="redis",
        argv=launch.command(redis, cluster),
        log=logs / "redis.log",
        ready=lambda child: probes.redis_ping(redis.port),
        describe=redis.url,
    )


def _broker_child(cluster: Cluster, settings: GatewaySettings, logs: Path) -> Child:
    broker = cluster.brokers[0]

    def ready(child: Child) -> bool:
        assert child.proc is not None
        # Its log says it listens and is registered in Redis: then the workers find it.
        return launch.Starting(broker, child.proc, child.log_offset, child.started_at).ready()

    # The broker's ready lines are info lines: its level is set here, not taken from serve's.
    argv = [*launch.command(broker, cluster), *store_flags(settings), "--log-level", "info"]
    return Child("broker", argv, Path(broker.log), ready, describe=broker.address)


def _worker_child(
    number: int, args: argparse.Namespace, settings: GatewaySettings, meta_url: str, logs: Path
) -> Child:
    name = f"w{number}"
    amqp_port, admin_port = settings.amqp_port, settings.admin_port
    with_admin = admin_port != 0 and args.backend == "asyncio"  # no admin server under trio
    argv = [
        sys.executable, "-m", "mqgw_cli.main", "serve", "--backend", args.backend,
        *passthrough_flags(args),
        "--meta", meta_url,
        "--data-dir", str(settings.data_dir / "workers" / name),
        "--node-name", f"{settings.node_name}-{name}",
        "--reuse-port",
        "--amqp-port", str(amqp_port), "--admin-port", str(admin_port),
    ]  # fmt: skip

    def ready(child: Child) -> bool:
        # Its own listening sockets: connecting to the shared port could reach another one.
        pid = child.pid
        return pid is not None and (
            probes.listening(pid, amqp_port)
            and (not with_admin or probes.listening(pid, admin_port))
        )

    where = f"AMQP :{amqp_port}" + (f", admin :{admin_port}" if with_admin else "")
    return Child(name, argv, logs / f"{name}.log", ready, describe=where)


def _plan_cluster(data_dir: Path) -> Cluster:
    redis_port, broker_port = free_port(), free_port()  # distinct: never handed out twice
    redis = RedisMember(
        name="redis",
        port=redis_port,
        url=f"redis://{HOST}:{redis_port}/0",
        data_dir=str(data_dir / "redis"),
        log=str(data_dir / "logs" / "redis.log"),
    )
    broker = BrokerMember(
        name="broker",
        group=BROKER_GROUP,
        broker_id=BROKER_ID,
        port=broker_port,
        address=f"{HOST}:{broker_port}",
        data_dir=str(data_dir / "broker"),
        log=str(data_dir / "logs" / "broker.log"),
    )
    return Cluster(data_dir, redis, [broker])


def _check(settings: GatewaySettings, workers: int) -> str | None:
    """Why these settings cannot run as workers, or None."""
    if workers < 2:
        return f"--workers {workers}: give 2 or more (1, or no flag: one embedded node)"
    if settings.meta:
        return "--workers starts its own Redis and broker; --meta joins an existing cluster"
    for what, port in (("amqp", settings.amqp_port), ("admin", settings.admin_port)):
        if port and not port_free(port):
            return f"the {what} port {port} is in use by another process"
    if settings.tls_port and not port_free(settings.tls_port):
        return f"the AMQPS port {settings.tls_port} is in use by another process"
    return None


def run(args: argparse.Namespace, settings: GatewaySettings) -> int:
    """Start everything, supervise it until SIGTERM or SIGINT, stop it in order."""
    problem = _check(settings, args.workers)
    if problem is not None:
        print(f"mqgw serve: {problem}", file=sys.stderr)
        return 2
    try:
        launch.redis_server()
    except ClusterError as error:
        print(f"mqgw serve --workers: {error}", file=sys.stderr)
        return 2
    data_dir = settings.data_dir.resolve()
    updates: dict[str, Any] = {"data_dir": data_dir}
    if settings.amqp_port == 0:  # one port for all: choose it here, not per worker
        updates["amqp_port"] = free_port()
    settings = settings.model_copy(update=updates)
    if (data_dir / "store").exists():
        _say(f"note: {data_dir}/store is an embedded node's store; workers use {data_dir}/broker")
    logs = data_dir / "logs"
    cluster = _plan_cluster(data_dir)
    Path(cluster.redis.data_dir).mkdir(parents=True, exist_ok=True)
    root = os.pathsep.join(p for p in (str(launch.PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": root, "PYTHONUNBUFFERED": "1"}

    def on_ready(child: Child, seconds: float, again: bool) -> None:
        what = "ready again" if again else "ready"
        _say(f"✓ {child.name:<7} pid {child.pid:<8} {child.describe}  {what} in {seconds:.1f} s")

    supervisor = Supervisor(env, Path.cwd(), on_ready)

    def stop(signum: int, frame: FrameType | None) -> None:
        supervisor.stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        supervisor.start_tier([_redis_child(cluster, logs)], READY_TIMEOUT_S)
        supervisor.start_tier([_broker_child(cluster, settings, logs)], READY_TIMEOUT_S)
        workers = [
            _worker_child(n, args, settings, cluster.meta_url, logs)
            for n in range(1, args.workers + 1)
        ]
        supervisor.start_tier(workers, READY_TIMEOUT_S)
        _summary(supervisor, settings, args.workers, logs)
        supervisor.run_until_stopped()
        _say("mqgw serve --workers: stopping (workers, then the broker, then Redis)")
    except StartFailed as error:
        print(f"mqgw serve --workers: {error}", file=sys.stderr)
        code = 1
    except InterruptedError:
        _say("mqgw serve --workers: interrupted while starting; stopping what started")
    finally:
        supervisor.stop_all(STOP_TIMEOUT_S, lambda child, how: _say(f"  {child.name}: {how}"))
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code == 0:
        _say("mqgw serve --workers: stopped cleanly")
    return code


def _summary(supervisor: Supervisor, settings: GatewaySettings, workers: int, logs: Path) -> None:
    pids = {child.name: child.pid for child in supervisor.children()}
    names = ", ".join(f"w{n} pid {pids[f'w{n}']}" for n in range(1, workers + 1))
    admin = f", admin on port {settings.admin_port}" if settings.admin_port else ""
    _say(
        f"mqgw serve: {workers} workers ready on AMQP port {settings.amqp_port}{admin} "
        f"({names}); broker pid {pids['broker']}, redis pid {pids['redis']}; "
        f"data in {settings.data_dir}, logs in {logs}"
    )
