"""`mqgw bench hot-queue --dir D`: one hot queue on a running local cluster, at 1, 2 and 4
partitions (docs/elastic-queues.md), with publishers spread over the gateways (each its own
channel: its own partition) and one consumer per gateway.

Per partition count: a fresh durable queue ``hot-<P>p`` declared with ``x-mqgw-partitions``
P; ``--publishers`` raw-socket publisher processes (confirm window 1000, persistent, 1 KB)
publish ``--messages`` in all; consumers ack with prefetch 1000. Figures: delivered msgs/s
(first to last delivery), publish-to-delivery p50/p99, CPU seconds of the whole cluster per
100k messages, and which gateway delivered how many. A progress line per run, a table and
JSON lines at the end.
"""

from __future__ import annotations

import json
import logging
import queue as queues
import time
from array import array
from pathlib import Path
from typing import Any

import pika
from rich.console import Console
from rich.table import Table

from bench.load import consumer, publisher
from bench.load.consumer import ConsumePlan
from bench.load.publisher import PublishPlan
from bench.load.runner import percentiles_ms
from bench.load.workers import CONTEXT, WorkerLink, new_progress
from bench.processes import tree_cpu_s

console = Console(stderr=True, highlight=False)


def _cluster(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "cluster.json").read_text())
    return data


def _cpu(data: dict[str, Any]) -> float:
    pids = [m["pid"] for key in ("gateways", "brokers") for m in data[key] if m.get("pid")]
    return sum(tree_cpu_s(pid) for pid in pids)


def _fresh_queue(url: str, name: str, partitions: int) -> None:
    """Declare ``name`` anew, empty, with ``partitions`` partitions."""
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        channel = conn.channel()
        channel.queue_delete(name)
        channel.queue_declare(name, durable=True, arguments={"x-mqgw-partitions": partitions})


def _delete_queue(url: str, name: str) -> None:
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        conn.channel().queue_delete(name)


def _worker_plans(
    urls: list[str], name: str, each: int, publishers: int, deadline: float
) -> list[tuple[Any, Any]]:
    """One consumer per gateway first (slots 0..len(urls)-1), then the publishers, spread
    over the gateways."""
    plans: list[tuple[Any, Any]] = [
        (consumer.main, ConsumePlan(urls[c], (name,), (each,), 1000, False, deadline))
        for c in range(len(urls))
    ]
    plans += [
        (
            publisher.main,
            PublishPlan(urls[p % len(urls)], (("", name),), each, 1024, True, 1000, deadline),
        )
        for p in range(publishers)
    ]
    return plans


def _start_workers(
    plans: list[tuple[Any, Any]], progress: Any, go: Any, stop: Any, results: Any
) -> list[Any]:
    procs = []
    for slot, (target, plan) in enumerate(plans):
        link = WorkerLink(slot, progress, go, stop, results)
        proc = CONTEXT.Process(target=target, args=(plan, link), daemon=True)
        proc.start()
        procs.append(proc)
    return procs


def _wait_ready(results: Any, workers: int, stop: Any) -> None:
    """Until every worker reports ready (or one failed: stop them all)."""
    ready = 0
    while ready < workers:
        _slot, kind, payload = results.get(timeout=60)
        if kind == "error":
            stop.set()
            raise RuntimeError(payload)
        ready += kind == "ready"


def _wait_drained(
    url: str, name: str, progress: Any, publisher_slots: range, total: int, deadline: float
) -> None:
    """A progress line every half second until the run is over."""
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        channel = conn.channel()
        while time.monotonic() < deadline:  # every publish confirmed and the queue empty
            confirmed = sum(progress[s] for s in publisher_slots)
            left = int(channel.queue_declare(name, passive=True).method.message_count)
            console.print(f"  {name}: {confirmed:,} of {total:,} confirmed, {left:,} in the "
                          "queue", end="\r")  # fmt: skip
            if confirmed >= total and left == 0:
                break
            time.sleep(0.5)


