"""Read mqgw's commitlog without opening the store: safe next to a running node.

Uses the storage package's own pieces: ``find_store_dir`` and the layout (segment size), a
``CommitLog`` over a read-only FileSystem, ``CommitLog.scan`` (which validates magic, size,
offset and CRC, and stops at the end of the valid data: a record the node is still writing
ends the scan, it is never half read), and the record header and destination decoders. No
lock is taken and nothing is written, so a node may keep appending meanwhile; a scan sees
the segments' lengths as they were when ``open_commit_log`` looked.

Records the garbage collector copied forward (COPY_MAGIC) are relocations of messages read
earlier, not new publishes: skipped. So are the delay/redelivery timer's internal records.

A target is one log (an embedded node's data dir) or a `mqgw cluster` dir: one log per broker
group, read from one member (the master where cluster.json names one: a slave holds the same
bytes up to its end). Queue ids name queues through a mapping the caller may give: the
embedded node's meta/metadata.json, or a cluster's metadata on Redis (ids are cluster-wide).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.features.log_timer import TIMER_QUEUE_ID
from localcluster.layout import load
from meta.redis_store import RedisMetadataStore
from storage.log.check import find_store_dir, record_limit
from storage.log.commit_log import CommitLog
from storage.log.file_system import FileSystem
from storage.log.opening import read_layout
from storage.record import COPY_MAGIC, DEST_SIZE, HEADER, HEADER_SIZE, decode_destinations


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


QueueNames = Mapping[int, QueueName]
CLUSTER_FILE = "cluster.json"  # localcluster/layout.py's STATE_FILE: what marks a cluster dir
_REDIS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class LogStore:
    """One commitlog: an embedded node's data dir (``group`` None) or a broker group's."""

    path: Path
    group: str | None = None


def is_cluster_dir(path: Path) -> bool:
    return (path / CLUSTER_FILE).is_file()


def log_stores(path: Path) -> list[LogStore]:
    """The logs of a target: ``path`` itself, or one member of each broker group of a cluster
    dir (its master if cluster.json names one that has a store, else any member that has)."""
    if not is_cluster_dir(path):
        return [LogStore(path)]
    members: dict[str, list[tuple[bool, Path]]] = {}
    for broker in load(path).brokers:
        data_dir = Path(broker.data_dir)
        if (data_dir / "store" / "layout.json").is_file():
            members.setdefault(broker.group, []).append((broker.role != "master", data_dir))
    if not members:
        raise FileNotFoundError(f"{path}: no broker of this cluster has a store yet")
    return [LogStore(min(found)[1], group) for group, found in sorted(members.items())]


def target_queue_names(path: Path) -> dict[int, QueueName]:
    """Queue id -> name for a target: a cluster's from Redis, an embedded node's from its file."""
    if not is_cluster_dir(path):
        return queue_names(path)
    return redis_queue_names(load(path).meta_url)


def redis_queue_names(meta_url: str) -> dict[int, QueueName]:
    """Queue id -> (vhost, name) of every queue in the metadata on Redis (read only)."""

    async def read() -> dict[int, QueueName]:
        store = RedisMetadataStore(
            meta_url, default_user=False, unavailable_timeout_s=_REDIS_TIMEOUT_S
        )
        try:
            names: dict[int, QueueName] = {}
            for vhost in await store.list_vhosts():
                for queue in await store.list_queues(vhost.name):
                    names[queue.queue_id] = QueueName(vhost.name, queue.name)
            return names
        finally:
            await store.close()

    return asyncio.run(read())


def names_to_json(names: QueueNames) -> str:
    """The mapping as a data source option (``names``): {"id": [vhost, name]}."""
    return json.dumps({str(k): [v.vhost, v.name] for k, v in names.items()})


def names_from_json(text: str) -> dict[int, QueueName]:
    return {int(k): QueueName(str(v[0]), str(v[1])) for k, v in json.loads(text).items()}


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
