"""What the layer above sends through the sans-IO server connection once it is open:
methods and prepared frames for a channel, deliveries, publisher confirms, channel and
connection closes, connection.blocked / unblocked, and holding a channel's frames back until
a reply went first. Everything only queues bytes (dropped when the channel is closing or
gone), which ``data_to_send()`` / ``take_output()`` hand out coalesced.
"""

from __future__ import annotations

from collections.abc import Sequence

from pamqp import base, commands

from gateway.amqp import frame_writer
from gateway.amqp.connection_core import ConnectionCore
from gateway.amqp.connection_state import FINISHED_STATES, ConnectionInput, ConnectionState
from gateway.amqp.errors import AMQPError


class ConnectionOutput(ConnectionCore):
    """The sending half of ``ServerConnection`` (see the module docstring)."""

    def data_to_send(self) -> bytes:
        """Everything queued since the last call, as one write (a lone part is not copied)."""
        return b"".join(self._output.take())

    def take_output(self) -> list[frame_writer.Buffer]:
        """Everything queued since the last call, as queued: large bodies are views of the
        stored message (write them with frame_writer.coalesce, a piece at a time)."""
        return self._output.take()

    def channel_is_open(self, channel: int) -> bool:
        return self.state is ConnectionState.OPEN and self._channels.is_open(channel)

    def _can_send(self, channel: int) -> bool:
        return self.state is ConnectionState.OPEN and (
            channel == 0 or self._channels.is_open(channel)
        )

    def send_method(self, channel: int, method: base.Frame) -> bool:
        """Queue a method; False (dropped) if the channel is closing or gone."""
        return self.send_frames(channel, (frame_writer.method(channel, method),))

    def send_frames(self, channel: int, frames: Sequence[frame_writer.Buffer]) -> bool:
        """Queue frames built with frame_writer (get_ok, return_...) for ``channel``."""
        # _can_send, inline: a call per delivery run saved.
        if self.state is not ConnectionState.OPEN or (
            channel != 0 and not self._channels.is_open(channel)
        ):
            return False
        self._output.add(channel, frames)
        self._heartbeat.sent = True
        return True

    def hold(self, channel: int) -> None:
        """Keep ``channel``'s frames back until release() has sent its reply: queue.delete-ok
        before the basic.cancel the deletion caused, as RabbitMQ orders them."""
        self._output.hold(channel)

    def release(self, channel: int, reply: base.Frame | None = None) -> None:
        """``reply`` (if any), then what hold() kept back; dropped if the channel is gone."""
        held = self._output.release(channel)
        if reply is not None:
            self.send_method(channel, reply)
        self.send_frames(channel, held)

    def send_deliver(
        self,
        channel: int,
        consumer_tag: str | bytes,
        delivery_tag: int,
        redelivered: bool,
        exchange: str | bytes,
        routing_key: str | bytes,
        properties_bytes: frame_writer.Buffer,
        body: frame_writer.Buffer,
    ) -> bool:
        """Queue basic.deliver with its content; False if the channel is gone."""
        # _can_send without its call (a delivery is never on channel 0).
        if self.state is not ConnectionState.OPEN or not self._channels.is_open(channel):
            return False
        frames = frame_writer.deliver(
            channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
            properties_bytes, body, self.frame_max,
        )  # fmt: skip
        self._output.add(channel, frames)  # send_frames' work, its check done above
        self._heartbeat.sent = True
        return True

    def send_ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> bool:
        """Publisher confirm (basic.ack)."""
        return self.send_frames(channel, [frame_writer.basic_ack(channel, delivery_tag, multiple)])

    def send_nack(self, channel: int, delivery_tag: int, multiple: bool = False) -> bool:
        """Negative publisher confirm (basic.nack)."""
        frames = [frame_writer.basic_nack(channel, delivery_tag, multiple)]
        return self.send_frames(channel, frames)

    def close_channel(self, channel: int, error: AMQPError) -> bool:
        """Close a channel for a soft ``error``; a hard one closes the connection."""
        if error.hard:
            self.close(error)
            return False
        return self.state is ConnectionState.OPEN and self._channels.close(channel, error)

    def channel_close_ok(self, channel: int) -> bool:
        """Finish a client's channel.close (after ChannelCloseRequested)."""
        return self.state is ConnectionState.OPEN and self._channels.close_ok(channel)

    def close(self, error: AMQPError) -> None:
        """Close the connection (e.g. 320 CONNECTION_FORCED) and await close-ok."""
        if self.state in FINISHED_STATES:
            return
        if self.state is ConnectionState.AWAIT_HEADER:
            self._move(ConnectionInput.ABORT)
            return
        self._send_close(error)

    def send_blocked(self, reason: str) -> bool:
        """connection.blocked, only to clients that advertised the capability."""
        return self._send_flow_control(commands.Connection.Blocked(reason))

    def send_unblocked(self) -> bool:
        return self._send_flow_control(commands.Connection.Unblocked())

    def _send_flow_control(self, method: base.Frame) -> bool:
        if self.state is not ConnectionState.OPEN or not self.supports("connection.blocked"):
            return False
        self._emit(frame_writer.method(0, method))
        return True
