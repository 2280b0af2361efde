"""Parsing of the SASL responses carried by connection.start-ok.

Only the mechanisms RabbitMQ offers by default: PLAIN (``\\0user\\0pass``, an
empty authorisation id is required, as rabbit_auth_mechanism_plain does) and
AMQPLAIN (a field table *without* its 4-byte length, holding LOGIN and PASSWORD).
A malformed response is a SYNTAX_ERROR, as in RabbitMQ.

EXTERNAL (rabbitmq_auth_mechanism_ssl) is offered only on TLS connections whose client
certificate was verified; its response is ignored and the user name is the certificate's
subject CN (RabbitMQ's ``ssl_cert_login_from = common_name``), see ``certificate_login``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from pamqp import decode

from gateway.amqp.errors import AMQPSyntaxError, erlang_binary

MECHANISMS = ("PLAIN", "AMQPLAIN")
EXTERNAL = "EXTERNAL"


def as_bytes(value: object) -> bytes:
    """pamqp yields a longstr as str when it is valid UTF-8, else bytes."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    raise TypeError(type(value).__name__)


def parse_plain(response: bytes) -> tuple[bytes, bytes]:
    """``\\0user\\0pass`` -> (user, pass)."""
    parts = response.split(b"\x00")
    if len(parts) != 3 or parts[0] != b"":
        raise AMQPSyntaxError(f"response {erlang_binary(response[:64])} invalid")
    return parts[1], parts[2]


def _amqplain_table(response: bytes) -> dict[str, Any]:
    # RabbitMQ parses the bytes as table *contents*; a few clients include the
    # length prefix, so fall back to that reading when the first one fails.
    candidates = [struct.pack(">I", len(response)) + response]
    if len(response) >= 4 and struct.unpack_from(">I", response)[0] == len(response) - 4:
        candidates.append(response)
    for candidate in candidates:
        try:
            _, table = decode.field_table(candidate)
        except Exception:  # malformed under this reading: try the next one
            continue
        if "LOGIN" in table:
            return table
    return {}


def parse_amqplain(response: bytes) -> tuple[bytes, bytes]:
    """Field table with LOGIN and PASSWORD (long/short strings or byte arrays)."""
    table = _amqplain_table(response)
    if "LOGIN" not in table or "PASSWORD" not in table:
        raise AMQPSyntaxError("AMQPLAIN auth info is missing LOGIN or PASSWORD field")
    try:
        return as_bytes(table["LOGIN"]), as_bytes(table["PASSWORD"])
    except TypeError as err:
        raise AMQPSyntaxError(
            "AMQPLAIN auth info uses unsupported type for LOGIN or PASSWORD field"
        ) from err


def parse_response(mechanism: str, response: bytes) -> tuple[str, bytes]:
    """(username, password) for a supported mechanism."""
    if mechanism == "PLAIN":
        user, password = parse_plain(response)
    else:
        user, password = parse_amqplain(response)
    return user.decode("utf-8", errors="replace"), password


def certificate_login(peer_certificate: Mapping[str, Any]) -> str:
    """The EXTERNAL user name: the first commonName of a verified certificate's subject, as
    ``ssl.SSLSocket.getpeercert()`` decodes it ("" when the subject has none)."""
    for rdn in peer_certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""
