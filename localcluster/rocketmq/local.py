"""`mqgw rocketmq up|status|down --dir D`, usable from Python too (tests/harness/rocketmq.py).

``up`` starts a name server and a broker group on free loopback ports: one broker, or with
``replicas`` ≥ 2 the controller (embedded in the name server) and that many brokers of one
name in controller mode, which elect a master among themselves. It returns once every JVM
has booted and accepts on its port, the group has a master registered with the name server
and (replicated) every broker is in the sync state set; D/rocketmq.json describes it all.
docs/rocketmq.md has the details.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localcluster.rocketmq import dist, procs, remoting
from localcluster.rocketmq.conf import write_confs
from localcluster.rocketmq.layout import (
    STATE_FILE,
    Layout,
    Process,
    RocketMQError,
    load,
    plan,
)

Progress = Callable[[str], None]
_STOP_ON_FAILURE_S = 10.0
_NUDGE = b"brokerPermission=6\n"  # read and write: the default, as broker.conf leaves it


def _quiet(_: str) -> None:
    pass


def up(
    directory: Path,
    replicas: int = 1,
    timeout_s: float = 60.0,
    progress: Progress = _quiet,
    preexec: Callable[[], None] | None = None,
) -> Layout:
    """Start it all and wait until it serves; on failure stop what was started and raise
    RocketMQError. ``preexec`` runs in each child before exec (tests: a parent-death signal)."""
    if replicas < 1:
        raise RocketMQError("--replicas must be ≥ 1")
    directory = directory.resolve()
    if dist.cached() is None:
        progress(f"rocketmq: fetching RocketMQ {dist.version()} into {dist.lib_dir()} (once)")
    try:
        lib = dist.ensure()
    except dist.DistError as error:
        raise RocketMQError(str(error)) from None
    layout = _layout(directory, replicas, lib)
    write_confs(layout)
    deadline = time.monotonic() + timeout_s
    try:
        _start_namesrv(layout, deadline, progress, preexec)
        _start_brokers(layout, deadline, progress, preexec)
    except BaseException:  # Ctrl-C too: nothing half-started is left behind
        procs.stop(layout.processes, _STOP_ON_FAILURE_S)
        layout.save()
        raise
    return layout


def _layout(directory: Path, replicas: int, lib: Path) -> Layout:
    """A new layout, or the one already in ``directory`` when it is stopped and alike."""
    existing = load(directory)
    if existing is None:
        directory.mkdir(parents=True, exist_ok=True)
        layout = plan(directory, dist.version(), replicas, lib)
        layout.save()
        return layout
    running = [p.name for p in existing.processes if procs.is_alive(p)]
    if running:
        raise RocketMQError(
            f"a RocketMQ already runs in {directory} ({', '.join(running)}): "
            "`mqgw rocketmq status` shows it, `mqgw rocketmq down` stops it"
        )
    if existing.replicas != replicas or existing.version != dist.version():
        raise RocketMQError(
            f"{directory / STATE_FILE} is RocketMQ {existing.version} with "
            f"{existing.replicas} replica(s): `mqgw rocketmq down --dir {directory} --purge` "
            "first, or another directory"
        )
    existing.lib = str(lib)
    return existing


def _start_namesrv(
    layout: Layout, deadline: float, progress: Progress, preexec: Callable[[], None] | None
) -> None:
    ns = layout.namesrv
    starting = procs.spawn(layout, ns, preexec)
    layout.save()
    port = ns.ports["listen"]

    def ready() -> bool:
        return starting.booted("The Name Server boot success") and procs.accepts(port)

    seconds = procs.wait_until(starting, ready, deadline, "serving")
    progress(f"rocketmq: name server up on {ns.address} ({seconds:.1f} s)")
    controller = ns.ports.get("controller")
    if controller is not None:

        def controller_ready() -> bool:
            booted = starting.booted("The ControllerManager boot success")
            return booted and procs.accepts(controller)

        seconds = procs.wait_until(starting, controller_ready, deadline, "serving its controller")
        where = f"{layout.controller} (in the name server, {seconds:.1f} s)"
        progress(f"rocketmq: controller up on {where}")


def _start_brokers(
    layout: Layout, deadline: float, progress: Progress, preexec: Callable[[], None] | None
) -> None:
    # One after the other: a slave that registers while its master is still registering
    # may learn the master's HA address only from its next name server round, 10 s later.
    # Booting alone, a JVM also has both cores.
    began = time.monotonic()
    for broker in layout.brokers:
        starting = procs.spawn(layout, broker, preexec)
        layout.save()
        line = f"The broker[{layout.broker_name}, {broker.address}] boot success"

        def ready(starting: procs.Starting = starting, line: str = line) -> bool:
            return starting.booted(line) and procs.accepts(starting.process.ports["listen"])

        procs.wait_until(starting, ready, deadline, "serving")
        seconds = _wait_registered(layout, starting, deadline)
        progress(f"rocketmq: {broker.name} up on {broker.address} ({seconds:.1f} s)")

    def registered() -> bool:
        entries = _group(layout)
        return len(entries) == layout.replicas and any(e.broker_id == 0 for e in entries)

    _wait(layout, registered, deadline, "registered with a master")
    roles = ", ".join(f"{name} {role}" for name, role in broker_roles(layout).items())
    progress(f"rocketmq: {layout.broker_name} registered: {roles}")
    if layout.controller is not None:
        # Only a replica in the sync state set may be elected: until the slave has caught up
        # and joined it, losing the master would leave the group without one.
        _wait(layout, lambda: _all_in_sync(layout), deadline, "in sync")
        took = time.monotonic() - began
        progress(f"rocketmq: {layout.broker_name}: all {layout.replicas} in sync ({took:.1f} s)")


def _wait_registered(layout: Layout, starting: procs.Starting, deadline: float) -> float:
    """Wait until the name server lists the booted broker; seconds since it was started.

    A broker registers at boot only if its name server connection, opened asynchronously
    just before, is up by then; if not (a start in three or so on a busy machine), it
    registers 10 s later. Setting its brokerPermission (to its value) makes it register at once, so
    that is sent each second until it has.
    """
    broker = starting.process
    next_nudge = 0.0

    def registered() -> bool:
        nonlocal next_nudge
        if any(e.address == broker.address for e in _group(layout)):
            return True
        if time.monotonic() >= next_nudge:
            next_nudge = time.monotonic() + 1.0
            with contextlib.suppress(remoting.RemotingError, ValueError):  # next round tells
                remoting.request(broker.address, remoting.UPDATE_BROKER_CONFIG, _NUDGE, 1.0)
        return False

    return procs.wait_until(starting, registered, deadline, "registered with the name server")


def _wait(layout: Layout, condition: Callable[[], bool], deadline: float, what: str) -> None:
    """Poll ``condition`` until the deadline; a broker exiting meanwhile fails it at once."""
    while not condition():
        for broker in layout.brokers:
            if not procs.is_alive(broker):
                raise procs.failure(broker, f"exited before the group was {what}")
        if time.monotonic() > deadline:
            raise procs.failure(layout.brokers[0], f"{layout.broker_name} was not {what} in time")
        time.sleep(0.1)


def _all_in_sync(layout: Layout) -> bool:
    assert layout.controller is not None
    try:
        state = remoting.sync_state(layout.controller, layout.broker_name, timeout_s=1.0)
    except (remoting.RemotingError, ValueError):
        return False
    return state is not None and state.in_sync == {b.address for b in layout.brokers}


def _group(layout: Layout) -> list[remoting.BrokerEntry]:
    try:
        entries = remoting.cluster_info(layout.namesrv.address, timeout_s=1.0)
    except (remoting.RemotingError, ValueError):
        return []
    return [e for e in entries if e.broker_name == layout.broker_name]


def broker_roles(layout: Layout) -> dict[str, str]:
    """Each broker's role as the name server has it now: master, slave, or unregistered."""
    by_address = {e.address: e.role for e in _group(layout)}
    return {b.name: by_address.get(b.address, "unregistered") for b in layout.brokers}


