"""The cluster commands, as functions: up, start, stop, down (status is ``health.check``).

Each one that changes the cluster holds an exclusive lock on D/.cluster.lock, so two
commands on the same directory (a test's teardown and a stray `up`, say) cannot interleave,
and writes cluster.json after every step: if a command dies half-way, the file still names
every process it started, and `down` can stop them.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench.cluster import launch
from bench.cluster.layout import (
    STATE_FILE,
    BrokerMember,
    Cluster,
    ClusterError,
    Member,
    load,
    plan,
)

OnReady = Callable[[Member, float], None]  # a process is up, after so many seconds


class AlreadyRunning(ClusterError):
    pass


@contextmanager
def locked(directory: Path, create: bool = False) -> Iterator[None]:
    """Hold D/.cluster.lock. Only `up` creates D: the others say there is no cluster."""
    if create:
        directory.mkdir(parents=True, exist_ok=True)
    elif not (directory / STATE_FILE).exists():
        load(directory)  # raises ClusterError("no cluster in D ...")
    with (directory / ".cluster.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def up(directory: Path, gateways: int, groups: int, timeout_s: float, on_ready: OnReady) -> Cluster:
    """Start Redis, then the brokers, then the gateways, each tier once the one before is
    ready. If anything fails to start, what did start is stopped again (nothing is left
    half up) and ClusterError says why."""
    directory = directory.resolve()
    with locked(directory, create=True):
        previous: Cluster | None = None
        if (directory / STATE_FILE).exists():
            previous = load(directory)
            running = [m.name for m in previous.members() if launch.is_alive(m)]
            if running:
                raise AlreadyRunning(
                    f"a cluster is already running in {directory} ({', '.join(running)}); "
                    f"`mqgw cluster down --dir {directory}` first"
                )
        launch.redis_server()  # fail before starting anything if it is missing
        cluster = plan(directory, gateways, groups, previous)
        cluster.save()
        try:
            for tier in ([cluster.redis], cluster.brokers, cluster.gateways):
                _start_tier(cluster, tier, timeout_s, on_ready)
        except BaseException:  # Ctrl-C too: do not leave half a cluster behind
            for tier in (cluster.gateways, cluster.brokers, [cluster.redis]):
                launch.stop(tier, kill=False, timeout_s=10)
            cluster.save()
            raise
        return cluster


def _start_tier(
    cluster: Cluster, members: Sequence[Member], timeout_s: float, on_ready: OnReady
) -> None:
    """Launch ``members`` together (they do not need each other) and wait for them all."""
    starting = []
    try:
        for member in members:
            starting.append(launch.spawn(member, cluster))
    finally:
        cluster.save()  # the pids, before waiting: a later `down` must find them
    launch.wait_ready(starting, timeout_s, on_ready)
    cluster.save()


def start(directory: Path, name: str, timeout_s: float, on_ready: OnReady) -> Member | None:
    """Start the stopped process ``name`` again, same data, same ports, and wait until it is
    ready. None if it was running already (nothing to do)."""
    directory = directory.resolve()
    with locked(directory):
        cluster = load(directory)
        member = cluster.find(name)
        if launch.is_alive(member):
            return None
        if isinstance(member, BrokerMember) and not launch.is_alive(cluster.redis):
            raise ClusterError(
                f"{name} registers in Redis, which is not running: "
                f"`mqgw cluster start --dir {directory} redis` first"
            )
        member.pid, member.alive = None, False
        try:
            _start_tier(cluster, [member], timeout_s, on_ready)
        except BaseException:
            launch.stop([member], kill=True, timeout_s=5)
            cluster.save()
            raise
        return member


def stop(directory: Path, name: str, kill: bool, timeout_s: float) -> launch.Stopped:
    directory = directory.resolve()
    with locked(directory):
        cluster = load(directory)
        (result,) = launch.stop([cluster.find(name)], kill, timeout_s)
        cluster.save()
        return result


def down(directory: Path, timeout_s: float) -> list[launch.Stopped]:
    """Stop everything: gateways first (clients see a clean close while storage is still
    there), then brokers (they flush and checkpoint), then Redis (which flushes its AOF)."""
    directory = directory.resolve()
    with locked(directory):
        cluster = load(directory)
        results = []
        for tier in (cluster.gateways, cluster.brokers, [cluster.redis]):
            results += launch.stop(tier, kill=False, timeout_s=timeout_s)
            cluster.save()
        return results
