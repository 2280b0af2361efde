"""Hostile frame streams against a live gateway: it never crashes, answers with a protocol
close (or drops the socket), and every other connection carries on (h11's fuzz invariant)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame, header, heartbeat
from pamqp.common import FieldTable

from tests.harness.processes import GatewayProcess
from tests.harness.raw_client import PROTOCOL_HEADER, handshake

KNOWN_CODES = {
    200,
    311,
    312,
    313,
    320,
    402,
    403,
    404,
    405,
    406,
    501,
    502,
    503,
    504,
    505,
    506,
    530,
    540,
    541,
}


@pytest.fixture(scope="module")
def live_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    process = GatewayProcess(Path(tmp_path_factory.mktemp("fuzz")) / "data").start()
    yield process
    process.stop()


def _valid_frames() -> st.SearchStrategy[bytes]:
    names = st.from_regex(r"[a-zA-Z0-9_.:-]{0,20}", fullmatch=True)
    table: st.SearchStrategy[FieldTable] = st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.integers(-(2**31), 2**31 - 1) | st.text(max_size=8),
        max_size=3,
    )
    methods = st.one_of(
        st.builds(commands.Queue.Declare, queue=names, durable=st.booleans(), arguments=table),
        st.builds(
            commands.Exchange.Declare,
            exchange=names,
            exchange_type=st.sampled_from(["direct", "topic", "fanout", "headers", "bogus"]),
        ),
        st.builds(commands.Basic.Publish, exchange=names, routing_key=names),
        st.builds(commands.Basic.Ack, delivery_tag=st.integers(0, 2**20)),
        st.builds(commands.Basic.Qos, prefetch_count=st.integers(0, 65535)),
        st.builds(
            commands.Channel.Close,
            reply_code=st.just(200),
            reply_text=st.just(""),
            class_id=st.just(0),
            method_id=st.just(0),
        ),
        st.builds(commands.Queue.Bind, queue=names, exchange=names, routing_key=names),
    )
    method_frames = st.tuples(methods, st.integers(0, 3)).map(
        lambda mc: frame.marshal(mc[0], mc[1])
    )
    bodies = st.binary(max_size=200)
    content = st.tuples(bodies, st.integers(0, 3)).map(
        lambda bc: (
            frame.marshal(header.ContentHeader(0, len(bc[0]), commands.Basic.Properties()), bc[1])
            + (
                frame.marshal(__import__("pamqp.body", fromlist=["x"]).ContentBody(bc[0]), bc[1])
                if bc[0]
                else b""
            )
        )
    )
    beat = st.just(frame.marshal(heartbeat.Heartbeat(), 0))
    return st.one_of(method_frames, content, beat)


def _mutate(data: bytes, draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["none", "flip", "truncate", "insert", "type"]))
    if not data or kind == "none":
        return data
    at = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
    if kind == "truncate":
        return data[:at]
    if kind == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    return bytes([draw(st.integers(0, 255))]) + data[1:]


@st.composite
def hostile_streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    frames = draw(st.lists(_valid_frames(), min_size=1, max_size=6))
    stream = b"".join(_mutate(f, draw) for f in frames)
    cuts = sorted(draw(st.lists(st.integers(0, max(0, len(stream))), max_size=5)))
    return stream, cuts


def _responses(sock: socket.socket, buffer: bytearray) -> list[object]:
    """Everything the server sends until it closes the socket or goes quiet."""
    sock.settimeout(0.3)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            buffer += data
    except (TimeoutError, ConnectionResetError):
        pass
    frames = []
    while len(buffer) >= 8:
        size = struct.unpack_from(">I", buffer, 3)[0]
        assert len(buffer) >= size + 8, "the server sent a partial frame"
        consumed, _channel, value = frame.unmarshal(bytes(buffer[: size + 8]))
        del buffer[:consumed]
        frames.append(value)
    assert not buffer, f"unparsable bytes from the server: {bytes(buffer)!r}"
    return frames


_SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@settings(max_examples=40, deadline=None, suppress_health_check=_SUPPRESS)
@given(hostile_streams())
def test_hostile_frames_close_only_their_own_connection(
    live_gateway: GatewayProcess, case: tuple[bytes, list[int]]
) -> None:
    _check_hostile_stream(live_gateway, case)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=_SUPPRESS)
@given(hostile_streams())
def test_hostile_frames_long_run(
    live_gateway: GatewayProcess, case: tuple[bytes, list[int]]
) -> None:
    _check_hostile_stream(live_gateway, case)


def _check_hostile_stream(live_gateway: GatewayProcess, case: tuple[bytes, list[int]]) -> None:
    stream, cuts = case
    sock, buffer = handshake(live_gateway.amqp_port)
    try:
        last = 0
        for cut in [*cuts, len(stream)]:
            if cut > last:
                try:
                    sock.sendall(stream[last:cut])
                except (BrokenPipeError, ConnectionResetError):
                    break
                last = cut
        frames = _responses(sock, buffer)
    finally:
        sock.close()
    for value in frames:
        if isinstance(value, commands.Connection.Close | commands.Channel.Close):
            assert value.reply_code in KNOWN_CODES, value
            assert "Traceback" not in value.reply_text
    assert live_gateway.proc is not None and live_gateway.proc.poll() is None, "gateway died"
    # Another connection is unaffected.
    try:
        other = pika.BlockingConnection(pika.URLParameters(live_gateway.url))
    except pika.exceptions.AMQPError as error:
        raise AssertionError(f"{error}\n{live_gateway.log()[-4000:]}") from error
    channel = other.channel()
    channel.queue_declare("fuzz_canary")
    channel.basic_publish("", "fuzz_canary", b"ok")
    _method, _props, body = channel.basic_get("fuzz_canary", auto_ack=True)
    assert body == b"ok"
    other.close()


def test_garbage_protocol_header_gets_our_header_back(live_gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", live_gateway.amqp_port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        reply = b""
        while chunk := sock.recv(100):
            reply += chunk
    assert reply == PROTOCOL_HEADER
