"""Connection handshake, auth, vhost, tune negotiation and heartbeats, byte by byte."""

from __future__ import annotations

import platform
import struct

import pytest
from pamqp import commands, encode

from gateway.amqp import ConnectionState, ServerConnection, events
from gateway.amqp.errors import ConnectionForced
from gateway.amqp.frame_reader import PROTOCOL_HEADER
from gateway.amqp.methods import negotiate
from tests.gateway.amqp.helpers import close_of, frame, handshake, parse, start_ok


def test_start_is_sent_after_protocol_header_with_rabbitmq_capabilities() -> None:
    conn = ServerConnection(version="9.9.9", server_properties={"cluster_name": "mqgw@here"})
    assert conn.receive_data(PROTOCOL_HEADER[:5]) == []
    assert conn.data_to_send() == b""
    assert conn.receive_data(PROTOCOL_HEADER[5:]) == []
    caps = {
        "publisher_confirms": True,
        "exchange_exchange_bindings": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "consumer_priorities": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
        "direct_reply_to": True,
    }
    expected = commands.Connection.Start(
        0,
        9,
        {
            "capabilities": caps,
            # RabbitMQ's keys; tests/diff/test_diff_connection.py compares them with its own.
            "cluster_name": "mqgw@here",
            "copyright": "Copyright (c) the mqgw authors.",
            "information": (
                "Licensed under the Apache License 2.0. An AMQP 0-9-1 gateway on a partitioned log."
            ),
            "platform": f"Python {platform.python_version()}",
            "product": "mqgw",
            "version": "9.9.9",
        },
        "PLAIN AMQPLAIN",
        "en_US",
    )
    assert conn.data_to_send() == frame(0, expected)
    assert conn.state is ConnectionState.START_SENT


def test_full_handshake_bytes() -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    evs = conn.receive_data(start_ok(user="alice", password="s3cret"))
    assert len(evs) == 1
    auth = evs[0]
    assert isinstance(auth, events.AuthRequested)
    assert (auth.mechanism, auth.username, auth.password) == ("PLAIN", "alice", b"s3cret")
    assert auth.client_properties["product"] == "test"
    assert conn.consumer_cancel_notify
    assert conn.data_to_send() == b""  # nothing until the decision
    assert conn.accept_auth() == []
    # connection.tune: channel_max 2047, frame_max 131072, heartbeat 60
    assert conn.data_to_send() == bytes.fromhex("01 0000 0000000c 000a 001e 07ff 00020000 003c ce")
    evs = conn.receive_data(
        frame(0, commands.Connection.TuneOk(2047, 131072, 60))
        + frame(0, commands.Connection.Open("/prod"))
    )
    assert evs == [events.VHostOpenRequested("/prod")]
    assert conn.state is ConnectionState.OPENING
    assert conn.accept_vhost() == []
    assert conn.data_to_send() == bytes.fromhex("01 0000 00000005 000a 0029 00 ce")
    assert conn.state is ConnectionState.OPEN
    assert (conn.frame_max, conn.channel_max, conn.heartbeat_s) == (131072, 2047, 60)


def test_input_pipelined_behind_start_ok_waits_for_the_auth_decision() -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    data = start_ok() + frame(0, commands.Connection.TuneOk(2047, 131072, 0))
    data += frame(0, commands.Connection.Open("/"))
    evs = conn.receive_data(data)
    assert [type(e) for e in evs] == [events.AuthRequested]
    assert conn.accept_auth() == [events.VHostOpenRequested("/")]


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x00\x00\x08\x00",
        b"AMQP\x01\x01\x00\x0a",
        b"GET / HTTP/1.1\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01",
    ],
)
def test_wrong_protocol_header_gets_ours_and_close(header: bytes) -> None:
    conn = ServerConnection()
    evs = conn.receive_data(header)
    assert evs == [events.ProtocolHeaderRejected(header[:8])]
    assert conn.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert conn.closed
    assert conn.receive_data(start_ok()) == []


def test_amqp_0_9_header_is_accepted() -> None:
    conn = ServerConnection()
    assert conn.receive_data(b"AMQP\x01\x01\x00\x09") == []
    assert parse(conn.data_to_send())[0][1].name == "Connection.Start"


def _to_secure(capabilities: dict[str, bool]) -> ServerConnection:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    evs = conn.receive_data(start_ok(capabilities=capabilities))
    assert isinstance(evs[0], events.AuthRequested)
    return conn


