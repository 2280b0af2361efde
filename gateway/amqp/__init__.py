"""Sans-IO AMQP 0-9-1 protocol layer: bytes in, events out, frames out as bytes.

No module here does I/O or reads a clock; the server shell feeds
``ServerConnection.receive_data()`` and writes ``data_to_send()``.
"""

from gateway.amqp import errors, frame_writer
from gateway.amqp.connection import ServerConnection
from gateway.amqp.connection_state import ConnectionState, ConnectionStateError
from gateway.amqp.errors import AMQPError
from gateway.amqp.events import (
    AuthRequested,
    ChannelClosed,
    ChannelCloseRequested,
    ChannelMethod,
    ChannelOpened,
    ConnectionClosed,
    ConnectionCloseSent,
    Event,
    HeartbeatTimeout,
    ProtocolHeaderRejected,
    Publish,
    SecretUpdateRequested,
    VHostOpenRequested,
    decode_properties,
)
from gateway.amqp.frame_reader import FrameReader

__all__ = [
    "AMQPError",
    "AuthRequested",
    "ChannelCloseRequested",
    "ChannelClosed",
    "ChannelMethod",
    "ChannelOpened",
    "ConnectionCloseSent",
    "ConnectionClosed",
    "ConnectionState",
    "ConnectionStateError",
    "Event",
    "FrameReader",
    "HeartbeatTimeout",
    "ProtocolHeaderRejected",
    "Publish",
    "SecretUpdateRequested",
    "ServerConnection",
    "VHostOpenRequested",
    "decode_properties",
    "errors",
    "frame_writer",
]
