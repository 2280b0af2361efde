"""The state every part of the sans-IO server connection shares, and its primitives:
``ConnectionCore`` holds what was proposed and negotiated (frame_max, heartbeat, the
client's properties and capabilities, the user and vhost), the connection's state in
``connection_state.TRANSITIONS`` and its parts (frame reader, output queue, channel table,
heartbeat monitor); it moves the state (``_move``), queues bytes (``_emit``) and closes
(``_send_close``, ``_abort``). ``ConnectionOutput`` (connection_output.py) adds what the
layer above sends, ``ServerConnection`` (connection.py) the input and the handshake.
"""

from __future__ import annotations

from typing import Any

from gateway.amqp import frame_writer
from gateway.amqp.channels import ChannelTable
from gateway.amqp.connection_state import ConnectionInput, ConnectionState, next_state
from gateway.amqp.errors import AMQPError
from gateway.amqp.events import ConnectionClosed, Event, HeartbeatTimeout
from gateway.amqp.frame_reader import FrameReader
from gateway.amqp.heartbeat import HeartbeatMonitor
from gateway.amqp.methods import connection_close, server_properties_table
from gateway.amqp.output import Output
from gateway.amqp.sasl import EXTERNAL, MECHANISMS

DEFAULT_CHANNEL_MAX = 2047
DEFAULT_FRAME_MAX = 131072
DEFAULT_HEARTBEAT_S = 60
DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024  # RabbitMQ 3.x's default max_message_size
INITIAL_FRAME_MAX = 8192  # before tune-ok (RabbitMQ 4's FRAME_MIN_SIZE; fits OAuth tokens)


class ConnectionCore:
    """One client connection's protocol state and primitives; see the module docstring."""

    def __init__(
        self,
        *,
        channel_max: int = DEFAULT_CHANNEL_MAX,
        frame_max: int = DEFAULT_FRAME_MAX,
        heartbeat_s: int = DEFAULT_HEARTBEAT_S,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        version: str = "0.1.0",
        server_properties: dict[str, Any] | None = None,
        external_login: str | None = None,
    ) -> None:
        self.state = ConnectionState.AWAIT_HEADER
        # EXTERNAL is offered when the shell passes the verified client certificate's name.
        self.mechanisms: tuple[str, ...] = (
            MECHANISMS if external_login is None else (*MECHANISMS, EXTERNAL)
        )
        self._external_login = external_login or ""
        # What we propose in connection.tune.
        self.server_channel_max = channel_max
        self.server_frame_max = frame_max
        self.server_heartbeat_s = heartbeat_s
        # Negotiated values (frame_max before tune-ok: RabbitMQ's initial size).
        self.frame_max = INITIAL_FRAME_MAX
        self.heartbeat_s = 0
        self.client_properties: dict[str, Any] = {}
        self.client_capabilities: dict[str, Any] = {}
        self.mechanism = ""
        self.username = ""
        self.vhost = ""
        self.server_properties = server_properties_table(version, server_properties)
        self._reader = FrameReader(INITIAL_FRAME_MAX)
        self._output = Output()
        self._channels = ChannelTable(self._emit, channel_max, max_message_size)
        self._heartbeat = HeartbeatMonitor()
        self._close_error: AMQPError = AMQPError(200, "")
        self.timed_out: HeartbeatTimeout | None = None

    @property
    def closed(self) -> bool:
        """Terminal: flush data_to_send() and close the socket."""
        return self.state is ConnectionState.CLOSED

    @property
    def close_awaited(self) -> AMQPError | None:
        """The error of the connection.close we sent while its close-ok is awaited."""
        return self._close_error if self.state is ConnectionState.CLOSING else None

    @property
    def channel_max(self) -> int:
        return self._channels.channel_max

    # ---------------------------------------------------------------- primitives

    def _abort(
        self,
        error: AMQPError,
        events: list[Event],
        event: ConnectionInput = ConnectionInput.ABORT,
    ) -> None:
        """Move to CLOSED and tell the layer above why."""
        self._move(event)
        events.append(
            ConnectionClosed(
                error.reply_code, error.reply_text, error.class_id, error.method_id, by_client=False
            )
        )

    def _send_close(self, error: AMQPError) -> None:
        self._close_error = error
        self._channels.clear()
        self._emit(frame_writer.method(0, connection_close(error)))
        self._move(ConnectionInput.SEND_CLOSE)

    def _move(self, event: ConnectionInput) -> None:
        self.state = next_state(self.state, event)

    def _emit(self, data: bytes) -> None:
        self._output.parts.append(data)
        self._heartbeat.sent = True

    def supports(self, capability: str) -> bool:
        """Whether the client advertised ``capability`` (e.g. consumer_cancel_notify)."""
        return self.client_capabilities.get(capability) is True

    @property
    def consumer_cancel_notify(self) -> bool:
        return self.supports("consumer_cancel_notify")
