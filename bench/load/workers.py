"""What ties a worker process to the runner: ready/go, stop, progress counter, result queue.

Workers are spawned (not forked: the runner holds sockets and a rich console), report
``ready`` once connected and set up, wait for ``go``, publish their progress into a shared
counter a few times a second, and put exactly one result (or error text) on the queue.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from bench.processes import die_with_parent

P = TypeVar("P")
CONTEXT = multiprocessing.get_context("spawn")


@dataclass
class WorkerLink:
    slot: int
    progress: Any  # a RawArray('q'): one counter per worker, written without a lock
    go: Any  # multiprocessing Event
    stop: Any  # multiprocessing Event
    results: Any  # multiprocessing Queue of (slot, kind, payload)
    snapshot: Any = None  # Event: consumers copy their per-queue counts when it is set

    def ready(self) -> None:
        self.results.put((self.slot, "ready", None))
        self.go.wait()

    def report(self, count: int) -> None:
        self.progress[self.slot] = count

    def stopped(self) -> bool:
        return bool(self.stop.is_set())


def worker_main(fn: Callable[[P, WorkerLink], dict[str, Any]], plan: P, link: WorkerLink) -> None:
    die_with_parent()  # a killed bench must not leave load running
    try:
        result = fn(plan, link)
    except BaseException as error:
        detail = "".join(traceback.format_exception(error))
        link.results.put((link.slot, "error", detail))
        return
    link.results.put((link.slot, "result", result))


def new_progress(slots: int) -> Any:
    return CONTEXT.RawArray("q", slots)
