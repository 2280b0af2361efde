"""One nemesis run: build the hosts and the cluster, start the workload, apply the seed's
faults on time, heal, drain every queue, check the history.

Every fault is logged with its time from the start (and the seed in the first line), so a
failed run is replayed with the same seed. The verdict, the fault timeline and the messages
concerned go to the report; the processes' logs stay under the run's directory.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from localcluster.nemesis.checker import Verdict, check
from localcluster.nemesis.cluster import (
    GATEWAYS,
    HOSTS,
    REDIS_HOSTS,
    RESTARTABLE,
    NemesisCluster,
)
from localcluster.nemesis.deciding import longest_within, read_stretches
from localcluster.nemesis.hosts import hosts
from localcluster.nemesis.masters import overlaps, problems, read_terms, read_windows
from localcluster.nemesis.plan import LOSSY_KBIT, Fault, plan
from localcluster.nemesis.workload import QUEUES, History, Workload, pika_module

log = logging.getLogger("mqgw.nemesis")
SETTLE_S = 20.0  # after the last heal, before the publishers stop: failovers finish
DRAIN_QUIET_S = 5.0
DRAIN_TIMEOUT_S = 180.0


@dataclass
class Report:
    seed: int
    minutes: float
    faults: list[str] = field(default_factory=list)  # the timeline, as applied
    verdict: Verdict | None = None
    drained: bool = False
    client_errors: int = 0
    stalls: dict[str, list[float]] = field(default_factory=dict)  # fault kind -> longest gaps
    crashed: list[str] = field(default_factory=list)  # processes that exited by themselves
    start_failures: int = 0  # processes that gave up starting (one line) and were restarted
    masters: list[str] = field(default_factory=list)  # the group's terms, from broker logs
    master_problems: list[str] = field(default_factory=list)
    confirm_windows: int = 0  # stretches of confirms found in the brokers' logs

    @property
    def ok(self) -> bool:
        return (
            self.drained
            and self.verdict is not None
            and self.verdict.ok
            and not self.master_problems
            and not self.crashed
        )

    def describe(self) -> str:
        head = f"nemesis seed {self.seed}, {self.minutes:g} min, {len(self.faults)} faults"
        lines = [head, *(f"  {line}" for line in self.faults)]
        if not self.drained:
            lines.append("  the queues did not drain after the heal")
        if self.verdict is not None:
            lines.append(self.verdict.describe())
        lines.append(f"client errors (reconnects): {self.client_errors}")
        if self.start_failures:
            lines.append(f"processes that gave up starting and were started again: "
                         f"{self.start_failures}")  # fmt: skip
        lines.append(f"master terms: {', '.join(self.masters) or 'none'}; "
                     f"{self.confirm_windows} stretches of confirms")  # fmt: skip
        lines += [f"  CRASHED: {line}" for line in self.crashed]
        lines += [f"  MASTERS: {line}" for line in self.master_problems]
        return "\n".join(lines)


def apply(cluster: NemesisCluster, fault: Fault) -> Callable[[], None]:
    """Start ``fault``; what heals it."""
    net = cluster.net
    if fault.kind == "isolate":
        net.isolate(fault.hosts[0][0])
        return net.heal
    if fault.kind == "halves":
        net.partition(*fault.hosts)
        return net.heal
    if fault.kind == "bridge":
        (a,), _, (c,) = fault.hosts
        net.cut(a, c)
        return net.heal
    host = fault.hosts[0][0]
    if fault.kind == "lossy":
        net.degrade(host, fault.loss, LOSSY_KBIT)
        return lambda: net.restore(host)
    if fault.kind == "pause":
        cluster.pause(host)
        return lambda: cluster.resume(host)
    if fault.kind == "kill":
        cluster.kill(host)
        return lambda: cluster.restart(host)
    if fault.kind == "coordinator":
        every = fault.hosts[0]
        for name in every:
            cluster.kill_role(name, "redis")

        def restart_all() -> None:
            for name in every:
                cluster.restart(name)

        return restart_all
    raise ValueError(f"unknown fault kind {fault.kind!r}")


def longest_stall(confirms: list[float], start: float, end: float) -> float:
    """The longest time without a confirm that overlaps [start, end] (sorted ``confirms``)."""
    longest = 0.0
    for before, after in itertools.pairwise(confirms):
        if after >= start and before <= end:
            longest = max(longest, after - before)
    return longest


def _ready(workload: Workload, cluster: NemesisCluster) -> int | None:
    pika = pika_module()
    for gateway in GATEWAYS:
        try:
            params = pika.URLParameters(cluster.amqp_url(gateway))
            with pika.BlockingConnection(params) as connection:
                channel = connection.channel()
                return sum(
                    int(channel.queue_declare(q, passive=True).method.message_count) for q in QUEUES
                )
        except (pika.exceptions.AMQPError, OSError):
            continue
    return None


def run(seed: int, minutes: float, root: Path, **plan_options: Any) -> Report:
    faults = plan(seed, HOSTS, minutes, restartable=RESTARTABLE, coordinator=REDIS_HOSTS,
                  **plan_options)  # fmt: skip
    report = Report(seed, minutes)
    kills: dict[str, list[datetime]] = {}  # host -> when its processes were killed
    windows: list[tuple[datetime, float]] = []  # per fault: when it began, seconds looked at
    log.info("nemesis seed %d: %d faults over %g min in %s", seed, len(faults), minutes, root)
    with hosts(HOSTS) as net:
        cluster = NemesisCluster(net, root)
        try:
            cluster.start()
            workload = Workload({g: cluster.amqp_url(g) for g in GATEWAYS})
            workload.declare()
            workload.start()
            began = time.monotonic()
            for number, fault in enumerate(faults, 1):
                _sleep_until(began + fault.at_s)
                cluster.restart_failed_starts()
                windows.append((datetime.now(), fault.lasts_s + SETTLE_S / 2))
                heal = apply(cluster, fault)
                if fault.kind == "kill":  # (after it: a stretch ends no later than this)
                    kills.setdefault(fault.hosts[0][0], []).append(datetime.now())
                line = fault.describe()
                report.faults.append(line)
                log.info("fault %d/%d: %s", number, len(faults), line)
                _sleep_until(began + fault.at_s + fault.lasts_s)
                heal()
                log.info("healed at t=%.2fs", time.monotonic() - began)
            net.heal()
            cluster.heal_processes()
            _sleep_until(time.monotonic() + SETTLE_S)
            for gateway in GATEWAYS:
                cluster.wait_healthy(gateway, 60)
            stopped_publishing = time.monotonic()
            workload.stop_publishing()
            report.drained = workload.drain(
                lambda: _ready(workload, cluster), DRAIN_QUIET_S, DRAIN_TIMEOUT_S
            )
            history = workload.history
            # Until the publishers stopped: confirms that never came back count as a stall.
            confirms = [*sorted(p.at for p in history.published if p.confirmed),
                        stopped_publishing]  # fmt: skip
            for index, fault in enumerate(faults):
                start = began + fault.at_s
                stall = longest_stall(confirms, start, start + fault.lasts_s + SETTLE_S / 2)
                report.faults[index] += f"; longest confirm gap {stall:.2f}s"
                report.stalls.setdefault(fault.kind, []).append(stall)
            report.client_errors = len(history.errors)
            report.verdict = check(history.published, history.delivered, one_partition=QUEUES)
            _keep_history(root / "history.json", history)
            report.crashed = cluster.crashed()
            report.start_failures = cluster.start_failures
        finally:
            cluster.stop()
    blind = read_stretches(root / "logs", datetime.now())
    for index, (fault_at, seconds) in enumerate(windows[: len(report.faults)]):
        longest = longest_within(blind, fault_at, fault_at + timedelta(seconds=seconds))
        report.faults[index] += f"; no controller deciding {longest:.2f}s"
    every = read_terms(root / "logs")
    report.masters = [f"{t.broker}@{t.epoch}" for t in every]
    confirming = read_windows(root / "logs", kills)
    report.confirm_windows = len(confirming)
    report.master_problems = problems(every) + overlaps(confirming)
    log.info("nemesis seed %d: %s", seed, "clean" if report.ok else "FAILED")
    return report


def _keep_history(path: Path, history: History) -> None:
    """Every publish attempt and delivery, for a failed run's post-mortem (the checker's
    input: which consumer got what, flagged or not, when each confirm came)."""
    document = {
        "published": [dataclasses.astuple(p) for p in history.published],
        "delivered": [dataclasses.astuple(d) for d in history.delivered],
    }
    path.write_text(json.dumps(document))


def _sleep_until(deadline: float) -> None:
    # The schedule is wall time by nature: faults last seconds of real time.
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
