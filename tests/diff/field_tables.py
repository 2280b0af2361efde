"""AMQP field tables with explicit wire types, for what client libraries cannot send.

pika, pamqp and aiormq each pick a wire type for a Python value (pamqp: the smallest integer
type, 'f' for floats); these helpers write exactly the type a test names, nested tables and
arrays included: ``W("l", 1)``, ``W("F", {"k": W("b", 1)})``, ``W("A", [W("d", 1.0)])``.
"""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

_FIXED = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q",
          "f": ">f", "d": ">d", "T": ">Q"}  # fmt: skip


@dataclass(frozen=True)
class W:
    """A value with its wire type code."""

    code: str
    value: Any


def encode_value(item: W) -> bytes:
    code, value = item.code, item.value
    head = code.encode()
    if code in _FIXED:
        if code == "T" and isinstance(value, dt.datetime):
            value = int(value.timestamp())
        return head + struct.pack(_FIXED[code], value)
    if code == "t":
        return head + bytes((1 if value else 0,))
    if code == "V":
        return head
    if code == "D":
        sign, digits, exponent = Decimal(value).as_tuple()
        unscaled = int("".join(map(str, digits))) * (-1 if sign else 1)
        assert isinstance(exponent, int)
        return head + struct.pack(">BI", -exponent, unscaled & 0xFFFFFFFF)
    if code in ("S", "x"):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return head + struct.pack(">I", len(raw)) + raw
    if code == "F":
        body = encode_table(value)
        return head + body
    if code == "A":
        body = b"".join(encode_value(v) for v in value)
        return head + struct.pack(">I", len(body)) + body
    raise ValueError(f"unknown field type {code!r}")


def encode_table(table: dict[str, W]) -> bytes:
    """A field table (with its u32 length prefix), entries in the given order."""
    body = b""
    for key, item in table.items():
        raw_key = key.encode()
        body += bytes((len(raw_key),)) + raw_key + encode_value(item)
    return struct.pack(">I", len(body)) + body


def properties_with_headers(headers: dict[str, W]) -> bytes:
    """Basic properties (flags + list) carrying only ``headers``, typed as given."""
    return struct.pack(">H", 0x2000) + encode_table(headers)


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes((len(raw),)) + raw


def queue_bind_payload(queue: str, exchange: str, key: str, arguments: dict[str, W]) -> bytes:
    """A queue.bind method frame's payload with typed arguments."""
    return (
        struct.pack(">HHH", 50, 20, 0)
        + _shortstr(queue)
        + _shortstr(exchange)
        + _shortstr(key)
        + b"\x00"  # nowait off
        + encode_table(arguments)
    )
