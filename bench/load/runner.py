"""Run one scenario against one target: set up, spawn workers, watch, collect, tear down.

The runner process only declares topology, shows progress and does arithmetic; publishing and
consuming happen in spawned worker processes (publisher.py, consumer.py), so the load generator
is not the bottleneck of the server it measures.
"""

from __future__ import annotations

import os
import queue
import time
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pamqp import commands
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.load import consumer, publisher
from bench.load.connection import RawConnection
from bench.load.consumer import ConsumePlan
from bench.load.publisher import PublishPlan
from bench.load.scenarios import Scenario, queue_arguments, split_counts
from bench.load.workers import CONTEXT, WorkerLink, new_progress

console = Console(stderr=True)


# The durability policy of a server the bench did not start: nothing it can ask says it.
OUTSIDE_POLICY = "not known: server started outside the bench"


@dataclass(frozen=True)
class Target:
    url: str
    label: str
    policy: str = OUTSIDE_POLICY
    pid: int | None = None  # the server's process when the bench started it (for RSS)
    data_dir: Path | None = None  # its data, when the bench started it (for disk use)
    # Several entry points to one system (a cluster's gateways): publishers and consumers are
    # spread over them; ``url`` (declares, deletes) is the first. Empty: ``url`` alone.
    urls: tuple[str, ...] = ()

    def publisher_url(self, index: int) -> str:
        """Publisher ``index`` goes to ``urls[index % n]``."""
        return self.urls[index % len(self.urls)] if self.urls else self.url

    def consumer_url(self, index: int) -> str:
        """Consumer ``index`` goes to ``urls[(index + 1) % n]``: with two gateways, the first
        publisher's messages reach the first consumer through the other gateway."""
        return self.urls[(index + 1) % len(self.urls)] if self.urls else self.url


@dataclass(frozen=True)
class Topology:
    queues: list[str]
    exchange: str  # "" unless fanout


@dataclass
class Group:
    """Worker processes started together, sharing go/stop events and one result queue."""

    procs: list[Any]
    links: list[WorkerLink]
    results: dict[int, dict[str, Any]]
    go_ns: int = 0  # when they were let go

    def ordered(self) -> list[dict[str, Any]]:
        """Results in plan order."""
        return [self.results[link.slot] for link in self.links]

    def alive(self) -> bool:
        return any(p.is_alive() for p in self.procs)


