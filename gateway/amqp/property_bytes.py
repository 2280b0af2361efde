"""Edit raw content-header property bytes without a decode/encode round trip.

Messages are stored with the property bytes the client sent. When the broker itself must
change a message (dead-lettering writes ``x-death``, drops ``expiration``; a redelivery counts
``x-delivery-count``) it edits those bytes field by field, so every header it does not touch
keeps its exact wire type (a Java client reading a ``long`` gets a long back, not a byte).
Sans-IO and pure: bytes in, bytes out.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from gateway.amqp.errors import truncate_shortstr

# Property flag bits, in wire order (AMQP 0-9-1 basic class).
CONTENT_TYPE = 0x8000
CONTENT_ENCODING = 0x4000
HEADERS = 0x2000
DELIVERY_MODE = 0x1000
PRIORITY = 0x0800
CORRELATION_ID = 0x0400
REPLY_TO = 0x0200
EXPIRATION = 0x0100
MESSAGE_ID = 0x0080
TIMESTAMP = 0x0040
TYPE = 0x0020
USER_ID = 0x0010
APP_ID = 0x0008
CLUSTER_ID = 0x0004

_ORDER = (
    (CONTENT_TYPE, "s"),
    (CONTENT_ENCODING, "s"),
    (HEADERS, "F"),
    (DELIVERY_MODE, "o"),
    (PRIORITY, "o"),
    (CORRELATION_ID, "s"),
    (REPLY_TO, "s"),
    (EXPIRATION, "s"),
    (MESSAGE_ID, "s"),
    (TIMESTAMP, "T"),
    (TYPE, "s"),
    (USER_ID, "s"),
    (APP_ID, "s"),
    (CLUSTER_ID, "s"),
)

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

# Fixed value sizes of field-table types (RabbitMQ's dialect of 0-9-1 tags).
MAX_DATETIME_S = 253_402_300_799  # 9999-12-31T23:59:59Z, the last second a datetime holds
_FIXED = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "l": 8, "L": 8, "f": 4}
_FIXED.update({"d": 8, "D": 5, "T": 8, "V": 0})


class PropertyError(ValueError):
    """The bytes are not a well-formed property list."""


def split_properties(data: bytes | memoryview) -> dict[int, bytes]:
    """Flag bit -> the field's raw wire bytes (length prefix included)."""
    raw = bytes(data)
    if len(raw) < 2:
        return {}
    flags = _U16.unpack_from(raw)[0]
    if flags & 1:
        raise PropertyError("property flag continuation is not supported")
    fields: dict[int, bytes] = {}
    pos = 2
    try:
        for bit, kind in _ORDER:
            if not flags & bit:
                continue
            if kind == "s":
                end = pos + 1 + raw[pos]
            elif kind == "F":
                end = pos + 4 + _U32.unpack_from(raw, pos)[0]
            elif kind == "o":
                end = pos + 1
            else:
                end = pos + 8
            if end > len(raw):
                raise PropertyError("property list is truncated")
            fields[bit] = raw[pos:end]
            pos = end
    except (IndexError, struct.error) as error:
        raise PropertyError("property list is truncated") from error
    return fields


def join_properties(fields: dict[int, bytes]) -> bytes:
    flags = 0
    parts = []
    for bit, _ in _ORDER:
        value = fields.get(bit)
        if value is not None:
            flags |= bit
            parts.append(value)
    return _U16.pack(flags) + b"".join(parts)


def shortstr_value(raw: bytes | None) -> str | None:
    return None if raw is None else raw[1:].decode("utf-8", "replace")


def shortstr(value: str) -> bytes:
    data = value.encode()
    return bytes((len(data),)) + data


# -- field tables --------------------------------------------------------------------------


def _value_end(data: bytes, pos: int, tag: str) -> int:
    size = _FIXED.get(tag)
    if size is not None:
        return pos + size
    if tag in "SxFA":
        return pos + 4 + int(_U32.unpack_from(data, pos)[0])
    raise PropertyError(f"unknown field type {tag!r}")


def split_table(raw: bytes) -> list[tuple[str, str, bytes]]:
    """A table's wire bytes (u32 length prefix included) -> (key, tag, raw value) in order."""
    end = 4 + _U32.unpack_from(raw)[0]
    entries = []
    pos = 4
    while pos < end:
        key_len = raw[pos]
        key = raw[pos + 1 : pos + 1 + key_len].decode("utf-8", "replace")
        pos += 1 + key_len
        tag = chr(raw[pos])
        value_end = _value_end(raw, pos + 1, tag)
        entries.append((key, tag, raw[pos + 1 : value_end]))
        pos = value_end
    return entries


