"""Channel lifecycle, content assembly and channel-level errors."""

from __future__ import annotations

import pytest
from pamqp import body, commands, header

from gateway.amqp import ServerConnection, events
from gateway.amqp.errors import NotFound, PreconditionFailed
from tests.gateway.amqp.helpers import close_of, frame, handshake, open_channel, parse, publish


@pytest.fixture
def conn() -> ServerConnection:
    conn = handshake()
    open_channel(conn, 1)
    return conn


def test_publish_assembled_across_many_body_frames(conn: ServerConnection) -> None:
    payload = bytes(range(256)) * 100  # 25600 bytes
    data = frame(1, commands.Basic.Publish(exchange="amq.topic", routing_key="a.b", mandatory=True))
    data += frame(1, header.ContentHeader(0, len(payload), commands.Basic.Properties()))
    for start in range(0, len(payload), 1000):
        data += frame(1, body.ContentBody(payload[start : start + 1000]))
    evs = []
    for i in range(0, len(data), 7):  # byte-dribbled input
        evs += conn.receive_data(data[i : i + 7])
    assert len(evs) == 1
    pub = evs[0]
    assert isinstance(pub, events.Publish)
    assert (pub.channel, pub.exchange, pub.routing_key) == (1, "amq.topic", "a.b")
    assert (pub.mandatory, pub.immediate) == (True, False)
    assert pub.body == payload
    assert pub.method.routing_key == "a.b"


def test_zero_byte_body_completes_at_the_header(conn: ServerConnection) -> None:
    evs = conn.receive_data(publish(1, b""))
    assert len(evs) == 1 and evs[0].body == b""
    # The next method is accepted: the assembler is back to "method".
    evs = conn.receive_data(frame(1, commands.Basic.Qos(prefetch_count=5)))
    assert isinstance(evs[0], events.ChannelMethod) and evs[0].method.prefetch_count == 5


def test_two_publishes_in_one_read(conn: ServerConnection) -> None:
    evs = conn.receive_data(publish(1, b"one") + publish(1, b"two") + publish(1, b""))
    assert [e.body for e in evs] == [b"one", b"two", b""]


def _hard_close(conn: ServerConnection) -> commands.Connection.Close:
    close = close_of(conn.data_to_send())
    assert close is not None and close.name == "Connection.Close"
    return close


@pytest.mark.parametrize(
    ("data", "code", "text", "ids"),
    [
        (
            frame(1, header.ContentHeader(0, 3, commands.Basic.Properties())),
            505,
            "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
            (0, 0),
        ),
        (
            frame(1, body.ContentBody(b"abc")),
            505,
            "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
            (0, 0),
        ),
        (
            frame(1, commands.Basic.Publish()) + frame(1, body.ContentBody(b"abc")),
            505,
            "UNEXPECTED_FRAME - expected content header for class 60, "
            "got non content header frame instead",
            (60, 40),
        ),
        (
            frame(1, commands.Basic.Publish()) + frame(1, commands.Basic.Qos()),
            505,
            "UNEXPECTED_FRAME - expected content header for class 60, "
            "got non content header frame instead",
            (60, 40),
        ),
        (
            frame(1, commands.Basic.Publish())
            + frame(1, header.ContentHeader(0, 10, commands.Basic.Properties()))
            + frame(1, commands.Basic.Qos()),
            505,
            "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
            (60, 40),
        ),
        (
            frame(1, commands.Basic.Publish())
            + frame(1, header.ContentHeader(0, 2, commands.Basic.Properties()))
            + frame(1, body.ContentBody(b"abc")),
            501,
            "FRAME_ERROR - content body frame exceeds remaining content size",
            (60, 40),
        ),
        (
            frame(1, commands.Basic.Publish())
            + b"\x02\x00\x01\x00\x00\x00\x0e\x00\x3d\x00\x00"
            + bytes(8)
            + b"\x00\x00\xce",
            505,
            "UNEXPECTED_FRAME - expected content header for class 60, got one for class 61 instead",
            (60, 40),
        ),
        (
            frame(1, commands.Basic.Publish())
            + frame(1, header.ContentHeader(0, 600_000_000, commands.Basic.Properties())),
            501,
            "FRAME_ERROR - content body size 600000000 exceeds maximum allowed size 536870912",
            (60, 40),
        ),
    ],
)
def test_content_out_of_order(
    conn: ServerConnection, data: bytes, code: int, text: str, ids: tuple[int, int]
) -> None:
    evs = conn.receive_data(data)
    close = _hard_close(conn)
    assert (close.reply_code, close.reply_text, (close.class_id, close.method_id)) == (
        code,
        text,
        ids,
    )
    assert isinstance(evs[-1], events.ConnectionCloseSent)


