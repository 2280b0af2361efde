"""Server side of an AMQP 0-9-1 connection, sans-IO.

Theory of operation
-------------------
``receive_data(bytes)`` feeds the frame reader and returns the events the input produced.
Everything that talks to the client (``send_method``, ``send_deliver``, ``close``...) only
queues bytes, which ``data_to_send()`` hands out coalesced into one write. Time never comes
from a clock: the server shell calls ``tick(now)`` for heartbeats.

States and their transitions live in ``connection_state.TRANSITIONS``; channels and content
assembly in ``channels`` / ``channel``; the shared state and primitives in
``connection_core``, the sending half in ``connection_output``; this module has the input,
the handshake and the decisions the layer above hands back. Errors are raised where they
are found, as typed AMQPErrors, and converted in one place, ``_fail``, following RabbitMQ's reader:

* soft error on a channel -> channel.close; that channel's frames are dropped
  until its close-ok;
* hard error -> connection.close; input is ignored except close / close-ok;
  if framing itself is lost, the close is sent and the connection is CLOSED;
* during start/secure/tune most errors close the socket with no close frame,
  except NOT_ALLOWED while tuning and ACCESS_REFUSED for clients advertising
  ``authentication_failure_close``.
"""

from __future__ import annotations

from pamqp import base, commands

from gateway.amqp import frame_writer
from gateway.amqp.connection_output import ConnectionOutput
from gateway.amqp.connection_state import (
    FINISHED_STATES,
    HANDSHAKE_STATES,
    PAUSED_STATES,
    RABBIT_STATE_NAMES,
    ConnectionInput,
    ConnectionState,
    ConnectionStateError,
)
from gateway.amqp.errors import (
    AccessRefused,
    AMQPError,
    ChannelError,
    CommandInvalid,
    NotAllowed,
    ResourceError,
    UnexpectedFrame,
    unexpected_frame_detail,
)
from gateway.amqp.events import (
    AuthRequested,
    ChannelClosed,
    ChannelMethod,
    ConnectionClosed,
    ConnectionCloseSent,
    Event,
    HeartbeatTimeout,
    ProtocolHeaderRejected,
    Publish,
    SecretUpdateRequested,
    VHostOpenRequested,
)
from gateway.amqp.frame_reader import (
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    ProtocolHeaderReceived,
    RawFrame,
)
from gateway.amqp.heartbeat import HeartbeatAction
from gateway.amqp.methods import (
    check_tune_value,
    connection_close,
    decode_method,
    method_ids,
    method_index,
)
from gateway.amqp.sasl import EXTERNAL, as_bytes, parse_response

FRAME_MIN_SIZE = 4096  # spec minimum for a negotiated frame_max
CHANNEL_MIN = 1
PAUSED_BUFFER_MAX_BYTES = 1 << 20  # input held while awaiting an auth/vhost decision

_CLOSE_INDEX = commands.Connection.Close.index
_CLOSE_OK_INDEX = commands.Connection.CloseOk.index


