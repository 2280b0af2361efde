"""`mqgw replay capture`: record a vhost's publishes from the firehose into Parquet.

Switches tracing on for the vhost (management API ``PUT /api/vhosts/VHOST`` with
``{"tracing": true}``, the call RabbitMQ and mqgw's admin API both take), binds an exclusive
queue to ``amq.rabbitmq.trace`` with ``publish.#`` and writes each traced publish as a row
of the capture columns (replay.schema) to ``DIR/part-NNNNN.parquet`` (whole files, renamed
into place). Tracing is switched off again at the end, on Ctrl-C and on any error. The
firehose carries no publish time: a row's ``ts_ms`` is when the capture received it.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pyarrow as pa
import pyarrow.parquet as pq

from replay.amqp_props import as_row, decode, from_firehose_table
from replay.schema import CAPTURE_ARROW, empty_row

_FLUSH_ROWS = 10_000
_FLUSH_S = 1.0


@dataclass
class CaptureOptions:
    source: str  # amqp://user:pw@host:port/vhost
    out: Path
    management: str | None = None  # default: http://HOST:15672
    duration_s: float | None = None
    count: int | None = None


def management_call(
    base: str, method: str, path: str, body: object, user: str, password: str
) -> int:
    request = urllib.request.Request(
        base.rstrip("/") + path,
        method=method,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        reason = error.read().decode("utf-8", "replace")
        raise RuntimeError(f"{method} {path}: HTTP {error.code} {reason}") from None


def set_tracing(options: CaptureOptions, on: bool) -> None:
    parameters = pika.URLParameters(options.source)
    base = options.management or f"http://{parameters.host}:15672"
    vhost = urllib.parse.quote(parameters.virtual_host, safe="")
    credentials = parameters.credentials
    management_call(
        base,
        "PUT",
        f"/api/vhosts/{vhost}",
        {"tracing": on},
        credentials.username,
        credentials.password,
    )


def firehose_row(
    seq: int, received_ms: int, headers: dict[str, Any], body: bytes
) -> dict[str, Any]:
    """The capture row of one traced publish (``error`` set when its headers are unusable)."""
    row = empty_row()
    row.update(capture_id=str(seq), seq=seq, line=seq, ts_ms=received_ms)
    try:
        keys = [_text(k) for k in headers["routing_keys"]]
        routed = headers.get("routed_queues")
        raw = from_firehose_table(headers.get("properties") or {})
        channel = headers.get("channel")
        row.update(
            vhost=_text(headers.get("vhost", "/")),
            connection=_text(headers.get("connection", "")),
            channel=int(channel) if isinstance(channel, int) else None,
            exchange=_text(headers["exchange_name"]),
            routing_key=keys[0] if keys else "",
            routing_keys=keys,
            routed_queues=[_text(q) for q in routed] if isinstance(routed, list) else None,
            properties=as_row(decode(raw)),
            properties_raw=raw,
            body=body,
        )
    except (KeyError, TypeError, ValueError, AssertionError) as error:
        row["error"] = f"unusable firehose headers: {error!r}"
    return row


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class PartWriter:
    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.rows: list[dict[str, Any]] = []
        self.parts = len(list(out.glob("part-*.parquet")))
        self.written = 0
        self.errors = 0
        self.last_flush = time.monotonic()

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.errors += row["error"] is not None
        if len(self.rows) >= _FLUSH_ROWS or time.monotonic() - self.last_flush >= _FLUSH_S:
            self.flush()

    def flush(self) -> None:
        self.last_flush = time.monotonic()
        if not self.rows:
            return
        final = self.out / f"part-{self.parts:05d}.parquet"
        temporary = self.out / f".{final.name}.tmp"
        pq.write_table(pa.Table.from_pylist(self.rows, schema=CAPTURE_ARROW), temporary)
        temporary.replace(final)
        self.parts += 1
        self.written += len(self.rows)
        self.rows = []


def _last_seq(out: Path) -> int:
    parts = sorted(out.glob("part-*.parquet")) if out.is_dir() else []
    if not parts:
        return 0
    seqs = [s for p in parts for s in pq.read_table(p, columns=["seq"]).column("seq").to_pylist()]
    return max((s for s in seqs if s is not None), default=0)


def capture(options: CaptureOptions, progress_s: float = 1.0) -> PartWriter:
    """Record until ``duration_s``, ``count`` or Ctrl-C; tracing is off again afterwards."""
    connection = pika.BlockingConnection(pika.URLParameters(options.source))
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
    channel.queue_bind(queue, "amq.rabbitmq.trace", "publish.#")
    writer = PartWriter(options.out)
    seq = _last_seq(options.out)  # capturing into a directory again: ids stay unique
    received = 0

    def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
        nonlocal seq, received
        seq += 1
        received += 1
        now_ms = time.time_ns() // 1_000_000
        writer.add(firehose_row(seq, now_ms, dict(properties.headers or {}), body))

    channel.basic_consume(queue, on_message, auto_ack=True)
    started = last_line = time.monotonic()
    set_tracing(options, True)
    try:
        while True:
            connection.process_data_events(time_limit=0.2)
            now = time.monotonic()
            if now - last_line >= progress_s:
                last_line = now
                print(
                    f"capture: {received} publishes recorded, {writer.errors} unusable, "
                    f"{now - started:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            if options.duration_s is not None and now - started >= options.duration_s:
                break
            if options.count is not None and received >= options.count:
                break
    finally:
        try:
            set_tracing(options, False)
            if connection.is_open:  # what was traced before "off" may still be on its way
                connection.process_data_events(time_limit=0.5)
        finally:
            writer.flush()
            if connection.is_open:
                connection.close()
    return writer
