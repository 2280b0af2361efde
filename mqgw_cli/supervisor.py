"""Child processes that live and die with their parent (`mqgw serve --workers N`).

Each child runs in its own session (the terminal's Ctrl-C goes to the parent alone, which
stops the children in order) with a parent-death signal (Linux ``PR_SET_PDEATHSIG``): if the
parent is killed outright, the kernel sends SIGTERM to every child, so nothing is left behind.
A child that dies while the parent runs is restarted after a backoff (1 s, doubling up to
30 s; back to 1 s once it has run 30 s). Unlike localcluster/launch.py, whose processes
outlive the command that starts them, these are the parent's own.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from localcluster import probes

log = logging.getLogger("mqgw.server.workers")

POLL_S = 0.05
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_S = 30.0  # a child that ran this long since it was ready starts its backoff over
_PR_SET_PDEATHSIG = 1


class StartFailed(Exception):
    """A child exited or was not ready in time while starting; the message says which."""


@dataclass
class Child:
    """One supervised process. ``ready`` says it serves (a probe: port, log line ...)."""

    name: str
    argv: list[str]
    log: Path
    ready: Callable[[Child], bool]
    describe: str = ""  # where it serves, for the ready line
    proc: subprocess.Popen[bytes] | None = None
    log_offset: int = 0  # its log's size at its start: readiness lines come after
    started_at: float = 0.0
    ready_at: float | None = None
    deaths: int = 0  # deaths since it last ran STABLE_S: the backoff's exponent
    restart_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _die_with_parent() -> Callable[[], None]:
    """A preexec_fn: SIGTERM to the child when the parent dies (Linux); nothing elsewhere."""
    parent = os.getpid()
    if not sys.platform.startswith("linux"):
        return lambda: None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above: go now
            os._exit(1)

    return in_child


def spawn(child: Child, env: Mapping[str, str], cwd: Path) -> None:
    """Start ``child``, appending its stdout and stderr to its log."""
    child.log.parent.mkdir(parents=True, exist_ok=True)
    with child.log.open("ab") as log_file:
        now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        log_file.write(f"--- mqgw serve --workers: starting {child.name} at {now} ---\n".encode())
        log_file.flush()
        child.log_offset = log_file.tell()
        child.proc = subprocess.Popen(
            child.argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509 - the parent is single-threaded
        )
    child.started_at, child.ready_at, child.restart_at = time.monotonic(), None, None


def how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor:
    """Starts children tier by tier, restarts the ones that die, stops them in reverse."""

    def __init__(
        self, env: Mapping[str, str], cwd: Path, on_ready: Callable[[Child, float, bool], None]
    ) -> None:
        self.env, self.cwd, self.on_ready = env, cwd, on_ready
        self.tiers: list[list[Child]] = []
        self.stopping = False

    def start_tier(self, children: list[Child], timeout_s: float) -> None:
        """Start ``children`` together and wait until each is ready. StartFailed (with the
        end of its log) when one exits or is late; InterruptedError when asked to stop."""
        self.tiers.append(children)
        for child in children:
            spawn(child, self.env, self.cwd)
        pending = list(children)
        deadline = time.monotonic() + timeout_s
        while pending:
            if self.stopping:
                raise InterruptedError("stopping")
            for child in list(pending):
                assert child.proc is not None
                code = child.proc.poll()
                if code is not None:
                    raise StartFailed(
                        f"{child.name} {how_it_ended(code)} while starting; the end of "
                        f"{child.log}:\n{probes.log_tail(child.log)}"
                    )
                if child.ready(child):
                    pending.remove(child)
                    self._mark_ready(child, again=False)
            if pending and time.monotonic() > deadline:
                late = pending[0]
                raise StartFailed(
                    f"{late.name} was not ready within {timeout_s:g} s; the end of "
                    f"{late.log}:\n{probes.log_tail(late.log)}"
                )
            time.sleep(POLL_S)

    def _mark_ready(self, child: Child, again: bool) -> None:
        child.ready_at = time.monotonic()
        self.on_ready(child, child.ready_at - child.started_at, again)

    def children(self) -> Iterable[Child]:
        for tier in self.tiers:
            yield from tier

    def tick(self) -> None:
        """One look at every child: note the dead, restart the due, report the ready."""
        now = time.monotonic()
        for child in self.children():
            if child.restart_at is not None:
                if now >= child.restart_at:
                    spawn(child, self.env, self.cwd)
                    log.warning("%s restarted: pid %s", child.name, child.pid)
                continue
            assert child.proc is not None
            code = child.proc.poll()
            if code is not None:
                self._died(child, code, now)
            elif child.ready_at is None and child.ready(child):
                self._mark_ready(child, again=True)

    def _died(self, child: Child, code: int, now: float) -> None:
        if child.ready_at is not None and now - child.ready_at >= STABLE_S:
            child.deaths = 0
        delay = min(FIRST_BACKOFF_S * 2**child.deaths, MAX_BACKOFF_S)
        child.deaths += 1
        child.restart_at = now + delay
        log.error(
            "%s (pid %s) %s unexpectedly; restarting it in %.0f s (death %d in a row)",
            child.name,
            child.pid,
            how_it_ended(code),
            delay,
            child.deaths,
        )

    def run_until_stopped(self) -> None:
        while not self.stopping:
            self.tick()
            time.sleep(POLL_S * 2)

    def stop_all(
        self, timeout_s: float, on_stopped: Callable[[Child, str], None] | None = None
    ) -> None:
        """The last tier first (gateways, then the broker, then Redis): SIGTERM to each
        child of a tier, SIGKILL to whoever outlives ``timeout_s``."""
        for tier in reversed(self.tiers):
            running = [child for child in tier if child.running()]
            for child in tier:
                child.restart_at = None
            for child in running:
                _signal(child, signal.SIGTERM)
            began = time.monotonic()
            deadline = began + timeout_s
            for child in running:
                assert child.proc is not None
                try:
                    child.proc.wait(max(deadline - time.monotonic(), 0.01))
                    outcome = f"stopped (SIGTERM) in {time.monotonic() - began:.1f} s"
                except subprocess.TimeoutExpired:
                    _signal(child, signal.SIGKILL)
                    child.proc.wait()
                    outcome = f"killed (SIGKILL) after {timeout_s:g} s"
                if on_stopped is not None:
                    on_stopped(child, outcome)


def _signal(child: Child, sig: int) -> None:
    assert child.proc is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.proc.pid, sig)  # its own session and group: its helpers go too
