"""Child processes of a benchmark (or a test): tied to their parent, waited for, measured.

``die_with_parent`` sets PR_SET_PDEATHSIG so a child started with it dies with the bench (or
test) process; ``check_for`` polls a condition until it holds or a timeout passes; the
``tree_*`` functions read /proc for the CPU time and resident memory of a process and its
descendants (beam.smp's helpers, a gateway's workers), which the benchmarks report.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def die_with_parent() -> None:
    """preexec_fn (or first call in a worker): SIGKILL us when our parent goes away."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def check_for(
    timeout_s: float,
    probe: Callable[[], T | None],
    interval_s: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns something truthy (nats-server's checkFor); ``what`` names
    the condition in the error."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as error:
            last_error = error
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not met within {timeout_s}s (last error: {last_error})")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (beam.smp's helpers, say)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def tree_rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` and its descendants, in MB."""
    total_kb = 0
    for member in process_tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return round(total_kb / 1024, 1)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live descendants."""
    ticks = 0
    for member in process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")
