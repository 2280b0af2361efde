"""Read mqgw's commitlog without opening the store: safe next to a running node.

Uses the storage package's own pieces: ``find_store_dir`` and the layout (segment size), a
``CommitLog`` over a read-only FileSystem, ``CommitLog.scan`` (which validates magic, size,
offset and CRC, and stops at the end of the valid data: a record the node is still writing
ends the scan, it is never half read), and the record header and destination decoders. No
lock is taken and nothing is written, so a node may keep appending meanwhile; a scan sees
the segments' lengths as they were when ``open_commit_log`` looked.

Records the garbage collector copied forward (COPY_MAGIC) are relocations of messages read
earlier, not new publishes: skipped. So are the delay/redelivery timer's internal records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.log_timer import TIMER_QUEUE_ID
from storage.check import find_store_dir, record_limit
from storage.commit_log import CommitLog
from storage.file_system import FileSystem
from storage.log_store import read_layout
from storage.record import COPY_MAGIC, DEST_SIZE, HEADER, HEADER_SIZE, decode_destinations

REDELIVERED_FLAG = 4  # gateway/queue_runtime.py: re-entered its queue after a backoff


class ReadOnlyFileSystem(FileSystem):
    """Opens segment files read-only; any write would be a bug here, so none is possible."""

    def open(self, path: Path, create: bool = True) -> int:
        return os.open(path, os.O_RDONLY)


@dataclass(frozen=True)
class LogRecord:
    offset: int
    magic: int
    born_ts_ms: int
    store_ts_ms: int
    flags: int
    destinations: tuple[tuple[int, int], ...]
    exchange: bytes
    routing_key: bytes
    properties: bytes
    body: bytes


@dataclass(frozen=True)
class QueueName:
    vhost: str
    name: str


def open_commit_log(data_dir: Path) -> CommitLog:
    """The commitlog of ``data_dir`` (`mqgw serve`'s data dir or its store/), loaded read-only."""
    store_dir = find_store_dir(data_dir)
    layout = read_layout(store_dir)
    if layout is None:
        raise FileNotFoundError(f"{store_dir} has no layout.json")
    size = int(layout["segment_size_bytes"])
    commit_log = CommitLog(ReadOnlyFileSystem(), store_dir / "commitlog", size, record_limit(size))
    commit_log.load()
    return commit_log


def queue_names(data_dir: Path) -> dict[int, QueueName]:
    """Queue id -> (vhost, name) from the embedded node's metadata file (durable queues).

    Transient queues are not in that file; their records keep a ``#<id>`` name."""
    for path in (data_dir / "meta" / "metadata.json", data_dir.parent / "meta" / "metadata.json"):
        if path.is_file():
            document: dict[str, Any] = json.loads(path.read_bytes())
            return {
                int(q["queue_id"]): QueueName(str(q.get("vhost", "/")), str(q["name"]))
                for q in document.get("queues", [])
            }
    return {}


class _Pause(Exception):
    """Raised by the visitor to hand a batch back to the caller (scan resumes after it)."""


def read_segment(
    commit_log: CommitLog, segment_start: int, batch_records: int = 4096
) -> Iterator[list[LogRecord]]:
    """The message records of one segment, in batches, up to the end of its valid data."""
    segment_end = segment_start + commit_log.segment_size
    position = segment_start
    while position < segment_end:
        batch, position = _scan_batch(commit_log, position, segment_end, batch_records)
        if batch:
            yield batch


def _scan_batch(
    commit_log: CommitLog, position: int, segment_end: int, batch_records: int
) -> tuple[list[LogRecord], int]:
    """Up to ``batch_records`` records from ``position``, and where the next batch starts
    (``segment_end`` once this segment's valid data is done)."""
    batch: list[LogRecord] = []
    resume = [segment_end]

    def visit(commit: int, buf: bytes, pos: int, size: int) -> None:
        if commit >= segment_end:  # the scan went on into the next segment
            resume[0] = segment_end
            raise _Pause
        resume[0] = commit + size
        record = _decode(commit, buf, pos)
        if record is not None:
            batch.append(record)
        if len(batch) >= batch_records:
            raise _Pause

    try:
        commit_log.scan(position, visit)
        return batch, segment_end  # the data ended (or stopped being valid) in this segment
    except _Pause:
        return batch, resume[0]


def _decode(commit: int, buf: bytes, pos: int) -> LogRecord | None:
    """A message record's fields; None for a collector's copy or a timer record."""
    fields = HEADER.unpack_from(buf, pos)
    destinations = decode_destinations(buf, pos)
    if fields[1] == COPY_MAGIC or all(q == TIMER_QUEUE_ID for q, _ in destinations):
        return None
    start = pos + HEADER_SIZE + len(destinations) * DEST_SIZE
    exchange_end = start + fields[8]
    key_end = exchange_end + fields[9]
    props_end = key_end + fields[10]
    return LogRecord(
        offset=commit,
        magic=fields[1],
        born_ts_ms=fields[4],
        store_ts_ms=fields[5],
        flags=fields[6],
        destinations=destinations,
        exchange=bytes(buf[start:exchange_end]),
        routing_key=bytes(buf[exchange_end:key_end]),
        properties=bytes(buf[key_end:props_end]),
        body=bytes(buf[props_end : props_end + fields[11]]),
    )


def segment_starts(commit_log: CommitLog, from_ms: int | None = None) -> list[int]:
    """The segments to read; a sealed segment whose last record is older than ``from_ms``
    is left out without reading it (its filler carries that record's store time)."""
    starts = []
    for segment in commit_log.files.segments:
        sealed_ts = commit_log.sealed_ts_ms.get(segment.start)
        if from_ms is not None and sealed_ts is not None and sealed_ts < from_ms:
            continue
        starts.append(segment.start)
    return starts