def test_oversized_message_is_406_and_its_body_is_dropped() -> None:
    conn = handshake(max_message_size=1000)
    open_channel(conn, 1)
    evs = conn.receive_data(publish(1, b"x" * 1001, frame_max=4096))
    assert evs == [events.ChannelClosed(1, evs[0].error)]
    assert isinstance(evs[0].error, PreconditionFailed)
    out = parse(conn.data_to_send())
    assert len(out) == 1
    ch, close = out[0]
    assert (ch, close.name, close.reply_code) == (1, "Channel.Close", 406)
    assert (
        close.reply_text
        == "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000"
    )
    assert (close.class_id, close.method_id) == (60, 40)
    # Everything on the channel is dropped until close-ok; other channels still work.
    assert conn.receive_data(publish(1, b"late")) == []
    open_channel(conn, 2)
    assert conn.receive_data(frame(1, commands.Channel.CloseOk())) == []
    assert conn.channel_is_open(2) and not conn.channel_is_open(1)
    open_channel(conn, 1)  # the number is reusable


def test_soft_error_from_above_then_frames_dropped_until_close_ok(conn: ServerConnection) -> None:
    evs = conn.receive_data(frame(1, commands.Queue.Declare(queue="q", passive=True)))
    assert isinstance(evs[0], events.ChannelMethod)
    assert conn.close_channel(1, NotFound("no queue 'q' in vhost '/'", 50, 10))
    ch, close = parse(conn.data_to_send())[0]
    assert (ch, close.reply_code, close.class_id, close.method_id) == (1, 404, 50, 10)
    assert close.reply_text == "NOT_FOUND - no queue 'q' in vhost '/'"
    assert conn.send_deliver(1, "c", 1, False, "", "q", b"\x00\x00", b"x") is False
    dropped = (
        frame(1, commands.Basic.Qos()) + publish(1, b"abc") + frame(1, body.ContentBody(b"zz"))
    )
    assert conn.receive_data(dropped) == []
    assert conn.data_to_send() == b""
    assert conn.receive_data(frame(1, commands.Channel.CloseOk())) == []
    open_channel(conn, 1)


def test_crossing_channel_close(conn: ServerConnection) -> None:
    conn.close_channel(1, NotFound("no exchange 'x' in vhost '/'", 60, 40))
    conn.data_to_send()
    assert conn.receive_data(frame(1, commands.Channel.Close(200, "bye", 0, 0))) == []
    assert [(ch, m.name) for ch, m in parse(conn.data_to_send())] == [(1, "Channel.CloseOk")]
    assert not conn.channel_is_open(1)
    # a late close-ok for the forgotten channel is ignored
    assert conn.receive_data(frame(1, commands.Channel.CloseOk())) == []
    assert conn.state.value == "open"


def test_client_channel_close_waits_for_the_layer_above(conn: ServerConnection) -> None:
    evs = conn.receive_data(frame(1, commands.Channel.Close(200, "Goodbye", 0, 0)))
    assert evs == [events.ChannelCloseRequested(1, 200, "Goodbye", 0, 0)]
    assert conn.data_to_send() == b""
    assert conn.send_deliver(1, "c", 1, False, "", "q", b"\x00\x00", b"x") is False
    assert conn.channel_close_ok(1) is True
    assert parse(conn.data_to_send())[0][1].name == "Channel.CloseOk"
    assert conn.channel_close_ok(1) is False
    open_channel(conn, 1)


@pytest.mark.parametrize(
    ("data", "code", "text", "ids"),
    [
        (frame(2, commands.Basic.Qos()), 504, "CHANNEL_ERROR - expected 'channel.open'", (60, 10)),
        (
            frame(1, commands.Channel.Open()),
            504,
            "CHANNEL_ERROR - second 'channel.open' seen",
            (20, 10),
        ),
        (
            frame(0, commands.Basic.Qos()),
            504,
            "CHANNEL_ERROR - unexpected method in connection state running",
            (60, 10),
        ),
        (
            frame(0, body.ContentBody(b"x")),
            505,
            'UNEXPECTED_FRAME - type 3, all octets = <<"x">>',
            (0, 0),
        ),
        (
            b"\x08\x00\x01\x00\x00\x00\x00\xce",
            505,
            "UNEXPECTED_FRAME - type 8, all octets = <<>>",
            (0, 0),
        ),
        (
            frame(1, commands.Basic.Deliver("c", 1, False, "", "q")),
            503,
            "COMMAND_INVALID - unimplemented method",
            (60, 60),
        ),
        (
            frame(1, commands.Connection.Close(200, "", 0, 0)),
            503,
            "COMMAND_INVALID - unimplemented method",
            (10, 50),
        ),
    ],
)
def test_channel_errors(
    conn: ServerConnection, data: bytes, code: int, text: str, ids: tuple[int, int]
) -> None:
    conn.receive_data(data)
    close = _hard_close(conn)
    assert (close.reply_code, close.reply_text, (close.class_id, close.method_id)) == (
        code,
        text,
        ids,
    )
    # After a hard error only close / close-ok count.
    assert conn.receive_data(frame(5, commands.Channel.Open())) == []
    assert conn.data_to_send() == b""
    evs = conn.receive_data(frame(0, commands.Connection.Close(200, "", 0, 0)))
    assert conn.data_to_send() == frame(0, commands.Connection.CloseOk())
    assert conn.closed and evs[0].reply_code == code