def join_table(entries: Iterable[tuple[str, str, bytes]]) -> bytes:
    body = b"".join(shortstr(key) + tag.encode() + value for key, tag, value in entries)
    return _U32.pack(len(body)) + body


def split_array(raw: bytes) -> list[tuple[str, bytes]]:
    """An array's raw value (u32 length prefix included) -> (tag, raw value) items."""
    end = 4 + _U32.unpack_from(raw)[0]
    items = []
    pos = 4
    while pos < end:
        tag = chr(raw[pos])
        value_end = _value_end(raw, pos + 1, tag)
        items.append((tag, raw[pos + 1 : value_end]))
        pos = value_end
    return items


def join_array(items: Iterable[tuple[str, bytes]]) -> bytes:
    body = b"".join(tag.encode() + value for tag, value in items)
    return _U32.pack(len(body)) + body


def longstr(value: str) -> bytes:
    data = value.encode()
    return _U32.pack(len(data)) + data


def long(value: int) -> bytes:
    return struct.pack(">q", value)


def timestamp(seconds: int) -> bytes:
    return struct.pack(">Q", seconds)


def decode_scalar(tag: str, raw: bytes) -> Any:
    """The few scalar types the broker reads back from its own headers."""
    if tag == "S":
        return raw[4:].decode("utf-8", "replace")
    if tag in "bBsuIiLlT":
        signed = tag in "bsIl"
        return int.from_bytes(raw, "big", signed=signed)
    return None


def set_header(properties: bytes | memoryview, key: str, tag: str, raw: bytes | None) -> bytes:
    """The property bytes with header ``key`` replaced (added last), or removed if raw is None."""
    fields = split_properties(properties)
    table = fields.get(HEADERS)
    headers = [] if table is None else [h for h in split_table(table) if h[0] != key]
    if raw is not None:
        headers.append((key, tag, raw))
    if headers or table is not None:
        fields[HEADERS] = join_table(headers)
    return join_properties(fields)


# -- a strict decoder's copy -----------------------------------------------------------------


def readable(properties: bytes) -> bytes:
    """Property bytes RabbitMQ decodes (publish_cut.properties_well_formed) rewritten for a
    strict decoder (pamqp): every shortstr, a property or a table key, made UTF-8 (bad bytes
    replaced, cut to 255 bytes) and the two low flag bits cleared. RabbitMQ stores and
    delivers such bytes verbatim, and so does the gateway: only its reading uses this copy."""
    flags = _U16.unpack_from(properties)[0] & 0xFFFC
    fields = split_properties(_U16.pack(flags) + properties[2:])
    stamp = fields.get(TIMESTAMP)
    if stamp is not None and int.from_bytes(stamp, "big") > MAX_DATETIME_S:
        del fields[TIMESTAMP]  # read as absent (timestamp_of has it); sent and kept as it is
    for bit, kind in _ORDER:
        raw = fields.get(bit)
        if raw is not None and kind == "s":
            fields[bit] = _readable_shortstr(raw[1:].decode("utf-8", "replace"))
        elif raw is not None and kind == "F":
            fields[bit] = _readable_table(raw)
    return join_properties(fields)


def _readable_shortstr(text: str) -> bytes:
    data = truncate_shortstr(text).encode()
    return bytes((len(data),)) + data


def _readable_table(raw: bytes) -> bytes:
    body = b"".join(
        _readable_shortstr(key) + _readable_item(tag, value)
        for key, tag, value in split_table(raw)  # keys decoded with replacement
    )
    return _U32.pack(len(body)) + body


def _readable_item(tag: str, value: bytes) -> bytes:
    """Tag and value; a timestamp beyond a datetime's range is read as the 64-bit integer
    it is (signed, as a long long)."""
    if tag == "F":
        return b"F" + _readable_table(value)
    if tag == "A":
        items = b"".join(_readable_item(t, v) for t, v in split_array(value))
        return b"A" + _U32.pack(len(items)) + items
    if tag == "T" and int.from_bytes(value, "big") > MAX_DATETIME_S:
        return b"l" + value
    return tag.encode() + value


def timestamp_of(properties: bytes | memoryview) -> int | None:
    """The timestamp property as the 64-bit unsigned integer AMQP says it is (None: absent)."""
    raw = split_properties(properties).get(TIMESTAMP)
    return None if raw is None else int.from_bytes(raw, "big")


def keep_timestamp(original: bytes | memoryview, encoded: bytes) -> bytes:
    """``encoded`` (properties decoded from ``original`` and encoded again) with the original
    timestamp bytes: a decoder reads one beyond a datetime's range as absent."""
    raw = split_properties(original).get(TIMESTAMP)
    if raw is None:
        return encoded
    fields = split_properties(encoded)
    fields[TIMESTAMP] = raw
    return join_properties(fields)
