"""`run_scenario`: the flow of one measured run, and the arithmetic of its JSON result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.load.connection import RawConnection
from bench.load.runner import (
    CONSUMER_MAIN,
    PUBLISHER_MAIN,
    Group,
    Run,
    Target,
    console,
    merge_latencies,
    new_progress_bar,
    percentiles_ms,
)
from bench.load.scenarios import Scenario, split_counts
from bench.processes import tree_cpu_s, tree_rss_mb


def run_scenario(scenario: Scenario, target: Target, scale: float, procs: int) -> dict[str, Any]:
    run = Run(scenario, target, scale, procs)
    setup_start = time.monotonic()
    conn = RawConnection(target.url, timeout_s=300)  # per batch of 1000 declares
    try:
        run.declare(conn)
    finally:
        conn.close()
    setup_seconds = round(time.monotonic() - setup_start, 3)
    run.deadline += setup_seconds  # the deadline bounds the measured part
    try:
        return {**_execute(run), "setup_seconds": setup_seconds}
    finally:
        run.stop.set()
        for group in run.groups:
            for proc in group.procs:
                proc.join(2)
                if proc.is_alive():
                    proc.kill()
        try:
            run.delete()
        except Exception as error:  # a failed cleanup must not hide the result
            console.print(f"[yellow]cleanup of {scenario.name} failed: {error}")


def _execute(run: Run) -> dict[str, Any]:
    s = run.s
    pub_plans, reaches = run.publish_plans()
    expected = [0] * s.queues  # per queue, if every publish goes out
    for plan, plan_reach in zip(pub_plans, reaches, strict=True):
        for count, route_reach in zip(
            split_counts(plan.count, len(plan.routes)), plan_reach, strict=True
        ):
            for q in route_reach:
                expected[q] += count
    con_plans, con_queues = run.consume_plans(expected)
    n_fast = len(con_plans) - (1 if s.slow_queues else 0)
    fast = sorted({q for chunk in con_queues[:n_fast] for q in chunk})  # a queue once
    extra: dict[str, Any] = {}
    cpu_start = tree_cpu_s(run.target.pid) if run.target.pid else None
    with new_progress_bar() as bar:
        task = bar.add_task(
            f"{s.name} @ {run.target.label}", total=sum(expected[q] for q in fast), status=""
        )
        if s.backlog:  # publish everything first, with no consumer
            publishers = run.spawn(PUBLISHER_MAIN, pub_plans)
            while len(publishers.results) < len(pub_plans) and time.monotonic() < run.deadline:
                run.collect(timeout_s=0.2)
                bar.update(task, status=f"backlog {run.progress_sum(publishers):,}")
            run.finish(publishers)
            if run.target.pid:
                extra["rss_after_publish_mb"] = tree_rss_mb(run.target.pid)
            if run.target.data_dir:
                extra["disk_after_publish_mb"] = round(dir_bytes(run.target.data_dir) / 2**20, 1)
            consumers = run.spawn(CONSUMER_MAIN, con_plans)
        else:
            consumers = run.spawn(CONSUMER_MAIN, con_plans)
            publishers = run.spawn(PUBLISHER_MAIN, pub_plans)
        fast_links = consumers.links[:n_fast]
        target_count: int | None = None
        while time.monotonic() < run.deadline:
            run.collect(timeout_s=0.1)
            if target_count is None and len(publishers.results) == len(pub_plans):
                run.snapshot.set()  # consumers note per-queue counts: fairness at publish end
                published = _published(publishers, reaches, s.queues)
                target_count = sum(published[q] for q in fast)
            delivered = run.progress_sum(consumers, fast_links)
            status = f"published {run.progress_sum(publishers):,}"
            bar.update(task, completed=delivered, status=status)
            if target_count is not None and delivered >= target_count:
                break
        run.stop.set()
        run.finish(publishers)
        run.finish(consumers)
    if run.target.pid:
        extra["rss_end_mb"] = tree_rss_mb(run.target.pid)
    if run.target.pid and cpu_start is not None:  # the server's, from /proc: per core's worth
        extra["cpu_s"] = round(tree_cpu_s(run.target.pid) - cpu_start, 2)
    if s.backlog and run.target.data_dir:
        extra["disk_after_drain_mb"] = round(settled_dir_bytes(run.target.data_dir) / 2**20, 1)
    return _summary(run, publishers, consumers, reaches, con_queues, n_fast, extra)


def dir_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (what the server keeps on disk)."""
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except FileNotFoundError:
            continue  # deleted while we walked: it no longer counts
    return total


def settled_dir_bytes(root: Path, window_s: float = 45.0) -> int:
    """The smallest size ``root`` reaches within ``window_s`` after a drain: both servers free
    consumed messages in the background (mqgw: offsets persisted every 5 s, reclaim every
    10 s; RabbitMQ: message store compaction), so one reading right away says little."""
    smallest = dir_bytes(root)
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        time.sleep(1.0)
        smallest = min(smallest, dir_bytes(root))
    return smallest