class Run:
    """One scenario against one target; ``execute`` returns the JSON-able result."""

    def __init__(self, scenario: Scenario, target: Target, scale: float, procs: int) -> None:
        self.s = scenario
        self.target = target
        self.count = scenario.count(scale)
        self.deadline = time.monotonic() + scenario.deadline(scale)
        self.procs = max(1, procs)
        run_id = uuid.uuid4().hex[:6]
        base = f"bench-{scenario.name}-{run_id}"
        exchange = f"{base}-fx" if scenario.fanout else f"{base}-kx" if scenario.keys else ""
        self.topology = Topology([f"{base}-{i}" for i in range(scenario.queues)], exchange)
        self.progress = new_progress(64)
        self.stop = CONTEXT.Event()
        self.snapshot = CONTEXT.Event()
        self.results: Any = CONTEXT.Queue()
        self.slots = 0
        self.groups: list[Group] = []

    # -- topology ----------------------------------------------------------------------------
    def declare(self, conn: RawConnection) -> None:
        s, t = self.s, self.topology
        conn.open_channel(1)
        arguments = queue_arguments(s, self.target.label)
        declares = [
            commands.Queue.Declare(queue=q, durable=s.durable, arguments=arguments)
            for q in t.queues
        ]
        conn.pipeline(1, declares, commands.Queue.DeclareOk)
        if t.exchange:
            kind = "topic" if s.keys else "fanout"  # keyed: every key to the one queue
            conn.call(
                1,
                commands.Exchange.Declare(exchange=t.exchange, exchange_type=kind),
                commands.Exchange.DeclareOk,
            )
            binds = [
                commands.Queue.Bind(queue=q, exchange=t.exchange, routing_key="#" if s.keys else "")
                for q in t.queues
            ]
            conn.pipeline(1, binds, commands.Queue.BindOk)

    def delete(self) -> None:
        conn = RawConnection(self.target.url)
        try:
            conn.open_channel(1)
            deletes = [commands.Queue.Delete(queue=q) for q in self.topology.queues]
            conn.pipeline(1, deletes, commands.Queue.DeleteOk)
            if self.topology.exchange:
                delete = commands.Exchange.Delete(exchange=self.topology.exchange)
                conn.call(1, delete, commands.Exchange.DeleteOk)
        finally:
            conn.close()

    # -- plans -------------------------------------------------------------------------------
    def publish_plans(self) -> tuple[list[PublishPlan], list[list[list[int]]]]:
        """Plans, and for each plan and route the queue indexes the route reaches."""
        s, t = self.s, self.topology
        base = PublishPlan(
            url=self.target.url,
            routes=(),
            count=0,
            body_bytes=s.body_bytes,
            persistent=s.persistent,
            confirm_window=s.confirm_window,
            deadline_mono=self.deadline,
            mark_every=self.count // 10 if s.backlog else 0,
        )
        if s.keys:  # every key into the one queue, one sequence over them all
            routes = tuple((t.exchange, f"k{k}") for k in range(s.keys))
            plan = replace(base, url=self.target.publisher_url(0), routes=routes,
                           count=self.count, one_sequence=True)  # fmt: skip
            return [plan], [[[0]] * s.keys]
        if s.fanout or s.queues == 1:  # one stream: one publisher keeps its sequence
            reach = list(range(s.queues))
            route = (t.exchange, "") if s.fanout else ("", t.queues[0])
            plan = replace(
                base, url=self.target.publisher_url(0), routes=(route,), count=self.count
            )
            return [plan], [[reach]]
        n_pub = min(self.procs, s.queues)
        per_queue = split_counts(self.count, s.queues)
        plans, reaches = [], []
        for p in range(n_pub):
            mine = list(range(p, s.queues, n_pub))
            count = sum(per_queue[q] for q in mine)
            routes = tuple(("", t.queues[q]) for q in mine)
            url = self.target.publisher_url(p)
            plans.append(replace(base, url=url, routes=routes, count=count))
            reaches.append([[q] for q in mine])
        return plans, reaches

    def consume_plans(self, bounds: list[int]) -> tuple[list[ConsumePlan], list[list[int]]]:
        """Plans (fast first, then the slow consumer if any) and each plan's queue indexes."""
        s = self.s
        if s.consumers > 1:  # several consumers of one queue, each checking what it gets
            plans = [self._consume_plan([0], [sum(bounds)], s.prefetch, 0.0,
                                        self.target.consumer_url(c))
                     for c in range(s.consumers)]  # fmt: skip
            return plans, [[0] for _ in plans]
        fast = list(range(s.slow_queues, s.queues))
        n_con = min(self.procs, len(fast))
        chunks = [fast[c::n_con] for c in range(n_con)]
        plans = [
            self._consume_plan(chunk, bounds, s.prefetch, 0.0, self.target.consumer_url(c))
            for c, chunk in enumerate(chunks)
        ]
        if s.slow_queues:
            slow = list(range(s.slow_queues))
            url = self.target.consumer_url(len(plans))
            plans.append(self._consume_plan(slow, bounds, 10, 1.0 / s.slow_ack_per_s, url))
            chunks.append(slow)
        return plans, chunks

    def _consume_plan(
        self,
        queues: list[int],
        bounds: list[int],
        prefetch: int,
        ack_interval_s: float,
        url: str,
    ) -> ConsumePlan:
        return ConsumePlan(
            url=url,
            queues=tuple(self.topology.queues[q] for q in queues),
            expected=tuple(bounds[q] for q in queues),
            prefetch=prefetch,
            no_ack=self.s.no_ack,
            deadline_mono=self.deadline,
            ack_interval_s=ack_interval_s,
            ack_each=self.s.ack_each,
        )

    # -- processes ---------------------------------------------------------------------------
    def spawn(self, target: Any, plans: Sequence[Any]) -> Group:
        go = CONTEXT.Event()
        group = Group([], [], {})
        for plan in plans:
            link = WorkerLink(self.slots, self.progress, go, self.stop, self.results, self.snapshot)
            self.progress[self.slots] = 0
            self.slots += 1
            proc = CONTEXT.Process(target=target, args=(plan, link), daemon=True)
            proc.start()
            group.procs.append(proc)
            group.links.append(link)
        self.groups.append(group)
        ready = 0
        while ready < len(plans):  # setup (10k consumers) can take a while on a slow server
            kind = self._next_message(1.0)
            if kind == "ready":
                ready += 1
            elif kind is None and not all(p.is_alive() for p in group.procs):
                self.stop.set()
                raise RuntimeError("a worker died before it was ready")
        group.go_ns = time.monotonic_ns()
        go.set()
        return group

    def _next_message(self, timeout_s: float) -> str | None:
        """Take one message off the result queue; None if there was none in time."""
        try:
            slot, kind, payload = self.results.get(block=timeout_s > 0, timeout=timeout_s or None)
        except queue.Empty:
            return None
        if kind == "error":
            self.stop.set()
            raise RuntimeError(f"worker {slot} failed:\n{payload}")
        if kind == "result":
            for group in self.groups:
                if any(link.slot == slot for link in group.links):
                    group.results[slot] = payload
        return str(kind)

    def collect(self, timeout_s: float = 0.0) -> None:
        """Move finished results into their groups (waits up to ``timeout_s`` for the first)."""
        while self._next_message(timeout_s) is not None:
            timeout_s = 0.0

    def finish(self, group: Group, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while len(group.results) < len(group.procs) and time.monotonic() < deadline:
            self.collect(timeout_s=0.2)
        for proc in group.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        if len(group.results) < len(group.procs):
            raise RuntimeError("a worker did not report a result")

    def progress_sum(self, group: Group, links: Sequence[WorkerLink] | None = None) -> int:
        return sum(self.progress[link.slot] for link in (links or group.links))


def percentiles_ms(latencies: array[int]) -> dict[str, float | None]:
    if not latencies:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    ordered = sorted(latencies)
    n = len(ordered)
    pick = {q: ordered[min(n - 1, int(n * q))] / 1000 for q in (0.5, 0.95, 0.99)}
    return {
        "p50_ms": round(pick[0.5], 2),
        "p95_ms": round(pick[0.95], 2),
        "p99_ms": round(pick[0.99], 2),
    }


def merge_latencies(results: Sequence[dict[str, Any]]) -> array[int]:
    merged = array("q")
    for result in results:
        merged.frombytes(result["latencies_us"])
    return merged


def new_progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def default_procs() -> int:
    """Worker processes per role where a scenario can spread (many queues, fan-out)."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


# Keep the spawn targets importable from here (spawned children import them by name).
PUBLISHER_MAIN = publisher.main
CONSUMER_MAIN = consumer.main