class ServerConnection(ConnectionOutput):
    """One client connection's protocol state; see the module docstring."""

    # ----------------------------------------------------------------- input

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes read from the socket; returns the events they completed."""
        events: list[Event] = []
        if self.closed:
            return events
        if data:
            self._heartbeat.received = True
            self._reader.feed(data)
        while not self.closed:
            if self.state in PAUSED_STATES:
                if self._reader.buffered_bytes > PAUSED_BUFFER_MAX_BYTES:
                    self._abort(ResourceError("too much input during the handshake"), events)
                break
            if self.state is ConnectionState.OPEN:
                # The hot path: whole publishes (method, header, body) and acks, a read's
                # worth in one call; then a publish at a time, for the one whose error the
                # channel reports.
                channels = self._channels
                if self._reader.take_inbound(
                    channels.accepts_publish, channels.max_message_size, Publish, _ack, events
                ):
                    continue
                publish = self._reader.next_publish(channels.accepts_publish)
                if publish is not None:
                    try:
                        self._channels.on_publish(publish, events)
                    except AMQPError as err:
                        self._fail(err, publish.channel, events)
                    continue
            item: RawFrame | ProtocolHeaderReceived | None = None
            try:
                item = self._reader.next_frame()
                if item is None:
                    break
                if isinstance(item, ProtocolHeaderReceived):
                    self._on_protocol_header(item, events)
                else:
                    self._on_frame(item, events)
            except AMQPError as err:
                self._fail(err, item.channel if isinstance(item, RawFrame) else 0, events)
        return events

    def _on_protocol_header(self, item: ProtocolHeaderReceived, events: list[Event]) -> None:
        if not item.supported:
            # RabbitMQ answers with the header it does speak, then closes.
            self._emit(PROTOCOL_HEADER)
            self._move(ConnectionInput.ABORT)
            events.append(ProtocolHeaderRejected(item.raw))
            return
        self._move(ConnectionInput.HEADER)
        start = commands.Connection.Start(
            version_major=0,
            version_minor=9,
            server_properties=self.server_properties,
            mechanisms=" ".join(self.mechanisms),
            locales="en_US",
        )
        self._emit(frame_writer.method(0, start))

    def _on_frame(self, frame: RawFrame, events: list[Event]) -> None:
        frame_type, channel, payload = frame
        if frame_type == FRAME_HEARTBEAT:
            if channel != 0:
                raise UnexpectedFrame(unexpected_frame_detail(frame_type, payload))
            return  # arrival is what counts; recorded in receive_data
        if self.state is ConnectionState.CLOSING:
            self._on_frame_while_closing(frame, events)
        elif channel == 0:
            if frame_type != FRAME_METHOD:
                raise UnexpectedFrame(unexpected_frame_detail(frame_type, payload))
            method = decode_method(payload)
            try:
                self._on_connection_method(method, events)
            except AMQPError as err:
                # RabbitMQ blames the method being handled when none was named.
                raise err.with_method(*method_ids(method)) from None
        elif self.state is not ConnectionState.OPEN:
            raise UnexpectedFrame(unexpected_frame_detail(frame_type, payload))
        else:
            self._channels.on_frame(frame, events)

    def _on_frame_while_closing(self, frame: RawFrame, events: list[Event]) -> None:
        # After our connection.close only close / close-ok matter (rabbit_reader).
        if frame.channel != 0 or frame.frame_type != FRAME_METHOD:
            return
        index = method_index(frame.payload)
        if index == _CLOSE_OK_INDEX:
            self._abort(self._close_error, events, ConnectionInput.CLOSE_OK)
        elif index == _CLOSE_INDEX:
            self._emit(frame_writer.method(0, commands.Connection.CloseOk()))
            self._abort(self._close_error, events, ConnectionInput.CLIENT_CLOSE)

    def _on_connection_method(self, method: base.Frame, events: list[Event]) -> None:
        state = self.state
        if isinstance(method, commands.Connection.StartOk) and state is ConnectionState.START_SENT:
            events.append(self._on_start_ok(method))
        elif isinstance(method, commands.Connection.TuneOk) and state is ConnectionState.TUNE_SENT:
            self._on_tune_ok(method)
        elif isinstance(method, commands.Connection.Open) and state is ConnectionState.AWAIT_OPEN:
            self._move(ConnectionInput.OPEN)
            self.vhost = method.virtual_host
            events.append(VHostOpenRequested(method.virtual_host))
        elif isinstance(method, commands.Connection.Close) and state is ConnectionState.OPEN:
            self._emit(frame_writer.method(0, commands.Connection.CloseOk()))
            self._move(ConnectionInput.CLIENT_CLOSE)
            events.append(
                ConnectionClosed(
                    method.reply_code or 0,
                    str(method.reply_text or ""),
                    method.class_id or 0,
                    method.method_id or 0,
                    by_client=True,
                )
            )
        elif isinstance(method, commands.Connection.UpdateSecret) and state is ConnectionState.OPEN:
            secret = as_bytes(method.new_secret or b"")
            events.append(SecretUpdateRequested(secret, str(method.reason or "")))
        else:
            name = RABBIT_STATE_NAMES.get(state, state.value)
            raise ChannelError(f"unexpected method in connection state {name}", *method_ids(method))

    def _on_start_ok(self, method: commands.Connection.StartOk) -> AuthRequested:
        properties = method.client_properties if isinstance(method.client_properties, dict) else {}
        capabilities = properties.get("capabilities")
        self.client_properties = properties
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        mechanism = str(method.mechanism)
        if mechanism not in self.mechanisms:
            raise CommandInvalid(f"unknown authentication mechanism '{mechanism}'", 10, 11)
        if mechanism == EXTERNAL:  # the response is ignored, as rabbit_auth_mechanism_ssl does
            username, password = self._external_login, b""
        else:
            username, password = parse_response(mechanism, as_bytes(method.response or b""))
        self.mechanism, self.username = mechanism, username
        self._move(ConnectionInput.START_OK)
        return AuthRequested(mechanism, username, password, properties)

    def _on_tune_ok(self, method: commands.Connection.TuneOk) -> None:
        frame_max = check_tune_value(
            "frame_max", FRAME_MIN_SIZE, self.server_frame_max, method.frame_max
        )
        channel_max = check_tune_value(
            "channel_max", CHANNEL_MIN, self._channels.channel_max, method.channel_max
        )
        self.frame_max = self._reader.frame_max = frame_max
        self._channels.channel_max = channel_max
        # Taken as sent, as RabbitMQ does: the client already chose the lower
        # non-zero of the two proposals (methods.negotiate).
        self.heartbeat_s = self._heartbeat.interval_s = method.heartbeat
        self._move(ConnectionInput.TUNE_OK)

    # ---------------------------------------------------------------- errors

    def _fail(self, error: AMQPError, channel: int, events: list[Event]) -> None:
        """Answer an error the way RabbitMQ's reader does in the current state."""
        state = self.state
        if state is ConnectionState.CLOSING:
            if self._reader.broken:
                self._abort(self._close_error, events)
            return  # a close is already on its way
        if not error.hard and channel != 0 and state is ConnectionState.OPEN:
            if self._channels.close(channel, error):
                events.append(ChannelClosed(channel, error))
            return
        if state in HANDSHAKE_STATES and not (
            state is ConnectionState.TUNE_SENT and isinstance(error, NotAllowed)
        ):
            self._abort(error, events)
        elif self._reader.broken:
            # Framing is lost: say why, but nothing more from the client is readable.
            self._emit(frame_writer.method(0, connection_close(error)))
            self._abort(error, events)
        else:
            self._send_close(error)
            events.append(ConnectionCloseSent(error))

    # ------------------------------------------------ decisions from above

    def _expect_decision(self, state: ConnectionState, name: str) -> bool:
        if self.state in FINISHED_STATES:
            return False  # closed meanwhile (e.g. by close()): nothing to do
        if self.state is not state:
            raise ConnectionStateError(f"{name} in state {self.state.value}")
        return True

    def accept_auth(self) -> list[Event]:
        """Credentials are good: send connection.tune and resume reading."""
        if not self._expect_decision(ConnectionState.SECURE, "accept_auth"):
            return []
        self._move(ConnectionInput.AUTH_ACCEPTED)
        tune = commands.Connection.Tune(
            channel_max=self._channels.channel_max,
            frame_max=self.server_frame_max,
            heartbeat=self.server_heartbeat_s,
        )
        self._emit(frame_writer.method(0, tune))
        return self.receive_data(b"")

    def reject_auth(self, reason: str) -> list[Event]:
        """Credentials are bad; ``reason`` goes to the event (logs), not to the client."""
        if not self._expect_decision(ConnectionState.SECURE, "reject_auth"):
            return []
        events: list[Event] = []
        if self.supports("authentication_failure_close"):
            safe = AccessRefused(
                f"Login was refused using authentication mechanism {self.mechanism}. "
                "For details see the broker logfile."
            )
            self._send_close(safe)
            events.append(ConnectionCloseSent(safe))
        else:
            self._abort(AccessRefused(f"{self.mechanism} login refused: {reason}"), events)
        return events

    def accept_vhost(self) -> list[Event]:
        """The vhost exists and the user may use it: send open-ok, resume reading."""
        if not self._expect_decision(ConnectionState.OPENING, "accept_vhost"):
            return []
        self._move(ConnectionInput.VHOST_ACCEPTED)
        self._emit(frame_writer.method(0, commands.Connection.OpenOk()))
        return self.receive_data(b"")

    def reject_vhost(self, error: AMQPError | None = None) -> list[Event]:
        """Refuse connection.open (default: 530 "NOT_ALLOWED - vhost x not found")."""
        if not self._expect_decision(ConnectionState.OPENING, "reject_vhost"):
            return []
        error = error or NotAllowed(f"vhost {self.vhost} not found")
        error.with_method(*method_ids(commands.Connection.Open))
        self._send_close(error)
        return [ConnectionCloseSent(error)]

    def accept_secret_update(self) -> bool:
        """The new secret is good: connection.update-secret-ok (False if closed meanwhile)."""
        return self.send_method(0, commands.Connection.UpdateSecretOk())

    def refuse_secret_update(
        self, detail: str = "New secret was refused by one of the backends"
    ) -> list[Event]:
        """The new secret is refused: rabbit_reader closes the connection with 530
        NOT_ALLOWED naming connection.update-secret ("Secret update failed" when a backend
        erred rather than refused)."""
        if self.state is not ConnectionState.OPEN:
            return []
        error = NotAllowed(detail, *method_ids(commands.Connection.UpdateSecret))
        self._send_close(error)
        return [ConnectionCloseSent(error)]

    # ------------------------------------------------------------- heartbeats

    def tick(self, now: float) -> bool:
        """Drive heartbeats (``now``: seconds from any monotonic origin; call at least every
        ``heartbeat_s / 2``). True when a heartbeat frame was queued (flush data_to_send()).
        After two intervals without a byte from the client the connection is dead, as in
        RabbitMQ: the state becomes CLOSED and ``timed_out`` holds the HeartbeatTimeout."""
        if self.state is ConnectionState.CLOSED or self.state in HANDSHAKE_STATES:
            return False
        action = self._heartbeat.check(now)
        if action is HeartbeatAction.TIMED_OUT:
            self._move(ConnectionInput.ABORT)
            self.timed_out = HeartbeatTimeout(float(self.heartbeat_s))
            return False
        if action is HeartbeatAction.SEND:
            self._output.parts.append(frame_writer.HEARTBEAT)
            return True
        return False


def _ack(channel: int, delivery_tag: int, multiple: bool) -> Event:
    """A basic.ack cut by the fast path: the event the frame-by-frame path makes of it."""
    return ChannelMethod(channel, commands.Basic.Ack(delivery_tag, multiple))