@dataclass
class Status:
    process: Process
    alive: bool
    state: str  # for people: "master", "slave", "unregistered", "serving", "down"


def status(directory: Path) -> tuple[Layout, list[Status]]:
    layout = load(directory.resolve())
    if layout is None:
        raise RocketMQError(f"no RocketMQ in {directory} ({STATE_FILE} is missing)")
    alive = {p.name: procs.is_alive(p) for p in layout.processes}
    roles = broker_roles(layout) if alive[layout.namesrv.name] else {}
    result = []
    for process in layout.processes:
        if not alive[process.name]:
            state = "down"
        elif process.role == "broker":
            state = roles.get(process.name, "unregistered")
        else:  # the name server, and the controller in it
            serving = all(procs.accepts(port) for port in process.ports.values())
            state = "serving" if serving else "not accepting"
        result.append(Status(process, alive[process.name], state))
    return layout, result


def down(directory: Path, timeout_s: float = 30.0, purge: bool = False) -> dict[str, str]:
    """Stop every process (SIGTERM, then SIGKILL after ``timeout_s``); with
    ``purge`` remove every file `up` made, data included. By name, what happened."""
    layout = load(directory.resolve())
    if layout is None:
        return {}
    # All at once: a broker unregisters first thing, then takes ~10 s to stop its services.
    outcome = procs.stop(layout.processes, timeout_s)
    layout.save()
    if purge and all(p.pid is None for p in layout.processes):
        for process in layout.processes:
            shutil.rmtree(process.dir, ignore_errors=True)
        for extra in (layout.rocketmq_home, layout.dir / "mqadmin-home"):
            shutil.rmtree(extra, ignore_errors=True)
        (layout.dir / STATE_FILE).unlink(missing_ok=True)
    return outcome


def kill(layout: Layout, name: str) -> None:
    """SIGKILL one process (a crash), for failover tests; rocketmq.json then has no pid."""
    process = next(p for p in layout.processes if p.name == name)
    procs.kill(process)
    process.pid = None
    layout.save()