def test_bad_auth_with_authentication_failure_close_sends_403() -> None:
    conn = _to_secure({"authentication_failure_close": True})
    evs = conn.reject_auth("invalid credentials")
    close = close_of(conn.data_to_send())
    assert (close.reply_code, close.class_id, close.method_id) == (403, 0, 0)
    assert close.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile."
    )
    assert isinstance(evs[0], events.ConnectionCloseSent)
    assert conn.state is ConnectionState.CLOSING
    evs = conn.receive_data(frame(0, commands.Connection.CloseOk()))
    assert isinstance(evs[0], events.ConnectionClosed) and evs[0].reply_code == 403
    assert conn.closed


def test_bad_auth_without_capability_just_closes() -> None:
    conn = _to_secure({})
    evs = conn.reject_auth("invalid credentials")
    assert conn.data_to_send() == b""
    assert conn.closed
    assert evs == [
        events.ConnectionClosed(
            403, "ACCESS_REFUSED - PLAIN login refused: invalid credentials", 0, 0, by_client=False
        )
    ]


def test_unknown_mechanism_closes_silently_with_503() -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    evs = conn.receive_data(start_ok(mechanism="EXTERNAL"))
    assert conn.data_to_send() == b""
    assert conn.closed
    assert evs[0].reply_text == "COMMAND_INVALID - unknown authentication mechanism 'EXTERNAL'"


@pytest.mark.parametrize("response", ["guest\0guest", "\0guest", "\0a\0b\0c", "x\0a\0b"])
def test_malformed_plain_response_is_a_syntax_error(response: str) -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    evs = conn.receive_data(start_ok(response=response))
    assert conn.closed and evs[0].reply_code == 502


def test_amqplain_login_table() -> None:
    table = encode.field_table({"LOGIN": "bob", "PASSWORD": "pw"})[4:]  # no length prefix
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    evs = conn.receive_data(start_ok(mechanism="AMQPLAIN", response=table.decode()))
    assert evs == [events.AuthRequested("AMQPLAIN", "bob", b"pw", evs[0].client_properties)]


def test_unknown_vhost_is_530_not_allowed() -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(start_ok())
    conn.accept_auth()
    evs = conn.receive_data(
        frame(0, commands.Connection.TuneOk(2047, 131072, 60))
        + frame(0, commands.Connection.Open("nope"))
    )
    assert evs == [events.VHostOpenRequested("nope")]
    conn.data_to_send()
    conn.reject_vhost()
    close = close_of(conn.data_to_send())
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - vhost nope not found")
    assert (close.class_id, close.method_id) == (10, 40)
    assert conn.state is ConnectionState.CLOSING
    # Anything but close-ok is ignored now.
    assert conn.receive_data(frame(1, commands.Channel.Open())) == []
    assert conn.data_to_send() == b""
    evs = conn.receive_data(frame(0, commands.Connection.CloseOk()))
    assert conn.closed and isinstance(evs[0], events.ConnectionClosed)


NEG = "NOT_ALLOWED - negotiated"
MAX_FRAME = "is higher than the maximum allowed value (131072)"
MAX_CHANNEL = "is higher than the maximum allowed value (2047)"
TUNE_CASES = [
    # (client channel_max, frame_max, heartbeat) -> None if accepted, else the reply text
    ((2047, 131072, 60), None),
    ((10, 4096, 0), None),
    ((1, 131072, 600), None),
    ((2047, 131073, 60), f"{NEG} frame_max = 131073 {MAX_FRAME}"),
    ((2047, 0, 60), f"{NEG} frame_max = 0 {MAX_FRAME}"),
    ((2047, 4095, 60), f"{NEG} frame_max = 4095 is lower than the minimum allowed value (4096)"),
    ((0, 131072, 60), f"{NEG} channel_max = 0 (no limit) {MAX_CHANNEL}"),
    ((2048, 131072, 60), f"{NEG} channel_max = 2048 {MAX_CHANNEL}"),
]


@pytest.mark.parametrize(("tune", "error"), TUNE_CASES)
def test_tune_ok_validation(tune: tuple[int, int, int], error: str | None) -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(start_ok())
    conn.accept_auth()
    conn.data_to_send()
    evs = conn.receive_data(frame(0, commands.Connection.TuneOk(*tune)))
    if error is None:
        assert evs == []
        assert conn.state is ConnectionState.AWAIT_OPEN
        assert (conn.channel_max, conn.frame_max, conn.heartbeat_s) == tune
    else:
        close = close_of(conn.data_to_send())
        assert close.reply_text == error
        assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 30)
        assert isinstance(evs[0], events.ConnectionCloseSent)


