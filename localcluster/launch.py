"""Start cluster processes detached from us, tell whether they still run, stop them.

A process is started in its own session (``start_new_session``) with no parent-death
signal: it must outlive `mqgw cluster up`. Later commands are not its parent, so they find
it by the pid in cluster.json, and check /proc/<pid>/cmdline before believing or signalling
that pid: after a reboot or a long while the number may belong to something else.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from localcluster import probes
from localcluster.layout import (
    BrokerMember,
    Cluster,
    ClusterError,
    ControllerMember,
    GatewayMember,
    Member,
    RedisMember,
    WatcherMember,
)
from localcluster.ports import port_free

PROJECT_ROOT = Path(__file__).resolve().parents[2]
_POLL_S = 0.05
_KILL_WAIT_S = 5.0  # after SIGKILL a process is gone at once, unless the kernel is stuck

# Processes this very command started: reaped here, so they do not linger as zombies while
# we wait for them to go (a later command is not their parent and cannot reap them).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def redis_server() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise ClusterError(
            "redis-server is not on the PATH: install Redis (apt-get install redis-server) "
            "or put its directory on the PATH"
        )
    return found


def command(member: Member, cluster: Cluster) -> list[str]:
    """The command line of ``member``: the same on every start, so its data and ports stay."""
    mqgw = [sys.executable, "-m", "mqgw_cli.main"]
    if isinstance(member, RedisMember):
        return [
            redis_server(),
            "--port", str(member.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--save", "",  # no RDB snapshots: the AOF alone is the data
            "--appendonly", "yes",
            "--dir", member.data_dir,
            "--logfile", "",  # to stdout, which goes to its log file
            "--daemonize", "no",
        ]  # fmt: skip
    if isinstance(member, BrokerMember):
        replication = ["--replication", member.replication] if member.replicated else []
        return [
            *mqgw, "broker",
            "--data-dir", member.data_dir, "--port", str(member.port),
            "--group", member.group, "--id", member.broker_id,
            "--meta", cluster.meta_url, *replication,
        ]  # fmt: skip
    if isinstance(member, ControllerMember):
        return [*mqgw, "controller", "--meta", member.url, "--name", member.name]
    if isinstance(member, WatcherMember):
        return [sys.executable, "-m", "localcluster.watch", member.data_dir]
    if isinstance(member, GatewayMember):
        # Over RocketMQ the messages are there (--store); else on the brokers Redis lists.
        if cluster.backend == "rocketmq" and not cluster.store_url:
            raise ClusterError(
                f"{member.name} keeps messages in RocketMQ, which this cluster has not started "
                f"(no store_url in {cluster.state_path}): `mqgw cluster up --dir {cluster.dir}`"
            )
        store = ["--store", cluster.store_url] if cluster.store_url else []
        return [
            *mqgw, "serve",
            *store, "--meta", cluster.meta_url,
            "--data-dir", member.data_dir, "--node-name", member.name,
            "--amqp-host", "127.0.0.1", "--amqp-port", str(member.amqp_port),
            "--admin-host", "127.0.0.1", "--admin-port", str(member.admin_port),
        ]  # fmt: skip
    raise TypeError(f"unknown member kind {type(member).__name__}")


def cmdline(pid: int) -> list[str]:
    """The command line of ``pid`` ([] when it is gone or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_alive(member: Member) -> bool:
    """``member.pid`` runs and is that member's process (a zombie has an empty cmdline)."""
    if member.pid is None:
        return False
    child = _CHILDREN.get(member.pid)
    if child is not None and child.poll() is not None:
        return False
    try:
        os.kill(member.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: the pid was reused
    args = cmdline(member.pid)
    if isinstance(member, RedisMember):
        # redis-server rewrites its title to "redis-server 127.0.0.1:PORT" once started.
        joined = " ".join(args)
        return "redis-server" in joined and (
            f":{member.port}" in joined or str(member.port) in args
        )
    if isinstance(member, ControllerMember):  # no data dir: its name on its Redis
        named = any(a == "--name" and b == member.name for a, b in pairwise(args))
        return "controller" in args and named and member.url in args
    if isinstance(member, WatcherMember):
        return "localcluster.watch" in args and member.data_dir in args
    return any("mqgw" in arg for arg in args) and member.data_dir in args


@dataclass
class Starting:
    """A process just launched, until it is ready."""

    member: Member
    proc: subprocess.Popen[bytes]
    log_offset: int  # its log's size before it started: readiness lines come after
    began: float

    def exited(self) -> int | None:
        return self.proc.poll()

    def ready(self) -> bool:
        member = self.member
        if isinstance(member, RedisMember):
            return probes.redis_ping(member.port)
        if isinstance(member, BrokerMember):
            text = probes.log_since(Path(member.log), self.log_offset)
            name = f"broker {member.group}/{member.broker_id}"
            # Listening, and registered in Redis: only then can gateways find it.
            return f"{name} ready on {member.address} " in text and f"{name} registered in" in text
        if isinstance(member, GatewayMember):
            # Not the cluster behaviour (--meta is new): that it serves AMQP and its admin API.
            return probes.amqp_answers(member.amqp_port) and (
                probes.gateway_health(member.admin_url) is not None
            )
        if isinstance(member, ControllerMember):
            # Running its loop; which one leads is Redis's to say, read after the brokers.
            text = probes.log_since(Path(member.log), self.log_offset)
            return f"controller {member.name} started" in text
        if isinstance(member, WatcherMember):
            return "watching" in probes.log_since(Path(member.log), self.log_offset)
        raise TypeError(f"unknown member kind {type(member).__name__}")


def spawn(member: Member, cluster: Cluster) -> Starting:
    """Launch ``member`` detached, appending to its log; ``member.pid`` is set."""
    busy = [port for port in member.ports if not port_free(port)]
    if busy:
        raise ClusterError(
            f"{member.name}: port {', '.join(map(str, busy))} on 127.0.0.1 is in use by "
            "another process; stop it, or `mqgw cluster down` and remove cluster.json to pick "
            "new ports"
        )
    cmd = command(member, cluster)
    if member.data_dir:  # a controller has none
        Path(member.data_dir).mkdir(parents=True, exist_ok=True)
    log_path = Path(member.log)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # The children run this very checkout's code, wherever `mqgw` was started from.
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as log_file:
        now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        log_file.write(f"--- mqgw cluster: starting {member.name} at {now} ---\n".encode())
        log_file.flush()
        offset = log_file.tell()
        proc = subprocess.Popen(
            cmd,
            cwd=cluster.dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: our terminal's Ctrl-C is not for it
        )
    _CHILDREN[proc.pid] = proc
    member.pid, member.alive = proc.pid, True
    return Starting(member, proc, offset, time.monotonic())


def wait_ready(
    starting: Sequence[Starting],
    timeout_s: float,
    on_ready: Callable[[Member, float], None],
) -> None:
    """Poll every process until each is ready (reported as it comes up). ClusterError, with
    the end of its log, if one exits or is not ready within ``timeout_s``."""
    pending = list(starting)
    deadline = time.monotonic() + timeout_s
    while pending:
        for each in list(pending):
            code = each.exited()
            if code is not None:
                each.member.pid, each.member.alive = None, False
                raise ClusterError(
                    f"{each.member.name} exited with code {code} while starting; "
                    f"the end of {each.member.log}:\n{probes.log_tail(Path(each.member.log))}"
                )
            if each.ready():
                pending.remove(each)
                on_ready(each.member, time.monotonic() - each.began)
        if pending and time.monotonic() > deadline:
            late = pending[0].member
            raise ClusterError(
                f"{late.name} was not ready within {timeout_s:g} s; "
                f"the end of {late.log}:\n{probes.log_tail(Path(late.log))}"
            )
        if pending:
            time.sleep(_POLL_S)


def _signal(member: Member, sig: int) -> None:
    assert member.pid is not None
    try:
        # Its own session and process group (we made it so): helpers it forked go too.
        if os.getpgid(member.pid) == member.pid:
            os.killpg(member.pid, sig)
        else:
            os.kill(member.pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Stopped:
    member: Member
    outcome: str  # for people: "stopped (SIGTERM) in 0.3 s", "killed", "was not running"
    gone: bool
    was_running: bool = True  # False: there was nothing to stop


def stop(members: Iterable[Member], kill: bool, timeout_s: float) -> list[Stopped]:
    """Signal every running member at once (SIGTERM, or SIGKILL with ``kill``), wait for them
    all, SIGKILL whoever outlives ``timeout_s``. Members that went get pid None, alive False."""
    members = list(members)
    results: dict[str, Stopped] = {}
    running = []
    for member in members:
        if is_alive(member):
            running.append(member)
        else:
            results[member.name] = Stopped(member, "was not running", gone=True, was_running=False)
    first = signal.SIGKILL if kill else signal.SIGTERM
    for member in running:
        _signal(member, first)
    began = time.monotonic()
    left = _wait_gone(running, timeout_s)
    for member in running:
        if member not in left:
            how = "killed (SIGKILL)" if kill else "stopped (SIGTERM)"
            results[member.name] = Stopped(
                member, f"{how} in {time.monotonic() - began:.1f} s", gone=True
            )
    for member in left:
        _signal(member, signal.SIGKILL)
    still = _wait_gone(left, _KILL_WAIT_S)
    for member in left:
        gone = member not in still
        outcome = f"killed (SIGKILL) after {timeout_s:g} s" if gone else "still running!"
        results[member.name] = Stopped(member, outcome, gone)
    for result in results.values():
        if result.gone:
            result.member.pid, result.member.alive = None, False
    return [results[member.name] for member in members]


def _wait_gone(members: list[Member], timeout_s: float) -> list[Member]:
    """Those of ``members`` still running after up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    left = list(members)
    while left:
        left = [m for m in left if is_alive(m)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    return left
