"""Publishes with malformed content-header properties, compared with RabbitMQ 3.10.

RabbitMQ decodes the properties of every publish (rabbit_channel, after the exchange checks):
bytes its decoder cannot read crash the channel, and the connection closes with a bare
"INTERNAL_ERROR" (541, no method) with nothing stored. What the decoder reads it stores and
delivers verbatim, even a shortstr that is not UTF-8 or the flag-continuation bit. The
gateway checks the same in one pass (gateway/amqp/publish_cut.py, properties_well_formed).
"""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from pamqp import commands as c

from gateway.amqp import frame_writer, unchecked
from tests.diff.raw import RawClient, _decode_method, describe_close
from tests.diff.support import Server, describe, run_both

HEADERS = struct.pack(">H", 0x2000)


def table(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def headers(body: bytes) -> bytes:
    """Property bytes with only a headers table whose entries are ``body``."""
    return HEADERS + table(body)


REFUSED = {
    "content-type-truncated": b"\x80\x00\x0aext",
    "array-length-past-table": headers(b"\x01aA\x00\x00\x00\x10b\x01"),
    "table-length-past-properties": HEADERS + b"\x00\x00\x00\x20\x01aV",
    "key-length-past-table": headers(b"\x09aV"),
    "unknown-field-type": headers(b"\x01a\x03"),
    "unknown-field-type-U": headers(b"\x01aU\x00\x00"),
    "unknown-type-in-array": headers(b"\x01aA" + table(b"\x03")),
    "nested-array-past-array": headers(b"\x01aA\x00\x00\x00\x06A\x00\x00\x00\x09b"),
    "table-in-array-truncated": headers(b"\x01aA" + table(b"F\x00\x00\x00\x02\x01a")),
    "long-truncated-in-table": headers(b"\x01al\x00\x00"),
    "short-truncated-in-array": headers(b"\x01aA" + table(b"s\x00")),
    "nan-double": headers(b"\x01ad\x7f\xf8" + bytes(6)),
    "infinite-float-in-array": headers(b"\x01aA" + table(b"f\x7f\x80\x00\x00")),
    "timestamp-truncated": b"\x00\x40\x00\x00\x00\x01",
    "timestamp-missing": b"\x00\x40",
    "priority-missing": b"\x08\x00",
    "bytes-after-last-property": b"\x80\x00\x01a\xff",
    "bytes-after-no-property": b"\x00\x00\xff\xff",
    "no-flags": b"",
    "half-flags": b"\x80",
}

_NESTED = b""
for _ in range(200):
    _NESTED = b"\x01aF" + table(_NESTED)

ACCEPTED = {
    "content-type-not-utf8": b"\x80\x00\x0a\x80ext/plain",
    "header-key-not-utf8": headers(b"\x01\x80V"),
    "longstr-not-utf8": headers(b"\x01aS" + table(b"\x80")),
    "continuation-bit": b"\x00\x01",
    "reserved-flag-bit": b"\x00\x02",
    "negative-zero-double": headers(b"\x01ad\x80" + bytes(7)),
    "nested-tables": HEADERS + table(_NESTED),
}


def publish_raw(client: RawClient, properties: bytes, body: bytes, **method: Any) -> None:
    """basic.publish with these property bytes; the body in frames of at most 3 bytes."""
    fields = {"exchange": "", "routing_key": "", "mandatory": False, "immediate": False}
    data = frame_writer.method(1, unchecked.build(c.Basic.Publish, **{**fields, **method}))
    payload = struct.pack(">HHQ", 60, 0, len(body)) + properties
    data += struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    for start in range(0, len(body), 3):
        piece = body[start : start + 3]
        data += struct.pack(">BHI", 3, 1, len(piece)) + piece + b"\xce"
    client.sock.sendall(data)


def read_answers(client: RawClient) -> list[Any]:
    """Every frame until the socket is quiet: methods described, a header as its property
    bytes (pamqp cannot decode what RabbitMQ passes through), a body as bytes."""
    seen: list[Any] = []
    while True:
        try:
            kind, channel, payload = client._read_frame(time.monotonic() + 1.0)
        except (TimeoutError, ConnectionError):
            return seen
        if kind == 1:
            method = _decode_method(kind, channel, payload)
            if isinstance(method, c.Connection.Close):
                client.closed = (channel, method)
                client.send(0, c.Connection.CloseOk())
                return [*seen, describe_close(method)]
            seen.append(describe(method) if not isinstance(method, c.Basic.GetOk) else "get-ok")
        elif kind == 2:
            seen.append(("properties", payload[12:]))
        elif kind == 3:
            return [*seen, ("body", payload)]  # the get-ok's body, in one frame


def queue_depth(server: Server, queue: str) -> int:
    with server.raw() as client:
        client.open_channel(1)
        ok = client.rpc(1, c.Queue.Declare(queue=queue, passive=True))
        client.rpc(1, c.Queue.Delete(queue=queue))
        return int(ok.message_count)


def _publish_then_get(properties: bytes, body: bytes) -> Any:
    def scenario(server: Server, p: str) -> Any:
        client = server.raw()
        client.connect()
        client.open_channel(1)
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q"))
        publish_raw(client, properties, body, routing_key=f"{p}-q")
        client.send(1, c.Basic.Get(queue=f"{p}-q", no_ack=True))
        seen = read_answers(client)
        client.close()
        return seen, queue_depth(server, f"{p}-q")

    return scenario


BODIES = {"one-frame": b"x", "empty": b"", "three-frames": b"abcdefg"}


@pytest.mark.parametrize("body", list(BODIES), ids=str)
@pytest.mark.parametrize("name", list(REFUSED), ids=str)
def test_undecodable_properties_close_the_connection_as_rabbitmq(
    servers: list[Server], names: str, name: str, body: str
) -> None:
    rabbit, gateway = run_both(servers, _publish_then_get(REFUSED[name], BODIES[body]), names)
    assert rabbit == ([("connection", 541, "INTERNAL_ERROR", 0, 0)], 0)  # nothing stored
    assert gateway == rabbit


@pytest.mark.parametrize("name", list(ACCEPTED), ids=str)
def test_decodable_properties_are_delivered_verbatim_as_rabbitmq(
    servers: list[Server], names: str, name: str
) -> None:
    rabbit, gateway = run_both(servers, _publish_then_get(ACCEPTED[name], b"body"), names)
    assert rabbit == (["get-ok", ("properties", ACCEPTED[name]), ("body", b"body")], 0)
    assert gateway == rabbit


def _in_context(setup: str) -> Any:
    """A publish with a truncated timestamp in other settings: RabbitMQ decodes after its
    exchange checks, in a transaction too, routed or not."""

    def scenario(server: Server, p: str) -> Any:
        client = server.raw()
        client.connect()
        client.open_channel(1)
        method: dict[str, Any] = {"routing_key": f"{p}-nowhere"}
        if setup == "tx":
            client.rpc(1, c.Tx.Select())
        elif setup == "mandatory-unroutable":
            method.update(exchange="amq.direct", mandatory=True)
        elif setup == "missing-exchange":
            method.update(exchange=f"{p}-missing")
        elif setup == "immediate":
            method.update(immediate=True)
        publish_raw(client, REFUSED["timestamp-truncated"], b"x", **method)
        seen = read_answers(client)
        client.close()
        return seen

    return scenario


CONTEXTS = ["tx", "mandatory-unroutable", "missing-exchange", "immediate"]


@pytest.mark.parametrize("setup", CONTEXTS, ids=str)
def test_undecodable_properties_in_context(servers: list[Server], names: str, setup: str) -> None:
    rabbit, gateway = run_both(servers, _in_context(setup), names)
    if setup == "missing-exchange":
        # Expected difference: RabbitMQ looks the exchange up before it decodes the
        # properties (a channel-level NOT_FOUND); the gateway checks them as the publish is
        # assembled, before routing, and closes the connection. Both store nothing.
        assert rabbit == [("channel", 404, f"NOT_FOUND - no exchange '{names}-missing' in "
                           "vhost '/'", 60, 40)]  # fmt: skip
        assert gateway == [("connection", 541, "INTERNAL_ERROR", 0, 0)]
        return
    if setup == "immediate":
        # Expected difference, the same order: RabbitMQ refuses immediate=true first.
        assert rabbit == [("connection", 540, "NOT_IMPLEMENTED - immediate=true", 60, 40)]
        assert gateway == [("connection", 541, "INTERNAL_ERROR", 0, 0)]
        return
    assert rabbit == [("connection", 541, "INTERNAL_ERROR", 0, 0)]
    assert gateway == rabbit


@pytest.mark.parametrize("mode", [0, 1, 2, 3, 255], ids=str)
def test_delivery_modes_as_rabbitmq(servers: list[Server], names: str, mode: int) -> None:
    """Well-formed bytes, a value RabbitMQ's message validation knows or not."""
    properties = struct.pack(">HB", 0x1000, mode)
    rabbit, gateway = run_both(servers, _publish_then_get(properties, b"body"), names)
    assert gateway == rabbit