@pytest.mark.parametrize(
    ("server", "client", "expected"),
    [(60, 0, 60), (0, 30, 30), (60, 30, 30), (10, 30, 10), (0, 0, 0)],
)
def test_negotiate_picks_lower_non_zero(server: int, client: int, expected: int) -> None:
    assert negotiate(server, client) == expected


def test_heartbeat_sent_at_half_interval_and_death_after_two_missed() -> None:
    conn = handshake(tune=(2047, 131072, 10))
    heartbeat = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    assert conn.tick(100.0) is False  # first tick starts the clocks
    assert conn.tick(104.9) is False
    assert conn.tick(105.0) is True
    assert conn.data_to_send() == heartbeat
    conn.receive_data(heartbeat)  # client alive
    assert conn.tick(110.0) is True
    conn.data_to_send()
    assert conn.tick(119.9) is True  # 9.9 s since the client's heartbeat was seen at 110
    assert not conn.closed
    assert conn.tick(130.0) is False
    assert conn.closed
    assert conn.timed_out == events.HeartbeatTimeout(10.0)


def test_outgoing_traffic_postpones_heartbeat() -> None:
    conn = handshake(tune=(2047, 131072, 10))
    conn.tick(0.0)
    conn.send_method(0, commands.Connection.Blocked("low on memory"))
    assert conn.tick(4.0) is False
    assert conn.tick(8.0) is False  # output at 4.0 restarted the send timer
    assert conn.tick(9.0) is True


def test_heartbeats_off_when_negotiated_zero() -> None:
    conn = handshake(tune=(2047, 131072, 0))
    assert conn.tick(0.0) is False
    assert conn.tick(10_000.0) is False
    assert not conn.closed


def test_client_close_gets_close_ok() -> None:
    conn = handshake()
    evs = conn.receive_data(frame(0, commands.Connection.Close(200, "bye", 0, 0)))
    assert evs == [events.ConnectionClosed(200, "bye", 0, 0, by_client=True)]
    assert conn.data_to_send() == frame(0, commands.Connection.CloseOk())
    assert conn.closed


def test_server_close_waits_for_close_ok() -> None:
    conn = handshake()
    conn.close(ConnectionForced("Closed via management plugin"))
    close = close_of(conn.data_to_send())
    assert (close.reply_code, close.reply_text) == (
        320,
        "CONNECTION_FORCED - Closed via management plugin",
    )
    assert conn.send_deliver(1, "t", 1, False, "", "q", b"\x00\x00", b"x") is False
    evs = conn.receive_data(frame(0, commands.Connection.CloseOk()))
    assert isinstance(evs[0], events.ConnectionClosed) and evs[0].reply_code == 320
    assert conn.closed


def test_unexpected_method_during_handshake_closes_silently() -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    evs = conn.receive_data(frame(0, commands.Connection.TuneOk(2047, 131072, 60)))
    assert conn.closed and conn.data_to_send() == b""
    assert evs[0].reply_text == "CHANNEL_ERROR - unexpected method in connection state starting"


def test_unexpected_method_in_running_state_is_504() -> None:
    conn = handshake()
    conn.receive_data(frame(0, commands.Connection.TuneOk(2047, 131072, 60)))
    close = close_of(conn.data_to_send())
    assert (close.reply_code, close.class_id, close.method_id) == (504, 10, 31)
    assert close.reply_text == "CHANNEL_ERROR - unexpected method in connection state running"


def test_blocked_only_for_clients_with_the_capability() -> None:
    conn = handshake()
    assert conn.send_blocked("low on memory") is True
    assert parse(conn.data_to_send())[0][1].reason == "low on memory"
    assert conn.send_unblocked() is True
    assert parse(conn.data_to_send())[0][1].name == "Connection.Unblocked"
    plain = handshake(capabilities={})
    assert plain.send_blocked("low on memory") is False
    assert plain.data_to_send() == b""


def test_tune_frame_is_exactly_the_spec_layout() -> None:
    conn = ServerConnection(channel_max=100, frame_max=65536, heartbeat_s=0)
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(start_ok())
    conn.data_to_send()
    conn.accept_auth()
    payload = struct.pack(">HHHIH", 10, 30, 100, 65536, 0)
    assert conn.data_to_send() == struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"
