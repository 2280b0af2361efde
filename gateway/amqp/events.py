"""Events a ServerConnection hands to the layer above.

Each is a plain value: the server shell decides what to do (check a password,
look up a vhost, route a publish) and calls back into the connection
(``accept_auth()``, ``send_method()``...). Events are returned in arrival order;
handle them in that order (a ChannelCloseRequested before a later ChannelOpened
on the same number).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pamqp import base, commands, header

from gateway.amqp import property_bytes
from gateway.amqp.errors import AMQPSyntaxError, erlang_binary
from gateway.amqp.publish_cut import properties_well_formed

if TYPE_CHECKING:
    from gateway.amqp.errors import AMQPError

FieldTable = dict[str, Any]

_NO_CONTENT_HEAD = struct.pack(">HHQ", 60, 0, 0)


def decode_properties(properties_bytes: bytes) -> commands.Basic.Properties:
    """Decode raw content-header property bytes (flags + list) with pamqp.

    Raises AMQPSyntaxError (hard, class 60 / method 40) when they are malformed.
    """
    content_header = header.ContentHeader()
    try:
        try:
            content_header.unmarshal(_NO_CONTENT_HEAD + properties_bytes)
        except (ValueError, OverflowError, OSError, struct.error):
            if not properties_well_formed(properties_bytes):
                raise
            # What RabbitMQ decodes but pamqp does not (a shortstr that is not UTF-8, the
            # flag-continuation bit, a timestamp beyond a datetime's range: AMQP's are 64-bit
            # integers) is read from a copy pamqp takes; the bytes stay as sent.
            content_header.unmarshal(_NO_CONTENT_HEAD + property_bytes.readable(properties_bytes))
    except Exception as err:  # pamqp raises struct/Value/Overflow/Recursion errors
        detail = f"cannot decode content properties {erlang_binary(properties_bytes[:64], False)}"
        raise AMQPSyntaxError(detail, 60, 40) from err
    properties: commands.Basic.Properties = content_header.properties
    return properties


@dataclass(frozen=True, slots=True)
class ProtocolHeaderRejected:
    """The client spoke another protocol; our header was queued, the connection is closed."""

    received: bytes


@dataclass(frozen=True, slots=True)
class AuthRequested:
    """connection.start-ok: check the credentials, then accept_auth() or reject_auth().

    ``password`` is the raw bytes the client sent (hashing needs them exactly);
    ``username`` is decoded as UTF-8 with replacement characters.
    """

    mechanism: str
    username: str
    password: bytes
    client_properties: FieldTable


@dataclass(frozen=True, slots=True)
class VHostOpenRequested:
    """connection.open: check the vhost, then accept_vhost() or reject_vhost()."""

    vhost: str


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    """channel.open was answered with open-ok."""

    channel: int


@dataclass(frozen=True, slots=True)
class ChannelCloseRequested:
    """The client sent channel.close: clean up, then call channel_close_ok(channel)."""

    channel: int
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The connection itself closed a channel with a soft error (channel.close sent).

    Stop delivering on it; the number is reusable after the client's close-ok.
    """

    channel: int
    error: AMQPError


@dataclass(frozen=True, slots=True)
class SecretUpdateRequested:
    """connection.update-secret on an open connection: decide, then call
    accept_secret_update() or refuse_secret_update().

    ``new_secret`` is the raw bytes the client sent (a password or a token)."""

    new_secret: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class ChannelMethod:
    """Any client method other than basic.publish and channel open/close (channel >= 1)."""

    channel: int
    method: base.Frame


class Publish:
    """An assembled basic.publish: its fields, raw property bytes and body.

    ``properties_bytes`` are exactly what the client sent (stored verbatim,
    delivered without re-encoding); ``properties`` decodes them on first use.
    """

    __slots__ = (
        "_properties",
        "body",
        "channel",
        "exchange",
        "immediate",
        "mandatory",
        "properties_bytes",
        "routing_key",
    )

    def __init__(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        immediate: bool,
        properties_bytes: bytes,
        body: bytes | bytearray,
    ) -> None:
        self.channel = channel
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.properties_bytes = properties_bytes
        self.body = body
        self._properties: commands.Basic.Properties | None = None

    @property
    def properties(self) -> commands.Basic.Properties:
        if self._properties is None:
            self._properties = decode_properties(self.properties_bytes)
        return self._properties

    @property
    def method(self) -> commands.Basic.Publish:
        """The pamqp method, built on demand (the hot path never needs it)."""
        # Set after construction: pamqp's name pattern is stricter than RabbitMQ's.
        method = commands.Basic.Publish()
        method.exchange, method.routing_key = self.exchange, self.routing_key
        method.mandatory, method.immediate = self.mandatory, self.immediate
        return method

    def __repr__(self) -> str:
        return (
            f"Publish(channel={self.channel}, exchange={self.exchange!r}, "
            f"routing_key={self.routing_key!r}, body_size={len(self.body)})"
        )


@dataclass(frozen=True, slots=True)
class ConnectionCloseSent:
    """We sent connection.close for ``error``; await close-ok (or a timeout) then close."""

    error: AMQPError


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """Terminal: flush data_to_send() and close the socket.

    ``by_client`` is True when the client sent connection.close (reply fields are
    theirs); otherwise the fields describe our error (the close frame may or may
    not have been sent, as RabbitMQ does during the handshake).
    """

    reply_code: int
    reply_text: str
    class_id: int
    method_id: int
    by_client: bool


@dataclass(frozen=True, slots=True)
class HeartbeatTimeout:
    """Two heartbeat intervals without any byte from the client: the connection is dead."""

    timeout_s: float


Event = (
    ProtocolHeaderRejected
    | AuthRequested
    | VHostOpenRequested
    | ChannelOpened
    | ChannelCloseRequested
    | ChannelClosed
    | ChannelMethod
    | SecretUpdateRequested
    | Publish
    | ConnectionCloseSent
    | ConnectionClosed
    | HeartbeatTimeout
)
