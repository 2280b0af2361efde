"""AMQP field-table values as RabbitMQ sees them: type names, comparison, formatting.

Decoders such as pamqp hand us plain Python values (the wire type is lost), so a
type is either given by the caller (``argument_types`` on the models) or inferred
the way RabbitMQ types JSON values on definitions import (int -> long, str -> longstr).
Comparison and formatting mimic Erlang: ``=:=`` on the decoded terms, ``~tp`` for text.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

AMQP_TYPES = frozenset(
    {
        "bool",
        "byte",
        "unsignedbyte",
        "short",
        "unsignedshort",
        "signedint",
        "unsignedint",
        "long",
        "float",
        "double",
        "decimal",
        "longstr",
        "binary",
        "timestamp",
        "table",
        "array",
        "void",
    }
)

# rabbit_misc:type_class/1: all integer widths (and decimal) compare as one class.
_INT_CLASS = frozenset(
    {
        "byte",
        "short",
        "signedint",
        "long",
        "decimal",
        "unsignedbyte",
        "unsignedshort",
        "unsignedint",
    }
)


def infer_type(value: Any) -> str:
    """The AMQP type RabbitMQ would give a JSON-ish value (rabbit_misc:type_val/1)."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, Decimal):
        return "decimal"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, bytes | bytearray | memoryview):
        return "binary"
    if isinstance(value, dt.datetime):
        return "timestamp"
    if isinstance(value, Mapping):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    raise TypeError(f"unsupported AMQP field value {value!r}")


def type_class(amqp_type: str) -> str:
    if amqp_type in _INT_CLASS:
        return "int"
    if amqp_type in ("float", "double"):
        return "float"
    return amqp_type


def timestamp_seconds(value: dt.datetime) -> int:
    """AMQP timestamps are POSIX seconds; naive datetimes are taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return math.floor(value.timestamp())


def erlang_term(value: Any, *, timestamp_scale: int = 1) -> Any:
    """A hashable stand-in for the Erlang term RabbitMQ holds for ``value``.

    Two values are equal as Erlang ``=:=`` sees them iff their terms are equal:
    ``True`` is not ``1``, ``1`` is not ``1.0``, a str equals its UTF-8 bytes.
    ``timestamp_scale`` exists because RabbitMQ turns message-header timestamps
    into milliseconds for routing but keeps binding-argument ones in seconds.
    """
    if value is None:
        return ("undefined",)
    if isinstance(value, bool):
        return ("atom", "true" if value else "false")
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", value)
    if isinstance(value, str):
        return ("bin", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes | bytearray | memoryview):
        return ("bin", bytes(value))
    if isinstance(value, Decimal):
        return ("decimal", *decimal_parts(value))
    if isinstance(value, dt.datetime):
        return ("int", timestamp_seconds(value) * timestamp_scale)
    if isinstance(value, Mapping):
        return (
            "table",
            tuple(
                sorted(
                    (str(k), erlang_term(v, timestamp_scale=timestamp_scale))
                    for k, v in value.items()
                )
            ),
        )
    if isinstance(value, list | tuple):
        return ("array", tuple(erlang_term(v, timestamp_scale=timestamp_scale) for v in value))
    raise TypeError(f"unsupported AMQP field value {value!r}")


def decimal_parts(value: Decimal) -> tuple[int, int]:
    """AMQP decimal as (scale, unscaled value), e.g. Decimal('1.50') -> (2, 150)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int), "NaN/Infinity are not AMQP decimals"
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    if exponent > 0:
        return 0, unscaled * 10**exponent
    return -exponent, unscaled


def erlang_float(value: float) -> str:
    """Erlang's shortest float text (~p): '0.5', '100.0', '1.0e3', '1.0e-5'."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    if not math.isfinite(value):
        return repr(value)
    # Python's repr is the shortest round-trip text too; only the layout differs.
    sign_bit, digit_tuple, exp = Decimal(repr(value)).as_tuple()
    assert isinstance(exp, int)
    exponent = len(digit_tuple) + exp - 1  # scientific exponent of the first digit
    digits = "".join(map(str, digit_tuple)).lstrip("0").rstrip("0") or "0"
    sign = "-" if sign_bit else ""
    sci = f"{sign}{digits[0]}.{digits[1:] or '0'}e{exponent}"
    if exponent >= len(digits) - 1:
        plain = f"{sign}{digits}{'0' * (exponent - len(digits) + 1)}.0"
    elif exponent >= 0:
        plain = f"{sign}{digits[: exponent + 1]}.{digits[exponent + 1 :]}"
    else:
        plain = f"{sign}0.{'0' * (-exponent - 1)}{digits}"
    return plain if len(plain) <= len(sci) else sci


def erlang_repr(value: Any) -> str:
    """``io_lib:format("~tp", [Term])`` for the decoded term of an AMQP value."""
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return erlang_float(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'<<"{escaped}">>' if value.isascii() else f'<<"{escaped}"/utf8>>'
    if isinstance(value, bytes | bytearray | memoryview):
        return "<<" + ",".join(str(b) for b in bytes(value)) + ">>"
    if isinstance(value, Decimal):
        scale, unscaled = decimal_parts(value)
        return f"{{{scale},{unscaled}}}"
    if isinstance(value, dt.datetime):
        return str(timestamp_seconds(value))
    if isinstance(value, Mapping):
        rows = [
            f"{{{erlang_repr(str(k))},{infer_type(v)},{erlang_repr(v)}}}" for k, v in value.items()
        ]
        return "[" + ",".join(rows) + "]"
    if isinstance(value, list | tuple):
        return "[" + ",".join(f"{{{infer_type(v)},{erlang_repr(v)}}}" for v in value) + "]"
    raise TypeError(f"unsupported AMQP field value {value!r}")


def erlang_text(value: Any) -> str:
    """``~ts`` for binaries (the raw text), ``~tp`` for everything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return erlang_repr(value)


# --- JSON persistence: tag the values JSON cannot carry, so they come back typed ---

_TAG = "$amqp"


def to_json(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {_TAG: "binary", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Decimal):
        return {_TAG: "decimal", "v": str(value)}
    if isinstance(value, dt.datetime):
        return {_TAG: "timestamp", "v": value.isoformat()}
    if isinstance(value, Mapping):
        table = {str(k): to_json(v) for k, v in value.items()}
        return {_TAG: "table", "v": table} if _TAG in table else table
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    raise TypeError(f"unsupported AMQP field value {value!r}")


def from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag == "binary":
        return base64.b64decode(value["v"])
    if tag == "decimal":
        return Decimal(value["v"])
    if tag == "timestamp":
        return dt.datetime.fromisoformat(value["v"])
    if tag == "table":
        return {k: from_json(v) for k, v in value["v"].items()}
    return {k: from_json(v) for k, v in value.items()}
