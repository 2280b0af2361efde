"""The cluster commands, as functions: up, add_group, start, stop, down (status is
``health.check``).

Each one that changes the cluster holds an exclusive lock on D/.cluster.lock, so two
commands on the same directory (a test's teardown and a stray `up`, say) cannot interleave,
and writes cluster.json after every step: if a command dies half-way, the file still names
every process it started, and `down` can stop them. The watcher (localcluster/watch.py)
takes the same lock for each rewrite, without waiting for it: while a command holds it, the
command refreshes the roles itself (``roles.refresh``) before it writes.

Over RocketMQ (``Shape(backend="rocketmq")``) the storage is `mqgw rocketmq up`'s processes in
D/rocketmq (D/rocketmq/rocketmq.json describes them): `up` and `down` start and stop them as
one tier, between Redis and the gateways; they are not members of cluster.json.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from localcluster import launch, probes, roles
from localcluster.broker_names import broker_name, broker_names
from localcluster.health import Health
from localcluster.layout import (
    ROCKETMQ_DIR,
    STATE_FILE,
    BrokerMember,
    Cluster,
    ClusterError,
    Member,
    RocketMQMember,
    Shape,
    load,
    new_group,
    plan,
)
from localcluster.rocketmq import layout as rocketmq_layout
from localcluster.rocketmq import local as rocketmq_local
from localcluster.rocketmq import procs as rocketmq_procs
from localcluster.rocketmq.layout import RocketMQError

OnReady = Callable[[Member, float], None]  # a process is up, after so many seconds
OnNote = Callable[[str], None]  # progress that is not one process: a group got its master
_MASTER_POLL_S = 0.1


class AlreadyRunning(ClusterError):
    """`up` found processes of the cluster running: it started and stopped nothing."""


class UpFailed(ClusterError):
    """`up` could not bring the cluster up; ``stopped`` names the processes it had started
    and stopped again (empty: none was running any more, or none had started)."""

    def __init__(self, message: str, stopped: list[str]) -> None:
        super().__init__(message)
        self.stopped = stopped


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


@contextmanager
def try_locked(directory: Path) -> Iterator[bool]:
    """Hold D/.cluster.lock if it is free now (True), else do nothing (False): for writers
    that must not wait behind a command (the watcher, status)."""
    with (directory / ".cluster.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def up(
    directory: Path,
    shape: Shape,
    timeout_s: float,
    on_ready: OnReady,
    on_note: OnNote = lambda _text: None,
) -> Cluster:
    """Start Redis, the controllers, the brokers (over RocketMQ: RocketMQ's processes), then
    (once every replicated group has a master, so that they find it) the gateways, and the
    watcher; each tier once the one before is ready. If anything fails to start, what did
    start is stopped again (nothing is left half up) and ClusterError says why."""
    directory = directory.resolve()
    with locked(directory, create=True):
        previous = _previous(directory, shape)
        launch.redis_server()  # fail before starting anything if it is missing
        rocketmq = shape.backend == "rocketmq"
        cluster = plan(directory, shape, previous, _rocketmq_ports(directory) if rocketmq else ())
        cluster.save()
        try:
            _start_tier(cluster, [cluster.redis], timeout_s, on_ready)
            if rocketmq:
                _start_rocketmq(cluster, shape.replicas, timeout_s, on_note)
            storage: list[Sequence[Member]] = [cluster.controllers, cluster.brokers]
            for tier in storage:
                _start_tier(cluster, tier, timeout_s, on_ready)
            _wait_for_masters(cluster, timeout_s, on_note)
            for tier in (cluster.gateways, _watcher(cluster)):
                _start_tier(cluster, tier, timeout_s, on_ready)
        except BaseException as error:  # Ctrl-C too: do not leave half a cluster behind
            stopped = [
                result.member.name
                for tier in _stop_tiers(cluster, timeout_s=10)
                for result in tier
                if result.was_running
            ]
            cluster.save()
            if isinstance(error, ClusterError):
                raise UpFailed(str(error), stopped) from error
            raise
        return cluster


def _previous(directory: Path, shape: Shape) -> Cluster | None:
    """The stopped cluster ``directory`` had, if any, which `up` starts again. AlreadyRunning
    if a process of it runs; ClusterError if it was over another backend (its Redis holds
    queues whose messages are in that one)."""
    if not (directory / STATE_FILE).exists():
        return None
    previous = load(directory)
    running = [m.name for m in previous.members() if launch.is_alive(m)]
    running += [m.name for m in rocketmq_members(previous) if m.alive]
    if running:
        raise AlreadyRunning(
            f"a cluster is already running in {directory} ({', '.join(running)}); "
            f"nothing was started or stopped: `mqgw cluster down --dir {directory}` "
            "first to start it anew"
        )
    if previous.backend != shape.backend:
        raise ClusterError(
            f"{directory} holds a cluster over {previous.backend} (its metadata names queues "
            f"stored there): remove {directory}, or use another directory, for one over "
            f"{shape.backend}"
        )
    return previous


def _watcher(cluster: Cluster) -> list[Member]:
    return [cluster.watcher] if cluster.watcher is not None else []


def _stop_tiers(cluster: Cluster, timeout_s: float) -> Iterator[list[launch.Stopped]]:
    """Stop a tier at a time (its processes together): the watcher, gateways (clients see a
    clean close while storage is still there), brokers (they flush and checkpoint),
    controllers, RocketMQ's processes, Redis (which flushes its AOF)."""
    for tier in (_watcher(cluster), cluster.gateways, cluster.brokers, cluster.controllers):
        yield launch.stop(tier, kill=False, timeout_s=timeout_s)
    if cluster.backend == "rocketmq":
        yield _stop_rocketmq(cluster, timeout_s)
    yield launch.stop([cluster.redis], kill=False, timeout_s=timeout_s)


def _start_rocketmq(cluster: Cluster, replicas: int, timeout_s: float, on_note: OnNote) -> None:
    """RocketMQ's name server and ``replicas`` brokers, as `mqgw rocketmq up` starts them in
    D/rocketmq, each line of its progress a note; the gateways' --store is its name server."""
    try:
        # Its timeout is for all of its JVMs together: ``timeout_s`` for each.
        layout = rocketmq_local.up(
            cluster.rocketmq_dir, replicas, timeout_s * (1 + replicas), progress=on_note
        )
    except RocketMQError as error:
        raise ClusterError(str(error)) from None
    cluster.store_url = f"rocketmq://{layout.namesrv.address}"
    cluster.save()


def _stop_rocketmq(cluster: Cluster, timeout_s: float) -> list[launch.Stopped]:
    try:
        members = rocketmq_members(cluster)
        outcome = rocketmq_local.down(cluster.rocketmq_dir, timeout_s)
    except (ClusterError, RocketMQError) as error:  # say so, and stop Redis all the same
        return [launch.Stopped(_rocketmq_as_one(cluster), str(error), gone=False)]
    results = []
    for member in members:
        said = outcome.get(member.name.removeprefix(_ROCKETMQ_PREFIX), "was not running")
        gone = said != "ALIVE"  # what procs.stop says of one that outlived SIGKILL
        if gone:
            member.pid, member.alive = None, False
        results.append(launch.Stopped(member, said, gone, was_running=said != "was not running"))
    return results


_ROCKETMQ_PREFIX = f"{ROCKETMQ_DIR}-"  # "rocketmq-namesrv": not taken for an mqgw broker


def rocketmq_members(cluster: Cluster) -> list[RocketMQMember]:
    """The processes of the cluster's RocketMQ, as D/rocketmq/rocketmq.json has them (empty:
    the cluster is over mqgw's brokers, or its RocketMQ never started); pid only if it runs."""
    if cluster.backend != "rocketmq":
        return []
    try:
        layout = rocketmq_layout.load(cluster.rocketmq_dir)
    except RocketMQError as error:
        raise ClusterError(str(error)) from None
    if layout is None:
        return []
    members = []
    for process in layout.processes:
        alive = rocketmq_procs.is_alive(process)
        members.append(
            RocketMQMember(
                name=f"{_ROCKETMQ_PREFIX}{process.name}",
                role=process.role,
                pid=process.pid if alive else None,
                alive=alive,
                data_dir=process.dir,
                log=process.log,
                address=process.address,
                listen_ports=sorted(process.ports.values()),
            )
        )
    return members


def rocketmq_health(cluster: Cluster) -> list[Health]:
    """`status` of the RocketMQ processes: a name server is healthy when it accepts on its
    ports, a broker when the name server lists it (its role: master or slave)."""
    try:
        _layout, found = rocketmq_local.status(cluster.rocketmq_dir)
    except RocketMQError as error:  # its rocketmq.json is missing: it never started
        return [Health(_rocketmq_as_one(cluster), alive=False, healthy=False, detail=str(error))]
    checks = []
    for member, each in zip(rocketmq_members(cluster), found, strict=True):
        if not each.alive:
            checks.append(Health(member, alive=False, healthy=False, detail="not running"))
            continue
        if each.process.role == "broker":
            member.role = each.state if each.state in ("master", "slave") else "broker"
        healthy = each.state in ("master", "slave", "serving")
        detail = f"{each.state} (per the name server)" if member.role != "namesrv" else each.state
        checks.append(Health(member, alive=True, healthy=healthy, detail=detail))
    return checks


def _rocketmq_as_one(cluster: Cluster) -> RocketMQMember:
    """All of RocketMQ as one entry, for a table line when its processes cannot be read."""
    directory = str(cluster.rocketmq_dir)
    return RocketMQMember(name=ROCKETMQ_DIR, role="rocketmq", data_dir=directory, log="",
                          address=directory)  # fmt: skip


def _rocketmq_ports(directory: Path) -> list[int]:
    """The ports of D/rocketmq's processes, when it had them before: they get them back."""
    try:
        layout = rocketmq_layout.load(directory / ROCKETMQ_DIR)
    except RocketMQError:
        return []  # `up` of RocketMQ says so
    if layout is None:
        return []
    return [port for process in layout.processes for port in process.ports.values()]


def _wait_for_masters(
    cluster: Cluster, timeout_s: float, on_note: OnNote, groups: Sequence[str] | None = None
) -> None:
    """Until the controller has elected a master in every replicated group (or in each of
    ``groups``; it gives each broker a couple of seconds to report first): gateways started
    before would find none."""
    waiting = set(cluster.replicated_groups() if groups is None else groups)
    began = time.monotonic()
    while waiting:
        observed = roles.refresh(cluster)
        for group in sorted(waiting):
            record = observed.record(group) if observed is not None else None
            if record is not None and record.master:
                waiting.discard(group)
                on_note(
                    f"group {group}: {broker_name(group, record.master)} is master at epoch "
                    f"{record.epoch} (in sync: {broker_names(group, record.in_sync)}), after "
                    f"{time.monotonic() - began:.1f} s"
                )
        dead = [m for m in (*cluster.controllers, *cluster.brokers) if not launch.is_alive(m)]
        if dead:
            raise ClusterError(
                f"{dead[0].name} exited while its group waited for a master; the end of "
                f"{dead[0].log}:\n{probes.log_tail(Path(dead[0].log))}"
            )
        if waiting and time.monotonic() - began > timeout_s:
            log = cluster.controllers[0].log if cluster.controllers else cluster.redis.log
            raise ClusterError(
                f"no master elected in {', '.join(sorted(waiting))} within {timeout_s:g} s; "
                f"the end of {log}:\n{probes.log_tail(Path(log))}"
            )
        if waiting:
            time.sleep(_MASTER_POLL_S)
    cluster.save()


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
    roles.refresh(cluster)
    cluster.save()


def add_group(
    directory: Path,
    replicas: int,
    timeout_s: float,
    on_ready: OnReady,
    on_note: OnNote = lambda _text: None,
) -> list[BrokerMember]:
    """Start the brokers of a new group g<N+1> (``replicas`` of them, replicated when ≥ 2)
    and wait until they are ready (registered in Redis; a replicated group also has a master).
    The running gateways find it in Redis by themselves and place new queues on it. If it
    does not come up, its brokers are stopped and left out of cluster.json again."""
    directory = directory.resolve()
    with locked(directory):
        cluster = load(directory)
        if cluster.backend == "rocketmq":
            raise ClusterError(
                f"this cluster keeps messages in RocketMQ ({cluster.rocketmq_dir}), which has "
                "no mqgw broker groups to add"
            )
        if not launch.is_alive(cluster.redis):
            raise ClusterError(
                f"a new group registers in Redis, which is not running: "
                f"`mqgw cluster start --dir {directory} redis` first"
            )
        if replicas > 1 and not any(launch.is_alive(c) for c in cluster.controllers):
            raise ClusterError(
                f"--replicas {replicas} needs a running controller to elect the group's master, "
                "and this cluster has none (start it with `up --controllers C`)"
            )
        added = new_group(cluster, replicas)
        group = added[0].group
        cluster.brokers += added
        try:
            _start_tier(cluster, added, timeout_s, on_ready)
            if replicas > 1:
                _wait_for_masters(cluster, timeout_s, on_note, [group])
        except BaseException:  # Ctrl-C too: no half-added group left running
            launch.stop(added, kill=False, timeout_s=10)
            cluster.brokers = [b for b in cluster.brokers if b not in added]
            cluster.save()
            raise
        return added


def remove_group(directory: Path, group: str, timeout_s: float) -> list[launch.Stopped]:
    """Stop the brokers of ``group`` (retired by the gateways first: `mqgw cluster
    remove-group`) and leave them out of cluster.json."""
    directory = directory.resolve()
    with locked(directory):
        cluster = load(directory)
        members = [b for b in cluster.brokers if b.group == group]
        if not members:
            raise ClusterError(f"no broker group {group!r} in {cluster.state_path}")
        stopped = launch.stop(members, kill=False, timeout_s=timeout_s)
        cluster.brokers = [b for b in cluster.brokers if b.group != group]
        cluster.retired.append(group)
        cluster.save()
        return stopped


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
        roles.refresh(cluster)
        cluster.save()
        return result


def down(directory: Path, timeout_s: float) -> list[launch.Stopped]:
    """Stop everything, in ``_stop_tiers``' order: the watcher first (it would rewrite roles
    while the rest goes), Redis last."""
    directory = directory.resolve()
    with locked(directory):
        cluster = load(directory)
        results = []
        for stopped in _stop_tiers(cluster, timeout_s):
            results += stopped
            roles.refresh(cluster)  # while Redis runs: no leader once the controllers went
            cluster.save()
        return results
