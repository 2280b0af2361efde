"""`mqgw bench store`: append and read throughput of the log store, and a backlog catch-up.

Appends go through the embedded (async) store exactly as the gateway calls it, so sync-flush
figures include group commit. Each run prints one JSON line; a table summarises at the end.
An append run also gives the process's CPU seconds per 100k appended records (user + system,
the fsync thread included) and which record encoder ran (``compiled`` or ``pure``, as
``MQGW_PURE_PYTHON`` chose): CPU per record is the figure a loaded machine leaves comparable.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from storage import FlushPolicy, LogStore, Record, StoreConfig, open_embedded_store, twins

console = Console(stderr=True)


@dataclass
class AppendRun:
    record_bytes: int
    flush: str
    batch: int
    fanout: int
    records: int
    seconds: float
    appends_per_s: float
    reads_per_s: float
    fsyncs_per_s: float
    records_per_fsync: float
    cpu_s_per_100k: float
    encoder: str


@dataclass
class CatchUpRun:
    backlog: int
    record_bytes: int
    fill_seconds: float
    read_seconds: float
    reads_per_s: float
    rss_start_mb: float
    rss_max_mb: float


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _config(root: Path, flush: FlushPolicy) -> StoreConfig:
    return StoreConfig(root, flush=flush, segment_size_bytes=256 << 20, checkpoint_interval_ms=1000)


def _records(record_bytes: int, batch: int, fanout: int) -> list[Record]:
    body = b"x" * max(0, record_bytes - 60)  # ~60 B of header, key and properties per record
    dests = tuple((q, 0) for q in range(fanout))
    return [Record(b"bench", b"key", b"\x00\x00", body, dests) for _ in range(batch)]


async def _append_run(
    root: Path, record_bytes: int, flush: FlushPolicy, batch: int, fanout: int, seconds: float
) -> AppendRun:
    shutil.rmtree(root, ignore_errors=True)
    os.sync()  # the previous run's dirty pages must not be written back during this one
    records = _records(record_bytes, batch, fanout)
    # Sync flush needs concurrent appenders for group commit to mean anything (as many
    # publishing channels would); async completes at once, so one appender saturates it.
    concurrency = 64 if flush is FlushPolicy.SYNC else 1
    async with open_embedded_store(_config(root, flush)) as store:
        for q in range(fanout):
            await store.create_queue(q, 1)
        appended = 0
        deadline = 0.0  # set once the run starts: opening the store is not measured

        async def appender() -> None:
            nonlocal appended
            while time.perf_counter() < deadline:
                await store.append(records)
                appended += batch
                # Async appends never suspend; yield as a gateway does between socket reads,
                # so housekeeping (flush, checkpoint) runs on its interval, not in a burst.
                await anyio.lowlevel.checkpoint()

        gc.collect()
        start = time.perf_counter()
        deadline = start + seconds
        cpu_start = _cpu_s()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(appender)
        elapsed = time.perf_counter() - start
        cpu = _cpu_s() - cpu_start
        fsyncs = store.committer.fsyncs
        read_start = time.perf_counter()
        offset = 0
        while True:
            result = await store.read(0, 0, offset, max_count=1024, max_bytes=8 << 20)
            if not result.messages:
                break
            offset = result.next_offset
        read_elapsed = time.perf_counter() - read_start
    assert offset == appended, f"read {offset} of {appended}"
    return AppendRun(
        record_bytes,
        flush.value,
        batch,
        fanout,
        appended,
        round(elapsed, 3),
        round(appended / elapsed),
        round(offset / read_elapsed),
        round(fsyncs / elapsed, 1),
        round(appended / fsyncs, 1) if fsyncs else 0.0,
        round(cpu / appended * 100_000, 3) if appended else 0.0,
        twins.in_use().get("record_encode", "pure"),
    )


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def catch_up(root: Path, backlog: int, record_bytes: int, progress: Progress) -> CatchUpRun:
    shutil.rmtree(root, ignore_errors=True)
    store = LogStore.open(_config(root, FlushPolicy.ASYNC))
    store.create_queue(0, 1)
    records = _records(record_bytes, 1024, 1)
    task = progress.add_task(f"fill backlog of {backlog:,}", total=backlog)
    start = time.perf_counter()
    filled = 0
    while filled < backlog:
        n = min(1024, backlog - filled)
        store.append(records[:n])
        filled += n
        progress.update(task, completed=filled)
    store.flush()
    fill_seconds = time.perf_counter() - start
    gc.collect()
    rss_start = rss_max = rss_mb()
    task = progress.add_task("catch-up read", total=backlog)
    start = time.perf_counter()
    offset = 0
    while offset < backlog:
        result = store.read(0, 0, offset, max_count=1024, max_bytes=8 << 20)
        offset = result.next_offset
        if offset % (256 * 1024) < 1024:
            rss_max = max(rss_max, rss_mb())
            progress.update(task, completed=offset)
    read_seconds = time.perf_counter() - start
    rss_max = max(rss_max, rss_mb())
    store.close()
    return CatchUpRun(
        backlog,
        record_bytes,
        round(fill_seconds, 2),
        round(read_seconds, 2),
        round(backlog / read_seconds),
        round(rss_start, 1),
        round(rss_max, 1),
    )


def matrix(quick: bool) -> Iterator[tuple[int, FlushPolicy, int, int]]:
    sizes = (100,) if quick else (100, 1024)
    for size in sizes:
        for flush in (FlushPolicy.ASYNC, FlushPolicy.SYNC):
            for batch in (1, 64, 512):
                yield size, flush, batch, 1
            yield size, flush, 512, 10


def run(
    data_dir: Path | None, seconds: float, backlog: int, quick: bool, json_out: Path | None
) -> None:
    root = Path(data_dir or tempfile.mkdtemp(prefix="mqgw-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    runs: list[AppendRun] = []
    lines: list[str] = []
    try:
        cases = list(matrix(quick))
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("append/read matrix", total=len(cases))
            for size, flush, batch, fanout in cases:
                progress.update(task, description=f"{size} B {flush} batch {batch} x{fanout}")
                result = anyio.run(
                    _append_run,
                    root / "run",
                    size,
                    flush,
                    batch,
                    fanout,
                    seconds,
                    backend_options={"use_uvloop": True},
                )
                runs.append(result)
                lines.append(json.dumps({"scenario": "append", **asdict(result)}))
                print(lines[-1], flush=True)
                progress.advance(task)
            catch = catch_up(root / "catchup", backlog, 100, progress) if backlog else None
        if catch is not None:
            lines.append(json.dumps({"scenario": "catch-up", **asdict(catch)}))
            print(lines[-1], flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if json_out is not None:
        json_out.write_text("\n".join(lines) + "\n")
    _summary(runs, catch)


def _summary(runs: list[AppendRun], catch: CatchUpRun | None) -> None:
    table = Table(title=f"mqgw store benchmark ({os.cpu_count()} cores)")
    for col in (
        "record",
        "flush",
        "batch",
        "fan-out",
        "appends/s",
        "reads/s",
        "fsyncs/s",
        "rec/fsync",
        "CPU s/100k",
    ):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(
            f"{r.record_bytes} B",
            r.flush,
            str(r.batch),
            str(r.fanout),
            f"{r.appends_per_s:,.0f}",
            f"{r.reads_per_s:,.0f}",
            f"{r.fsyncs_per_s:,.1f}" if r.flush == "sync" else "-",
            f"{r.records_per_fsync:,.1f}" if r.flush == "sync" else "-",
            f"{r.cpu_s_per_100k:.3f}",
        )
    console.print(table)
    by_key = {(r.record_bytes, r.flush, r.batch, r.fanout): r for r in runs}
    for size in sorted({r.record_bytes for r in runs}):
        for flush in ("async", "sync"):
            one, ten = by_key.get((size, flush, 512, 1)), by_key.get((size, flush, 512, 10))
            if one and ten:
                console.print(
                    f"fan-out cost {size} B {flush}: x10 takes "
                    f"{one.appends_per_s / ten.appends_per_s:.2f}x the time of x1 per record"
                )
    if catch is not None:
        console.print(
            f"catch-up: {catch.backlog:,} records read at {catch.reads_per_s:,.0f}/s; "
            f"RSS {catch.rss_start_mb} MB before, {catch.rss_max_mb} MB max while reading"
        )
