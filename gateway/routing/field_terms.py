"""Field-table values as RabbitMQ 3.10's headers exchange compares them.

rabbit_exchange_type_headers:headers_match/5 (3.10.8) compares a binding value with a
header value by Erlang ``==`` on the values alone, whatever their wire types: long 1 matches
double 1.0 and timestamp 5 matches long 5, but ``true`` is not 1, a decimal is a
``{Scale, Unscaled}`` tuple that equals no number, and longstr "a" equals binary "a". A
table or an array is compared whole, as the list rabbit_binary_parser decoded: entries in
wire order with their type atoms, so inside them a long 1 is not a byte 1 (nor a double 1.0),
and an empty table equals an empty array. tests/diff/test_diff_headers.py checks each rule.

pamqp's decoding drops wire types, so nested values are read again from the wire bytes
(``parse_value``); values known only as Python objects (definitions, the admin API) get
the types RabbitMQ's JSON import gives them (int: long, float: double).
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from meta.amqp_values import decimal_parts, infer_type, timestamp_seconds

Term = tuple[Any, ...]

# rabbit_binary_parser's type atoms by wire code.
TYPE_NAMES = {
    "t": "bool", "b": "byte", "B": "unsignedbyte", "s": "short", "u": "unsignedshort",
    "I": "signedint", "i": "unsignedint", "l": "long", "f": "float", "d": "double",
    "D": "decimal", "S": "longstr", "x": "binary", "T": "timestamp", "F": "table",
    "A": "array", "V": "void",
}  # fmt: skip
_NUMBERS = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q",
            "f": ">f", "d": ">d", "T": ">Q"}  # fmt: skip
_U32 = struct.Struct(">I")
_DECIMAL = struct.Struct(">BI")
TRUE, FALSE, UNDEFINED = ("atom", "true"), ("atom", "false"), ("atom", "undefined")

Buffer = bytes | bytearray | memoryview


def wire_term(data: Buffer) -> Term:
    """The term of one field value as sent (its type code first); ValueError if it does
    not parse."""
    try:
        term, end = _parse_value(data, 0)
    except (struct.error, IndexError, KeyError) as error:
        raise ValueError(f"bad field value: {error}") from None
    if end != len(data):
        raise ValueError("bytes after the field value")
    return term


def _parse_value(data: Buffer, pos: int) -> tuple[Term, int]:
    """The value at ``data[pos]`` (its type code first) as a term; and where it ends."""
    code = chr(data[pos])
    pos += 1
    fmt = _NUMBERS.get(code)
    if fmt is not None:
        size = struct.calcsize(fmt)
        return _number(struct.unpack_from(fmt, data, pos)[0]), pos + size
    if code == "t":
        return (TRUE if data[pos] else FALSE), pos + 1
    if code == "V":
        return UNDEFINED, pos
    if code == "D":
        scale, unscaled = _DECIMAL.unpack_from(data, pos)
        return ("decimal", scale, unscaled), pos + _DECIMAL.size
    if code in ("S", "x"):
        end = pos + 4 + _U32.unpack_from(data, pos)[0]
        return ("bin", bytes(data[pos + 4 : end])), end
    if code == "F":
        entries, end = _table_entries(data, pos)
        return _list(tuple((key, TYPE_NAMES[c], term) for key, c, term in entries)), end
    if code == "A":
        end = pos + 4 + _U32.unpack_from(data, pos)[0]
        pos += 4
        items = []
        while pos < end:
            item_code = chr(data[pos])
            term, pos = _parse_value(data, pos)
            items.append((TYPE_NAMES[item_code], term))
        return _list(tuple(items)), end
    raise ValueError(f"unknown field type {code!r}")


def _table_entries(data: Buffer, pos: int) -> tuple[list[tuple[bytes, str, Term]], int]:
    """(key, type code, term) per entry of the table at ``pos`` (its u32 length first)."""
    end = pos + 4 + _U32.unpack_from(data, pos)[0]
    pos += 4
    entries = []
    while pos < end:
        size = data[pos]
        key = bytes(data[pos + 1 : pos + 1 + size])
        pos += 1 + size
        code = chr(data[pos])
        term, pos = _parse_value(data, pos)
        entries.append((key, code, term))
    if pos != end:
        raise ValueError("field table overruns its length")
    return entries, end


def table_terms(data: Buffer, pos: int = 0) -> dict[str, Term]:
    """A whole field table (from its u32 length): key -> term. A repeated key keeps its
    first value, the one RabbitMQ's sorted walk meets. ValueError if it does not parse."""
    try:
        entries = _table_entries(data, pos)[0]
    except (struct.error, IndexError, KeyError) as error:
        raise ValueError(f"bad field table: {error}") from None
    terms: dict[str, Term] = {}
    for key, _code, term in entries:
        terms.setdefault(key.decode("utf-8", "surrogateescape"), term)
    return terms


def _number(value: float) -> Term:
    # One class for every integer width, floats and timestamps: Erlang's == compares values.
    return ("number", value)


def _list(items: tuple[Any, ...]) -> Term:
    # Tables and arrays both decode to Erlang lists (so [] == []), of 3- and 2-tuples.
    return ("list", items)


def value_term(value: Any) -> Term:
    """The term of a decoded Python value, typed as RabbitMQ's JSON import would type it."""
    if value is None:
        return UNDEFINED
    if isinstance(value, bool):
        return TRUE if value else FALSE
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, str):
        return ("bin", value.encode("utf-8", "surrogateescape"))
    if isinstance(value, bytes | bytearray | memoryview):
        return ("bin", bytes(value))
    if isinstance(value, Decimal):
        return ("decimal", *decimal_parts(value))
    if isinstance(value, dt.datetime):
        return _number(timestamp_seconds(value))
    if isinstance(value, Mapping):
        return _list(
            tuple(
                (str(k).encode("utf-8", "surrogateescape"), infer_type(v), value_term(v))
                for k, v in value.items()
            )
        )
    if isinstance(value, list | tuple):
        return _list(tuple((infer_type(v), value_term(v)) for v in value))
    raise TypeError(f"unsupported AMQP field value {value!r}")


def headers_table_at(properties: Buffer) -> int | None:
    """Where the headers table starts in basic properties (flags, then the property list):
    after content-type and content-encoding, if present. None: no headers."""
    if len(properties) < 2:
        return None
    flags = struct.unpack_from(">H", properties)[0]
    if not flags & 0x2000:
        return None
    pos = 2
    if flags & 0x0001:  # a continuation flags word (never sent by 0-9-1 clients)
        return None
    for bit in (0x8000, 0x4000):  # content-type, content-encoding: shortstrs
        if flags & bit:
            pos += 1 + properties[pos]
    return pos
