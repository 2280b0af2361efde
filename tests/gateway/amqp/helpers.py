"""A minimal AMQP client made of pamqp calls, to drive ServerConnection in tests."""

from __future__ import annotations

from typing import Any

from pamqp import body, commands, header
from pamqp import frame as pamqp_frame

from gateway.amqp import ServerConnection, events
from gateway.amqp.frame_reader import PROTOCOL_HEADER

DEFAULT_CAPABILITIES: dict[str, Any] = {
    "authentication_failure_close": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
}


def frame(channel: int, value: Any) -> bytes:
    return pamqp_frame.marshal(value, channel)


def parse(data: bytes) -> list[tuple[int, Any]]:
    """Decode everything the server sent, the way a client would."""
    out = []
    while data:
        consumed, channel, value = pamqp_frame.unmarshal(data)
        out.append((channel, value))
        data = data[consumed:]
    return out


def start_ok(
    user: str = "guest",
    password: str = "guest",
    capabilities: dict[str, Any] | None = None,
    mechanism: str = "PLAIN",
    response: str | None = None,
) -> bytes:
    caps = DEFAULT_CAPABILITIES if capabilities is None else capabilities
    return frame(
        0,
        commands.Connection.StartOk(
            client_properties={"product": "test", "capabilities": caps},
            mechanism=mechanism,
            response=f"\0{user}\0{password}" if response is None else response,
        ),
    )


def handshake(
    conn: ServerConnection | None = None,
    *,
    capabilities: dict[str, Any] | None = None,
    tune: tuple[int, int, int] = (2047, 131072, 60),
    vhost: str = "/",
    **kwargs: Any,
) -> ServerConnection:
    """Run the whole start/tune/open handshake; returns an OPEN connection."""
    conn = conn or ServerConnection(**kwargs)
    assert conn.receive_data(PROTOCOL_HEADER) == []
    evs = conn.receive_data(start_ok(capabilities=capabilities))
    assert isinstance(evs[0], events.AuthRequested)
    assert conn.accept_auth() == []
    channel_max, frame_max, heartbeat = tune
    data = frame(0, commands.Connection.TuneOk(channel_max, frame_max, heartbeat))
    data += frame(0, commands.Connection.Open(vhost))
    evs = conn.receive_data(data)
    assert evs == [events.VHostOpenRequested(vhost)]
    assert conn.accept_vhost() == []
    conn.data_to_send()
    return conn


def open_channel(conn: ServerConnection, channel: int = 1) -> None:
    evs = conn.receive_data(frame(channel, commands.Channel.Open()))
    assert evs == [events.ChannelOpened(channel)]
    assert parse(conn.data_to_send())[0][1].name == "Channel.OpenOk"


def publish(
    channel: int,
    body_value: bytes,
    *,
    exchange: str = "ex",
    routing_key: str = "rk",
    properties: commands.Basic.Properties | None = None,
    frame_max: int = 131072,
    mandatory: bool = False,
) -> bytes:
    """Client-side publish: method + header + body split at frame_max - 8."""
    props = properties or commands.Basic.Properties()
    data = frame(
        channel,
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
    )
    data += frame(channel, header.ContentHeader(0, len(body_value), props))
    step = frame_max - 8
    for start in range(0, len(body_value), step):
        data += frame(channel, body.ContentBody(body_value[start : start + step]))
    return data


def close_of(data: bytes) -> Any:
    """The connection.close or channel.close in server output (None if absent)."""
    for _, value in parse(data):
        if value.name in ("Connection.Close", "Channel.Close"):
            return value
    return None
