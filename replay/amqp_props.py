"""AMQP basic properties as the replay pipeline carries them: raw bytes, decoded views.

Every source hands the pipeline the properties as raw content-header property bytes (flags +
property list, the form mqgw's log stores and pika encodes), so a replay sends exactly what was
captured. The provenance header is spliced into those bytes (``stamp``) instead of decoding and
re-encoding them: every other byte stays as captured, field types included.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import struct
from collections.abc import Mapping
from typing import Any

import pika.data
import pika.exceptions
import pika.spec

REPLAY_HEADER = "x-mqgw-replay"

FLAG_CONTENT_TYPE = 0x8000
FLAG_CONTENT_ENCODING = 0x4000
FLAG_HEADERS = 0x2000

# The decoded properties every source exposes, in a Spark struct (headers as canonical JSON).
PROPERTY_FIELDS: tuple[tuple[str, str], ...] = (
    ("content_type", "string"),
    ("content_encoding", "string"),
    ("headers", "string"),
    ("delivery_mode", "int"),
    ("priority", "int"),
    ("correlation_id", "string"),
    ("reply_to", "string"),
    ("expiration", "string"),
    ("message_id", "string"),
    ("timestamp", "long"),
    ("type", "string"),
    ("user_id", "string"),
    ("app_id", "string"),
    ("cluster_id", "string"),
)
PROPERTIES_DDL = "struct<" + ", ".join(f"{n}: {t}" for n, t in PROPERTY_FIELDS) + ">"


class RawProperties(pika.spec.BasicProperties):  # type: ignore[misc]
    """Properties pika sends as the given bytes (pika's frame writer only calls encode())."""

    def __init__(self, raw: bytes) -> None:
        super().__init__()
        self._raw = raw

    def encode(self) -> list[bytes]:
        return [self._raw]


def decode(raw: bytes) -> pika.spec.BasicProperties:
    """Raw property bytes -> pika's BasicProperties (raises on malformed bytes)."""
    properties = pika.spec.BasicProperties()
    properties.decode(raw, 0)
    return properties


def encode(properties: pika.spec.BasicProperties) -> bytes:
    return b"".join(p if isinstance(p, bytes) else p.encode("utf-8") for p in properties.encode())


def json_value(value: Any) -> Any:
    """A field-table value as JSON: bytes that are not UTF-8 become {"base64": ...}."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, datetime.datetime):
        return int(value.replace(tzinfo=datetime.UTC).timestamp())
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def canonical_json(value: Any) -> str:
    return json.dumps(json_value(value), sort_keys=True, separators=(",", ":"))


def as_row(properties: pika.spec.BasicProperties) -> dict[str, Any]:
    """The decoded struct (PROPERTY_FIELDS) of ``properties``."""
    row: dict[str, Any] = {}
    for name, _ in PROPERTY_FIELDS:
        value = getattr(properties, name, None)
        if name == "headers":
            value = None if value is None else canonical_json(value)
        elif name == "timestamp" and isinstance(value, datetime.datetime):
            value = int(value.replace(tzinfo=datetime.UTC).timestamp())
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        row[name] = value
    return row


def without_replay_header(raw: bytes) -> dict[str, Any]:
    """Decoded properties minus the provenance header: what reconcile compares."""
    properties = decode(raw)
    row = as_row(properties)
    headers = dict(properties.headers or {})
    headers.pop(REPLAY_HEADER, None)
    row["headers"] = canonical_json(headers) if headers else None
    return row


def from_trace_json(document: Mapping[str, Any]) -> bytes:
    """Raw property bytes from the rabbitmq_tracing plugin's JSON ``properties`` object.

    The plugin writes header values as plain JSON, so AMQP field types narrower than pika's
    choice (e.g. a short int) come back as pika encodes them; values are unchanged.
    """
    known = {name for name, _ in PROPERTY_FIELDS}
    unknown = set(document) - known
    if unknown:
        raise ValueError(f"unknown properties {sorted(unknown)}")
    properties = pika.spec.BasicProperties(**dict(document))
    try:
        return encode(properties)
    except pika.exceptions.UnsupportedAMQPFieldException as error:
        # pika has no encoding for floats in tables: such a message cannot be re-sent as is.
        raise ValueError(f"a header value pika cannot encode: {error.args[-1]!r}") from None


def from_firehose_table(table: Mapping[str, Any]) -> bytes:
    """Raw property bytes from a firehose message's ``properties`` header (a field table)."""
    values = {
        k: (v.decode("utf-8") if isinstance(v, bytes) and k != "headers" else v)
        for k, v in table.items()
    }
    return from_trace_json(values)


def _skip_short_string(raw: bytes, pos: int) -> int:
    return pos + 1 + raw[pos]


def stamp(raw: bytes, provenance: Mapping[str, Any]) -> bytes:
    """``raw`` with the ``x-mqgw-replay`` header added; every other byte kept as it was."""
    entry_pieces: list[bytes] = []
    pika.data.encode_table(entry_pieces, {REPLAY_HEADER: dict(provenance)})
    entry = b"".join(entry_pieces)[4:]  # the table's entries without its length prefix
    (flags,) = struct.unpack_from(">H", raw, 0)
    if flags & 0x0001:
        raise ValueError("continued property flags are not AMQP 0-9-1 basic properties")
    pos = 2
    if flags & FLAG_CONTENT_TYPE:
        pos = _skip_short_string(raw, pos)
    if flags & FLAG_CONTENT_ENCODING:
        pos = _skip_short_string(raw, pos)
    if flags & FLAG_HEADERS:
        (length,) = struct.unpack_from(">I", raw, pos)
        table_end = pos + 4 + length
        new_length = struct.pack(">I", length + len(entry))
        return raw[:pos] + new_length + raw[pos + 4 : table_end] + entry + raw[table_end:]
    head = struct.pack(">H", flags | FLAG_HEADERS) + raw[2:pos]
    return head + struct.pack(">I", len(entry)) + entry + raw[pos:]


def provenance_of(raw: bytes) -> dict[str, Any] | None:
    """The ``x-mqgw-replay`` table of a stamped message, or None."""
    headers = decode(raw).headers or {}
    value = headers.get(REPLAY_HEADER)
    return dict(json_value(value)) if isinstance(value, dict) else None