def _published(publishers: Group, reaches: list[list[list[int]]], queues: int) -> list[int]:
    """Per queue: publishes that went out (a fan-out publish reaches every queue)."""
    published = [0] * queues
    for result, plan_reach in zip(publishers.ordered(), reaches, strict=True):
        for sent, route_reach in zip(result["sent_per_route"], plan_reach, strict=True):
            for q in route_reach:
                published[q] += sent
    return published


def _summary(
    run: Run,
    publishers: Group,
    consumers: Group,
    reaches: list[list[list[int]]],
    con_queues: list[list[int]],
    n_fast: int,
    extra: dict[str, Any],
) -> dict[str, Any]:
    s = run.s
    pubs, cons = publishers.ordered(), consumers.ordered()
    published = _published(publishers, reaches, s.queues)
    unique = [0] * s.queues
    at_publish_end: list[int | None] = [None] * s.queues
    for result, queues in zip(cons, con_queues, strict=True):
        snap = result["snapshot_per_queue"] or [None] * len(queues)
        for q, n, m in zip(queues, result["unique_per_queue"], snap, strict=True):
            unique[q] += n  # several consumers of one queue (keyed) add up
            if m is not None:
                at_publish_end[q] = (at_publish_end[q] or 0) + m
    fast_results = cons[:n_fast]
    fast = sorted({q for chunk in con_queues[:n_fast] for q in chunk})
    delivered = sum(unique[q] for q in fast)
    start_ns = min(p["started_ns"] for p in pubs)
    end_ns = max([c["last_ns"] for c in fast_results] + [p["finished_ns"] for p in pubs])
    seconds = max(1e-9, (end_ns - start_ns) / 1e9)
    sent = sum(p["sent"] for p in pubs)
    out: dict[str, Any] = {
        "scenario": s.name,
        "target": run.target.label,
        "policy": run.target.policy,
        "messages": delivered,
        "published": sent,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(delivered / seconds),
        "mb_per_s": round(delivered * s.body_bytes / seconds / 1e6, 2),
        **percentiles_ms(merge_latencies(fast_results)),
        "lost": sum(max(0, published[q] - unique[q]) for q in fast),
        "duplicated": sum(c["duplicated"] for c in cons),
        "complete": sent == run.count and delivered == sum(published[q] for q in fast),
        "expected": run.count * (s.queues if s.fanout else 1),
        "body_bytes": s.body_bytes,
        "confirmed": sum(p["confirmed"] for p in pubs),
        "nacked": sum(p["nacked"] for p in pubs),
        "redelivered": sum(c["redelivered"] for c in cons),
        "unexpected": sum(c["unexpected"] for c in cons),
    }
    if s.fanout:
        out["publish_per_s"] = round(sent / seconds)
    if s.queues >= 100:
        shares = [unique[q] / published[q] for q in fast if published[q]]
        out["min_queue_share"] = round(min(shares), 4) if shares else None
        snaps = [(at_publish_end[q] or 0) / published[q] for q in fast if published[q]]
        out["min_queue_share_at_publish_end"] = round(min(snaps), 4) if snaps else None
    if s.slow_queues:
        slow = range(s.slow_queues)
        out["fast_p99_ms"] = out["p99_ms"]
        out["slow_published"] = sum(published[q] for q in slow)
        out["slow_delivered"] = sum(unique[q] for q in slow)
    if s.backlog:
        out.update(_backlog_rates(pubs, consumers, fast_results, delivered))
    out.update(extra)
    if "cpu_s" in out and delivered:  # efficiency per core: what survives a bigger machine
        out["cpu_s_per_100k"] = round(out["cpu_s"] * 100_000 / delivered, 3)
    return out


def _backlog_rates(
    pubs: list[dict[str, Any]], consumers: Group, fast: list[dict[str, Any]], delivered: int
) -> dict[str, Any]:
    """Publish rate of the first and of the last tenth, and the drain rate."""
    (pub,) = pubs  # one queue: one publisher
    marks = [(0, pub["started_ns"]), *pub["marks"], (pub["confirmed"], pub["finished_ns"])]
    tenth = max(1, pub["sent"] // 10)

    def rate(lo: tuple[int, int], hi: tuple[int, int]) -> int | None:
        return round((hi[0] - lo[0]) / ((hi[1] - lo[1]) / 1e9)) if hi[1] > lo[1] else None

    first = next((m for m in marks if m[0] >= tenth), marks[-1])
    last_start = next((m for m in reversed(marks) if m[0] <= marks[-1][0] - tenth), marks[0])
    drain_ns = max(c["last_ns"] for c in fast) - consumers.go_ns
    return {
        "publish_seconds": round((pub["finished_ns"] - pub["started_ns"]) / 1e9, 3),
        "publish_first_per_s": rate(marks[0], first),
        "publish_last_per_s": rate(last_start, marks[-1]),
        "rate_window": tenth,
        "drain_seconds": round(drain_ns / 1e9, 3),
        "drain_per_s": round(delivered / (drain_ns / 1e9)) if drain_ns > 0 else None,
    }
