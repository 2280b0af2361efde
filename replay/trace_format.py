"""The rabbitmq_tracing plugin's JSON log, read exactly as the plugin writes it.

One JSON object per line, keys sorted by the plugin, e.g. (RabbitMQ 3.10):

    {"channel":1,"connection":"127.0.0.1:43988 -> 127.0.0.1:40505","exchange":"x",
     "node":"rabbit@host","payload":"AAH/aGVsbG8=","properties":{"delivery_mode":2,
     "headers":{"seq":1}},"queue":"none","routed_queues":["q1"],"routing_keys":["rk"],
     "timestamp":"2026-11-24T01:24:21.428+00:00","type":"published","user":"guest","vhost":"/"}

``type`` "published" is a publish (what a replay sends); "received" is a delivery to a
consumer (skipped). A line that cannot be read becomes an error row with its line number.
The last line may be cut short while the plugin is still writing: reported as such, never a
crash. Large files are split at line boundaries into ranges read in parallel.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from replay.amqp_props import as_row, decode, from_trace_json
from replay.schema import empty_row

RANGE_BYTES = 64 << 20  # a partition of a large trace file
_REQUIRED = ("type", "timestamp", "exchange", "routing_keys", "payload")


@dataclass(frozen=True)
class LineRange:
    """Bytes [start, end) of ``path``, beginning with line number ``first_line`` (1-based)."""

    path: str
    file_index: int
    start: int
    end: int
    first_line: int


def trace_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    raise FileNotFoundError(f"{path}: no such capture file or directory")


def split_ranges(files: list[Path], range_bytes: int = RANGE_BYTES) -> list[LineRange]:
    """Cut each file at the first newline after every ``range_bytes``, counting lines so
    that every range knows the number of its first line."""
    ranges: list[LineRange] = []
    for index, path in enumerate(files):
        size = path.stat().st_size
        start, line = 0, 1
        with path.open("rb") as handle:
            while start < size:
                end = _line_end_after(handle, start + range_bytes, size)
                ranges.append(LineRange(str(path), index, start, end, line))
                line += _count_newlines(handle, start, end)
                start = end
    return ranges


def _line_end_after(handle: BinaryIO, at: int, size: int) -> int:
    """The offset just past the first newline at or after ``at`` (``size`` if none)."""
    if at >= size:
        return size
    handle.seek(at)
    pos = at
    while chunk := handle.read(1 << 16):
        found = chunk.find(b"\n")
        if found >= 0:
            return pos + found + 1
        pos += len(chunk)
    return size


def _count_newlines(handle: BinaryIO, start: int, end: int) -> int:
    handle.seek(start)
    count, left = 0, end - start
    while left > 0:
        chunk = handle.read(min(left, 8 << 20))
        if not chunk:
            break
        count += chunk.count(b"\n")
        left -= len(chunk)
    return count


def parse_timestamp(text: str) -> int:
    """The plugin's ISO 8601 time (ms, with offset) as ms since the epoch."""
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def parse_line(text: bytes) -> dict[str, Any] | None:
    """The capture row of one line, or None for a line that is not a publish.

    Raises ValueError with a short reason for a line that cannot be read."""
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    missing = [key for key in _REQUIRED if key not in document]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    if document["type"] != "published":
        return None
    keys = document["routing_keys"]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError("routing_keys is not a list of strings")
    try:
        body = base64.b64decode(document["payload"], validate=True)
        raw = from_trace_json(document.get("properties") or {})
        ts_ms = parse_timestamp(str(document["timestamp"]))
    except (binascii.Error, ValueError, TypeError, AssertionError) as error:
        raise ValueError(f"unreadable field: {error}") from None
    routed = document.get("routed_queues")
    channel = document.get("channel")
    row = empty_row()
    row.update(
        ts_ms=ts_ms,
        vhost=str(document.get("vhost", "/")),
        connection=str(document.get("connection", "")),
        channel=int(channel) if isinstance(channel, int) else None,
        exchange=str(document["exchange"]),
        routing_key=keys[0] if keys else "",
        routing_keys=keys,
        routed_queues=[str(q) for q in routed] if isinstance(routed, list) else None,
        properties=as_row(decode(raw)),
        properties_raw=raw,
        body=body,
    )
    return row


def read_range(part: LineRange) -> Iterator[dict[str, Any]]:
    """Rows of one range: publishes, and an error row for each line that cannot be read."""
    name = Path(part.path).name
    with open(part.path, "rb") as handle:
        handle.seek(part.start)
        data = handle.read(part.end - part.start)
    lines = data.split(b"\n")
    ends_open = not data.endswith(b"\n")
    if not ends_open:
        lines.pop()  # the empty string after the final newline
    for index, text in enumerate(lines):
        number = part.first_line + index
        if not text.strip():
            continue
        try:
            row = parse_line(text)
        except ValueError as error:
            last = ends_open and index == len(lines) - 1
            reason = "truncated last line (still being written?)" if last else str(error)
            row = empty_row()
            row["error"] = reason
        if row is None:
            continue
        row.update(
            capture_id=f"{name}:{number}",
            seq=(part.file_index << 40) | number,
            line=number,
            source_file=part.path,
        )
        yield row
