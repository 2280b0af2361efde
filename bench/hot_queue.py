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
from bench.servers import tree_cpu_s

console = Console(stderr=True, highlight=False)


def _cluster(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "cluster.json").read_text())
    return data


def _cpu(data: dict[str, Any]) -> float:
    pids = [m["pid"] for key in ("gateways", "brokers") for m in data[key] if m.get("pid")]
    return sum(tree_cpu_s(pid) for pid in pids)


def run_one(data: dict[str, Any], partitions: int, messages: int, publishers: int,
            deadline_s: float) -> dict[str, Any]:  # fmt: skip
    urls = [g["amqp_url"] for g in data["gateways"]]
    name = f"hot-{partitions}p"
    with pika.BlockingConnection(pika.URLParameters(urls[0])) as conn:
        channel = conn.channel()
        channel.queue_delete(name)
        channel.queue_declare(name, durable=True, arguments={"x-mqgw-partitions": partitions})
    deadline = time.monotonic() + deadline_s
    each = messages // publishers
    go, stop = CONTEXT.Event(), CONTEXT.Event()
    results: Any = CONTEXT.Queue()
    progress = new_progress(publishers + len(urls))
    procs = []
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
    for slot, (target, plan) in enumerate(plans):
        link = WorkerLink(slot, progress, go, stop, results)
        proc = CONTEXT.Process(target=target, args=(plan, link), daemon=True)
        proc.start()
        procs.append(proc)
    ready = 0
    while ready < len(plans):
        slot, kind, payload = results.get(timeout=60)
        if kind == "error":
            stop.set()
            raise RuntimeError(payload)
        ready += kind == "ready"
    cpu_before = _cpu(data)
    go.set()
    total = each * publishers
    with pika.BlockingConnection(pika.URLParameters(urls[0])) as conn:
        channel = conn.channel()
        while time.monotonic() < deadline:  # every publish confirmed and the queue empty
            confirmed = sum(progress[s] for s in range(len(urls), len(plans)))
            left = int(channel.queue_declare(name, passive=True).method.message_count)
            console.print(f"  {name}: {confirmed:,} of {total:,} confirmed, {left:,} in the "
                          "queue", end="\r")  # fmt: skip
            if confirmed >= total and left == 0:
                break
            time.sleep(0.5)
    stop.set()
    outcome: dict[int, dict[str, Any]] = {}
    while len(outcome) < len(plans):
        try:
            slot, kind, payload = results.get(timeout=30)
        except queues.Empty:
            break
        if kind == "result":
            outcome[slot] = payload
        elif kind == "error":
            raise RuntimeError(payload)
    for proc in procs:
        proc.join(5)
    cpu = _cpu(data) - cpu_before
    consumed = [outcome[s] for s in range(len(urls)) if s in outcome]
    received = sum(c["received"] for c in consumed)
    first = min((c["first_ns"] for c in consumed if c["first_ns"]), default=0)
    last = max((c["last_ns"] for c in consumed), default=0)
    seconds = (last - first) / 1e9 if last > first else 0.0
    latencies = array("q")
    for c in consumed:
        latencies.frombytes(c["latencies_us"])
    spread = percentiles_ms(latencies)
    with pika.BlockingConnection(pika.URLParameters(urls[0])) as conn:
        conn.channel().queue_delete(name)
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