def _collect(results: Any, workers: int) -> dict[int, dict[str, Any]]:
    """Each worker's result by slot (those that answer within 30 s of the last one)."""
    outcome: dict[int, dict[str, Any]] = {}
    while len(outcome) < workers:
        try:
            slot, kind, payload = results.get(timeout=30)
        except queues.Empty:
            break
        if kind == "result":
            outcome[slot] = payload
        elif kind == "error":
            raise RuntimeError(payload)
    return outcome


def _figures(
    consumed: list[dict[str, Any]], partitions: int, total: int, cpu: float
) -> dict[str, Any]:
    """The run's row from the consumers' results and the cluster's CPU seconds."""
    received = sum(c["received"] for c in consumed)
    first = min((c["first_ns"] for c in consumed if c["first_ns"]), default=0)
    last = max((c["last_ns"] for c in consumed), default=0)
    seconds = (last - first) / 1e9 if last > first else 0.0
    latencies = array("q")
    for c in consumed:
        latencies.frombytes(c["latencies_us"])
    spread = percentiles_ms(latencies)
    return {
        "partitions": partitions,
        "messages": total,
        "received": received,
        "msgs_per_s": round(received / seconds) if seconds else None,
        "p50_ms": spread["p50_ms"],
        "p99_ms": spread["p99_ms"],
        "cpu_s_per_100k": round(cpu * 100_000 / received, 2) if received else None,
        "per_gateway": [c["received"] for c in consumed],
    }


def run_one(data: dict[str, Any], partitions: int, messages: int, publishers: int,
            deadline_s: float) -> dict[str, Any]:  # fmt: skip
    urls = [g["amqp_url"] for g in data["gateways"]]
    name = f"hot-{partitions}p"
    _fresh_queue(urls[0], name, partitions)
    deadline = time.monotonic() + deadline_s
    each = messages // publishers
    go, stop = CONTEXT.Event(), CONTEXT.Event()
    results: Any = CONTEXT.Queue()
    progress = new_progress(publishers + len(urls))
    plans = _worker_plans(urls, name, each, publishers, deadline)
    procs = _start_workers(plans, progress, go, stop, results)
    _wait_ready(results, len(plans), stop)
    cpu_before = _cpu(data)
    go.set()
    total = each * publishers
    _wait_drained(urls[0], name, progress, range(len(urls), len(plans)), total, deadline)
    stop.set()
    outcome = _collect(results, len(plans))
    for proc in procs:
        proc.join(5)
    cpu = _cpu(data) - cpu_before
    consumed = [outcome[s] for s in range(len(urls)) if s in outcome]
    row = _figures(consumed, partitions, total, cpu)
    _delete_queue(urls[0], name)
    return row


def run(directory: Path, counts: list[int], messages: int, publishers: int) -> int:
    logging.getLogger("pika").setLevel(logging.WARNING)  # its INFO lines hide the figures
    data = _cluster(directory)
    rows = []
    for partitions in counts:
        console.print(f"hot queue, {partitions} partition(s): {messages:,} messages from "
                      f"{publishers} publishers over {len(data['gateways'])} gateways")  # fmt: skip
        row = run_one(data, partitions, messages, publishers, deadline_s=600)
        rows.append(row)
        print(json.dumps(row), flush=True)
    table = Table("partitions", "msgs/s", "p50 ms", "p99 ms", "CPU s/100k", "per gateway")
    for row in rows:
        table.add_row(str(row["partitions"]), f"{row['msgs_per_s']:,}", str(row["p50_ms"]),
                      str(row["p99_ms"]), str(row["cpu_s_per_100k"]),
                      " / ".join(f"{n:,}" for n in row["per_gateway"]))  # fmt: skip
    console.print(table)
    return 0 if all(r["received"] >= r["messages"] for r in rows) else 1