def test_channel_max_counts_open_channels_not_numbers() -> None:
    """rabbit_reader: a client may open channel 65535 first (tests/diff/test_diff_limits.py)."""
    conn = handshake(tune=(2, 131072, 0))
    for number in (65535, 3000):
        open_channel(conn, number)
    conn.receive_data(frame(3000, commands.Channel.Close(200, "", 0, 0)))
    conn.channel_close_ok(3000)
    conn.data_to_send()
    open_channel(conn, 2047)  # a closed channel no longer counts
    conn.receive_data(frame(1, commands.Channel.Open()))
    close = _hard_close(conn)
    assert close.reply_text == (
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
    )


def test_channel_max_reached() -> None:
    conn = handshake(tune=(1, 131072, 0))
    open_channel(conn, 1)
    conn.receive_data(frame(1, commands.Channel.Close(200, "", 0, 0)))
    conn.receive_data(frame(2, commands.Channel.Open()))
    close = _hard_close(conn)
    assert close.reply_text == (
        "NOT_ALLOWED - number of channels opened (1) has reached the negotiated channel_max (1)"
    )


def test_channel_methods_become_events(conn: ServerConnection) -> None:
    methods = [
        commands.Basic.Qos(prefetch_count=10),
        commands.Basic.Consume(queue="q", consumer_tag="c1"),
        commands.Basic.Ack(delivery_tag=5, multiple=True),
        commands.Confirm.Select(),
        commands.Tx.Select(),
        commands.Exchange.Declare(exchange="e", exchange_type="topic", arguments={"x": 1}),
        commands.Channel.Flow(active=True),
    ]
    evs = conn.receive_data(b"".join(frame(1, m) for m in methods))
    assert [e.method.name for e in evs] == [m.name for m in methods]
    assert all(isinstance(e, events.ChannelMethod) and e.channel == 1 for e in evs)
    assert evs[2].method.delivery_tag == 5 and evs[2].method.multiple is True


def test_update_secret_is_an_event_then_ok(conn: ServerConnection) -> None:
    evs = conn.receive_data(frame(0, commands.Connection.UpdateSecret("tok", "refresh")))
    assert evs == [events.SecretUpdateRequested(b"tok", "refresh")]
    assert conn.accept_secret_update()
    assert [(n, m.name) for n, m in parse(conn.data_to_send())] == [
        (0, "Connection.UpdateSecretOk")
    ]


def test_refused_secret_closes_the_connection_530(conn: ServerConnection) -> None:
    conn.receive_data(frame(0, commands.Connection.UpdateSecret("tok", "refresh")))
    evs = conn.refuse_secret_update()
    assert [type(e) for e in evs] == [events.ConnectionCloseSent]
    close = _hard_close(conn)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530,
        "NOT_ALLOWED - New secret was refused by one of the backends",
        10,
        70,
    )
    assert conn.refuse_secret_update() == []  # already closing
    assert not conn.accept_secret_update()


def test_undecodable_method_is_frame_error(conn: ServerConnection) -> None:
    # queue.declare whose table length points past the frame
    payload = b"\x00\x32\x00\x0a\x00\x00\x01q\x00\x00\x00\x00\xff"
    data = b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce"
    conn.receive_data(data)
    close = _hard_close(conn)
    assert (close.reply_code, close.class_id, close.method_id) == (501, 50, 10)
    assert close.reply_text.startswith("FRAME_ERROR - cannot decode <<0,0,1,113,")


def test_unknown_method_id_is_command_invalid(conn: ServerConnection) -> None:
    payload = b"\x00\x3c\x03\xe7"
    conn.receive_data(b"\x01\x00\x01\x00\x00\x00\x04" + payload + b"\xce")
    close = _hard_close(conn)
    assert (close.reply_code, close.reply_text) == (
        503,
        "COMMAND_INVALID - unknown method {60,999}",
    )


def test_publish_with_bad_shortstr_is_frame_error(conn: ServerConnection) -> None:
    payload = b"\x00\x3c\x00\x28\x00\x00\x05ab"  # exchange length 5, only 2 bytes
    conn.receive_data(b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce")
    close = _hard_close(conn)
    assert (close.reply_code, close.class_id, close.method_id) == (501, 60, 40)
