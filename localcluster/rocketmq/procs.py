"""Start the JVMs of a local RocketMQ, tell whether they run, stop them.

As for `mqgw cluster` (localcluster/launch.py), each process gets its own session and is
found again by the pid in rocketmq.json, believed only if /proc/<pid>/cmdline is still that
JVM with that configuration file: a pid may be reused after a reboot. Tests start the same
processes with a parent-death signal instead, so they go when the test process goes.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from localcluster import probes
from localcluster.launch import cmdline
from localcluster.ports import HOST, port_free
from localcluster.rocketmq import conf
from localcluster.rocketmq.layout import Layout, Process, RocketMQError

_POLL_S = 0.1
_KILL_WAIT_S = 5.0

# Children of this very process: reaped here, so a stopped one is not a lingering zombie.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def is_alive(process: Process) -> bool:
    """``process.pid`` runs and is that JVM (a zombie's cmdline is empty)."""
    if process.pid is None:
        return False
    child = _CHILDREN.get(process.pid)
    if child is not None and child.poll() is not None:
        return False
    main = conf.NAMESRV_MAIN if process.role == "namesrv" else conf.BROKER_MAIN
    args = cmdline(process.pid)
    return main in args and process.conf in args


def accepts(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class Starting:
    process: Process
    proc: subprocess.Popen[bytes]
    log_offset: int  # the console log's size before this start: boot lines come after
    began: float

    def booted(self, line: str) -> bool:
        return line in probes.log_since(Path(self.process.log), self.log_offset)


def spawn(layout: Layout, process: Process, preexec: Callable[[], None] | None) -> Starting:
    """Launch ``process`` in its own session, its output appended to its console log."""
    busy = [port for port in process.ports.values() if not port_free(port)]
    if busy:
        raise RocketMQError(
            f"{process.name}: port {', '.join(map(str, busy))} on {HOST} is in use by another "
            f"process; stop it, or `mqgw rocketmq down --dir {layout.dir} --purge` for new ports"
        )
    log_path = Path(process.log)
    with log_path.open("ab") as log_file:
        now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        log_file.write(f"--- mqgw rocketmq: starting {process.name} at {now} ---\n".encode())
        log_file.flush()
        offset = log_file.tell()
        proc = subprocess.Popen(
            conf.command(layout, process),
            cwd=process.dir,
            env=conf.environment(layout),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # our terminal's Ctrl-C is not for it
            preexec_fn=preexec,  # noqa: PLW1509 (tests: only prctl, which is safe)
        )
    _CHILDREN[proc.pid] = proc
    process.pid = proc.pid
    return Starting(process, proc, offset, time.monotonic())


def failure(process: Process, why: str) -> RocketMQError:
    """An error saying ``why``, with the end of the process's console log."""
    tail = probes.log_tail(Path(process.log))
    return RocketMQError(
        f"{process.name} {why}; the end of {process.log}:\n{tail}\n"
        f"(RocketMQ's own logs: {process.home}/logs/rocketmqlogs)"
    )


def wait_until(starting: Starting, ready: Callable[[], bool], deadline: float, what: str) -> float:
    """Poll ``ready`` until true (seconds since the start), or raise if the process exits or
    the deadline passes."""
    while True:
        code = starting.proc.poll()
        if code is not None:
            raise failure(starting.process, f"exited with code {code} while starting")
        if ready():
            return time.monotonic() - starting.began
        if time.monotonic() > deadline:
            raise failure(starting.process, f"was not {what} in time")
        time.sleep(_POLL_S)


def _signal(process: Process, sig: int) -> None:
    assert process.pid is not None
    try:
        if os.getpgid(process.pid) == process.pid:  # its own group (we made it so)
            os.killpg(process.pid, sig)
        else:
            os.kill(process.pid, sig)
    except ProcessLookupError:
        pass


def kill(process: Process) -> None:
    """SIGKILL, as a crash: no shutdown hook runs."""
    if is_alive(process):
        _signal(process, signal.SIGKILL)
        _wait_gone([process], _KILL_WAIT_S)


def stop(processes: Iterable[Process], timeout_s: float) -> dict[str, str]:
    """SIGTERM every running one at once, SIGKILL whoever outlives ``timeout_s``; by name,
    what happened. The gone get pid None."""
    processes = list(processes)
    outcome = {p.name: "was not running" for p in processes if not is_alive(p)}
    running = [p for p in processes if p.name not in outcome]
    for process in running:
        _signal(process, signal.SIGTERM)
    gone = _wait_gone(running, timeout_s)
    for name, seconds in gone.items():
        outcome[name] = f"stopped (SIGTERM) in {seconds:.1f} s"
    left = [p for p in running if p.name not in gone]
    for process in left:
        _signal(process, signal.SIGKILL)
    killed = _wait_gone(left, _KILL_WAIT_S)
    for process in left:
        outcome[process.name] = (
            f"killed (SIGKILL) after {timeout_s:g} s" if process.name in killed else "ALIVE"
        )
    for process in processes:
        if outcome[process.name] != "ALIVE":
            process.pid = None
    return outcome


def _wait_gone(processes: list[Process], timeout_s: float) -> dict[str, float]:
    """Those of ``processes`` gone within ``timeout_s``: by name, after how many seconds."""
    began = time.monotonic()
    gone: dict[str, float] = {}
    while True:
        for process in processes:
            if process.name not in gone and not is_alive(process):
                gone[process.name] = time.monotonic() - began
        if len(gone) == len(processes) or time.monotonic() - began > timeout_s:
            return gone
        time.sleep(_POLL_S)
