"""`mqgw bench gc`: disk use with a stuck queue beside a busy one, with and without the
copy-forward collector, and what the collector costs.

The workload: a busy queue that keeps a steady backlog (its consumer commits as it goes) and a
stuck queue that gets every ``stuck_every``-th message and never reads. Housekeeping (flush,
checkpoint, offsets, collection, reclaim) runs every ``housekeeping_mb`` appended, on the same
thread, as the gateway's store owner would. Live bytes are what some queue can still read;
space amplification is commitlog bytes on disk over live bytes, sampled after a warm-up.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from storage import QUEUE_GROUP, FlushPolicy, LogStore, Record, StoreConfig
from storage.log.collector import collect_now

console = Console(stderr=True)
BUSY, STUCK = 1, 2


@dataclass
class GcRun:
    collector: bool
    messages: int
    body_bytes: int
    segment_mb: int
    seconds: float
    appends_per_s: float
    amplification_mean: float
    amplification_max: float
    disk_end_mb: float
    live_end_mb: float
    copied_mb: float
    collect_seconds: float
    copy_mb_per_s: float | None


@dataclass(frozen=True)
class Workload:
    messages: int = 400_000
    body_bytes: int = 1024
    segment_mb: int = 16
    stuck_every: int = 100
    busy_backlog: int = 20_000
    housekeeping_mb: int = 4


def run_one(root: Path, work: Workload, collector: bool, progress: Progress) -> GcRun:
    config = StoreConfig(
        root,
        segment_size_bytes=work.segment_mb << 20,
        max_record_bytes=min(1 << 20, (work.segment_mb << 20) // 2),
        flush=FlushPolicy.ASYNC,
        gc_max_live_ratio=0.5 if collector else 0.0,
    )
    store = LogStore.open(config)
    store.create_queue(BUSY, 1)
    store.create_queue(STUCK, 1)
    body = b"x" * work.body_bytes
    busy = Record(b"", b"busy", b"", body, ((BUSY, 0),))
    stuck = Record(b"", b"stuck", b"", body, ((STUCK, 0),))
    record_bytes = len(body) + 80
    every = max(1, (work.housekeeping_mb << 20) // record_bytes)
    samples: list[float] = []
    collect_s = 0.0
    busy_count = stuck_count = 0
    task = progress.add_task(f"collector {'on' if collector else 'off'}", total=work.messages)
    start = time.perf_counter()
    for i in range(0, work.messages, 64):
        batch = [stuck if (i + k) % work.stuck_every == 0 else busy for k in range(64)]
        store.append(batch)
        stuck_count += sum(1 for r in batch if r is stuck)
        busy_count += sum(1 for r in batch if r is busy)
        store.commit_offset(QUEUE_GROUP, BUSY, 0, max(0, busy_count - work.busy_backlog))
        if (i // 64) % max(1, every // 64) == 0:
            store.flush()
            store.checkpoint()
            store.persist_offsets()
            if collector:
                began = time.perf_counter()
                # Bounded per round, as the gateway paces it: at most two segments.
                for _ in range(2):
                    if collect_now(store) is None:
                        break
                    store.flush()
                    store.checkpoint()
                collect_s += time.perf_counter() - began
            store.apply_retention()
            live = (min(busy_count, work.busy_backlog) + stuck_count) * record_bytes
            if i > work.messages // 4:
                samples.append(store.commit_log.files.total_bytes() / live)
        progress.update(task, completed=i + 64)
    seconds = time.perf_counter() - start
    live_end = (min(busy_count, work.busy_backlog) + stuck_count) * record_bytes
    disk_end = store.commit_log.files.total_bytes()
    copied = store.collected.copied_bytes
    store.close()
    return GcRun(
        collector,
        work.messages,
        work.body_bytes,
        work.segment_mb,
        round(seconds, 2),
        round(work.messages / seconds),
        round(sum(samples) / len(samples), 2) if samples else 0.0,
        round(max(samples), 2) if samples else 0.0,
        round(disk_end / 2**20, 1),
        round(live_end / 2**20, 1),
        round(copied / 2**20, 1),
        round(collect_s, 2),
        round(copied / 2**20 / collect_s, 1) if collect_s else None,
    )


def run(work: Workload, data_dir: Path | None, json_out: Path | None) -> list[GcRun]:
    base = Path(tempfile.mkdtemp(prefix="mqgw-gc-bench-", dir=data_dir))
    runs: list[GcRun] = []
    try:
        with Progress(console=console, transient=True) as progress:
            for collector in (False, True):
                result = run_one(base / str(collector), work, collector, progress)
                print(json.dumps(asdict(result)), flush=True)
                runs.append(result)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if json_out is not None:
        json_out.write_text("".join(json.dumps(asdict(r)) + "\n" for r in runs))
    table = Table(title=f"stuck queue beside a busy one: {dataclasses.astuple(work)}")
    for column in ("collector", "appends/s", "amplification mean / max", "disk end MB",
                   "live end MB", "copied MB", "copy MB/s"):  # fmt: skip
        table.add_column(column)
    for r in runs:
        table.add_row(
            "on" if r.collector else "off",
            f"{r.appends_per_s:,}",
            f"{r.amplification_mean} / {r.amplification_max}",
            str(r.disk_end_mb),
            str(r.live_end_mb),
            str(r.copied_mb),
            str(r.copy_mb_per_s),
        )
    console.print(table)
    return runs
