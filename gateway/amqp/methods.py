"""Method helpers shared by the connection and channel layers."""

from __future__ import annotations

import base64
import platform
import struct
from typing import Any

from pamqp import base, commands

from gateway.amqp import unchecked
from gateway.amqp.errors import AMQPError, CommandInvalid, FrameError, NotAllowed, erlang_binary

METHOD_INDEX = struct.Struct(">I")  # class id << 16 | method id, first in a method frame


def method_index(payload: bytes) -> int:
    """Peek a method frame's (class, method) index without decoding its fields."""
    index: int = METHOD_INDEX.unpack_from(payload)[0]
    return index


def method_ids(method: base.Frame | type[base.Frame]) -> tuple[int, int]:
    """(class id, method id) of a pamqp method."""
    return method.index >> 16, method.index & 0xFFFF


def decode_method(payload: bytes) -> base.Frame:
    """Decode a method frame payload with pamqp's catalogue.

    Unknown (class, method) ids are COMMAND_INVALID (RabbitMQ just drops the
    socket); fields that do not decode are FRAME_ERROR "cannot decode <<...>>"
    (rabbit_misc:frame_error).
    """
    index = method_index(payload)
    method_class = commands.INDEX_MAPPING.get(index)
    if method_class is None:
        raise CommandInvalid(f"unknown method {{{index >> 16},{index & 0xFFFF}}}")
    method: base.Frame = method_class()
    try:
        method.unmarshal(payload[4:])
    except Exception as err:  # pamqp lets struct/Value/Overflow/Recursion errors out
        detail = f"cannot decode {erlang_binary(payload[4:68], as_text=False)}"
        raise FrameError(detail, index >> 16, index & 0xFFFF) from err
    if getattr(method, "arguments", None):
        # pamqp drops wire types; RabbitMQ names them in its errors ("of type 'short'"), and
        # a headers exchange compares nested values with theirs (argument_wire).
        types, wire = _arguments_types(method, payload[4:])
        setattr(method, "argument_types", types)  # noqa: B010
        setattr(method, "argument_wire", wire)  # noqa: B010
    return method


# Field-table type codes and RabbitMQ's names for them (rabbit_binary_parser).
_TYPE_NAMES = {
    "t": "bool", "b": "byte", "B": "unsignedbyte", "s": "short", "u": "unsignedshort",
    "I": "signedint", "i": "unsignedint", "l": "long", "f": "float", "d": "double",
    "D": "decimal", "S": "longstr", "x": "binary", "T": "timestamp", "F": "table",
    "A": "array", "V": "void",
}  # fmt: skip
# Kept as sent for the headers exchange: pamqp drops nested types, and reads a timestamp
# above 2^32 as milliseconds (and a decimal as a Decimal, not RabbitMQ's {scale, unscaled}).
_KEPT_AS_SENT = frozenset("FATD")
_FIXED_SIZES = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "f": 4, "l": 8,
                "d": 8, "T": 8, "D": 5, "V": 0}  # fmt: skip


def _arguments_types(method: Any, fields: bytes) -> tuple[dict[str, str], dict[str, str]]:
    """Wire type names of the top-level ``arguments`` table, always a method's last field,
    and some values as sent (base64 of type code and value; see _KEPT_AS_SENT).

    Its offset is what the other fields re-encode to (they have a single encoding).
    """
    arguments = method.arguments
    method.arguments = {}
    try:
        offset = len(unchecked.marshal(method)) - 4  # the client's names may be any UTF-8
    finally:
        method.arguments = arguments
    end = offset + 4 + struct.unpack_from(">I", fields, offset)[0]
    position = offset + 4
    types: dict[str, str] = {}
    wire: dict[str, str] = {}
    while position < end:
        size = fields[position]
        name = fields[position + 1 : position + 1 + size].decode("utf-8", "replace")
        code = chr(fields[position + 1 + size])
        position += 2 + size
        if code not in _TYPE_NAMES:
            break  # already rejected or accepted by pamqp; nothing more to name
        types[name] = _TYPE_NAMES[code]
        fixed = _FIXED_SIZES.get(code)
        if fixed is None:
            fixed = 4 + struct.unpack_from(">I", fields, position)[0]
        if code in _KEPT_AS_SENT:
            wire[name] = base64.b64encode(fields[position - 1 : position + fixed]).decode()
        position += fixed
    return types, wire


def connection_close(error: AMQPError) -> commands.Connection.Close:
    return commands.Connection.Close(
        error.reply_code, error.reply_text, error.class_id, error.method_id
    )


def channel_close(error: AMQPError) -> commands.Channel.Close:
    return commands.Channel.Close(
        error.reply_code, error.reply_text, error.class_id, error.method_id
    )


def check_tune_value(field: str, minimum: int, server_value: int, client_value: int) -> int:
    """Validate a tune-ok value as rabbit_reader:validate_negotiated_integer_value.

    The client's value is the negotiated one; it must be within [minimum,
    server_value] (0 = "no limit" is refused because the server has a limit).
    """
    if client_value != 0 and client_value < minimum:
        raise NotAllowed(
            f"negotiated {field} = {client_value} is lower than the minimum allowed value "
            f"({minimum})",
            10,
            30,
        )
    if server_value != 0 and (client_value == 0 or client_value > server_value):
        detail = " (no limit)" if field == "channel_max" and client_value == 0 else ""
        raise NotAllowed(
            f"negotiated {field} = {client_value}{detail} is higher than the maximum allowed "
            f"value ({server_value})",
            10,
            30,
        )
    return client_value


def negotiate(server_value: int, client_value: int) -> int:
    """What clients answer in tune-ok: the lower non-zero proposal (0 = none/off)."""
    if server_value == 0 or client_value == 0:
        return max(server_value, client_value)
    return min(server_value, client_value)


SERVER_CAPABILITIES: dict[str, Any] = dict.fromkeys(
    (
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ),
    True,
)


COPYRIGHT = "Copyright (c) the mqgw authors."
INFORMATION = "Licensed under the Apache License 2.0. An AMQP 0-9-1 gateway on a partitioned log."


def server_properties_table(version: str, extra: dict[str, Any] | None) -> dict[str, Any]:
    """connection.start's server-properties: RabbitMQ's keys (tools such as the management
    UI and client logs show cluster_name, copyright and information) and its capabilities.
    ``extra`` overrides, e.g. the node's own cluster_name."""
    return {
        "capabilities": dict(SERVER_CAPABILITIES),
        "cluster_name": f"mqgw@{platform.node()}",
        "copyright": COPYRIGHT,
        "information": INFORMATION,
        "platform": f"Python {platform.python_version()}",
        "product": "mqgw",
        "version": version,
        **(extra or {}),
    }
