"""The publish path's property check (publish_cut.properties_well_formed and its compiled twin):
what RabbitMQ 3.10's decoder refuses closes the connection with its bare INTERNAL_ERROR and
no Publish event, on the fast path and frame by frame; what it reads passes verbatim.
tests/diff/test_diff_malformed_properties.py compares the same cases with a real RabbitMQ."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from gateway.amqp import ServerConnection, channel, decode_properties, frame_reader, publish_cut
from gateway.amqp import property_bytes as pb
from gateway.amqp.events import ConnectionCloseSent, Publish
from storage.twins import compiled_twin
from tests.gateway.amqp.helpers import close_of, frame, handshake, open_channel

Check = Callable[[bytes], bool]
COMPILED = compiled_twin(publish_cut)


def table(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def headers(body: bytes) -> bytes:
    return b"\x20\x00" + table(body)


REFUSED = [
    b"",
    b"\x80",
    b"\x80\x00\x0aext",  # content-type past the end
    b"\x00\x40\x00\x00\x00\x01",  # timestamp truncated
    b"\x08\x00",  # priority missing
    b"\x80\x00\x01a\xff",  # a byte after the last property
    b"\x20\x00\x00\x00\x00\x20\x01aV",  # table longer than the properties
    headers(b"\x01aA\x00\x00\x00\x10b\x01"),  # array longer than its table
    headers(b"\x09aV"),  # key longer than its table
    headers(b"\x01a\x03"),  # unknown field type
    headers(b"\x01aA" + table(b"A\x00\x00\x00\x09b")),  # nested array past its array
    headers(b"\x01al\x00\x00"),  # long truncated
    headers(b"\x01ad\x7f\xf8" + bytes(6)),  # NaN: Erlang's float match fails
    headers(b"\x01aA" + table(b"f\xff\x80\x00\x00")),  # -infinity
]
ACCEPTED = [
    b"\x00\x00",
    b"\x80\x00\x0a\x80ext/plain",  # not UTF-8: RabbitMQ does not check
    b"\x00\x01",  # the continuation bit: ignored
    b"\x00\x02",
    headers(b"\x01\x80V"),
    headers(b"\x01ad\x80" + bytes(7) + b"\x01bf\x7f\x7f\xff\xff"),  # -0.0, the largest float
    headers(b"\x01aA" + table(b"A" + table(b"F" + table(b"\x00V")))),
    b"\xff\xfc\x01t\x01e" + table(b"") + b"\x01\x09\x01c\x01r\x011\x01m" + bytes(8) + b"\x01t"
    b"\x01u\x01a\x01c",  # every property
]


def checks() -> list[Check]:
    assert COMPILED is not None, "the compiled twin is not built: scripts/setup"
    return [publish_cut.properties_well_formed, COMPILED.properties_well_formed]


@pytest.mark.parametrize("data", REFUSED + ACCEPTED, ids=lambda d: d.hex() or "empty")
def test_both_twins_decide_as_rabbitmq(data: bytes) -> None:
    assert [check(data) for check in checks()] == [data in ACCEPTED] * 2


def test_any_depth_of_nesting_is_walked_without_recursion() -> None:
    nested = b""
    for _ in range(5000):
        nested = b"\x01aF" + table(nested)
    for check in checks():
        assert check(headers(nested))
        assert not check(headers(nested[:-1] + b"\x03"))


@st.composite
def mutated_properties(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(ACCEPTED + REFUSED)))
    for _ in range(draw(st.integers(0, 3))):
        if data and draw(st.booleans()):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        else:
            data[draw(st.integers(0, len(data))) :] = draw(st.binary(max_size=6))
    return bytes(data)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(mutated_properties(), st.binary(max_size=40)))
def test_twins_agree(data: bytes) -> None:
    pure, compiled = checks()
    assert pure(data) == compiled(data)


def _publish(properties: bytes, body: bytes, body_frames: int) -> bytes:
    data = frame(1, commands.Basic.Publish(exchange="", routing_key="q"))
    payload = struct.pack(">HHQ", 60, 0, len(body)) + properties
    data += struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    step = -(-len(body) // max(body_frames, 1)) or 1
    for start in range(0, len(body), step):
        piece = body[start : start + step]
        data += struct.pack(">BHI", 3, 1, len(piece)) + piece + b"\xce"
    return data


@pytest.mark.parametrize("twin", ["pure", "compiled"])
@pytest.mark.parametrize(("body", "frames"), [(b"x", 1), (b"", 0), (b"abcdef", 3)])
@pytest.mark.parametrize("properties", REFUSED + ACCEPTED, ids=lambda d: d.hex() or "empty")
def test_connection_refuses_what_rabbitmq_cannot_decode(
    monkeypatch: pytest.MonkeyPatch, twin: str, body: bytes, frames: int, properties: bytes
) -> None:
    pure, compiled = checks()
    if twin == "pure":  # the compiled twin's cut_publish makes its own (C) check
        monkeypatch.setattr(frame_reader, "cut_publish", publish_cut.cut_publish)
    monkeypatch.setattr(channel, "properties_well_formed", pure if twin == "pure" else compiled)
    conn = handshake(ServerConnection())
    open_channel(conn)
    seen = conn.receive_data(_publish(properties, body, frames))
    if properties in ACCEPTED:
        assert len(seen) == 1 and isinstance(seen[0], Publish)
        assert (seen[0].properties_bytes, seen[0].body) == (properties, body)
        return
    assert [type(event) for event in seen] == [ConnectionCloseSent]
    close = close_of(conn.data_to_send())
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        541, "INTERNAL_ERROR", 0, 0
    )  # fmt: skip


def test_what_rabbitmq_passes_through_is_read_from_a_readable_copy() -> None:
    data = b"\xa0\x01\x02\x80\xff" + table(b"\x02k\x80S" + table(b"\x80") + b"\x01aA" + table(
        b"F" + table(b"\x01\xfft\x01")
    ))  # fmt: skip
    assert publish_cut.properties_well_formed(data)
    properties = decode_properties(data)
    assert properties.content_type == "\ufffd\ufffd"
    assert properties.headers == {"k\ufffd": b"\x80", "a": [{"\ufffd": True}]}
    assert pb.readable(b"\x80\x00\xff" + b"\xe9" * 255)[2] == 255  # cut to a whole character
