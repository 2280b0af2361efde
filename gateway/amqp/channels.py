"""The channels of one open connection: frame routing by channel number.

Handles channel.open / channel.close / close-ok itself, assembles
basic.publish content per channel, and turns every other method into a
ChannelMethod event. Errors are raised as AMQPError for the connection to
convert (soft ones close the channel, hard ones the connection).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pamqp import base, commands

from gateway.amqp import frame_writer, unchecked
from gateway.amqp.channel import (
    BASIC_CLASS_ID,
    PUBLISH_INDEX,
    Channel,
    ChannelInput,
    ChannelState,
    ContentState,
    decode_publish,
)
from gateway.amqp.errors import (
    AMQPError,
    ChannelError,
    CommandInvalid,
    NotAllowed,
    UnexpectedFrame,
)
from gateway.amqp.events import (
    ChannelCloseRequested,
    ChannelMethod,
    ChannelOpened,
    Event,
    Publish,
)
from gateway.amqp.frame_reader import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    PublishFrames,
    RawFrame,
)
from gateway.amqp.methods import channel_close, decode_method, method_ids, method_index

_CONTENT_HEAD = struct.Struct(">HHQ")  # class id, weight, body size
# RabbitMQ's channel-id is empty (pamqp's default, and only allowed value, is "0").
_OPEN_OK = unchecked.build(commands.Channel.OpenOk, channel_id="")
_CLOSE_INDEX = commands.Channel.Close.index
_CLOSE_OK_INDEX = commands.Channel.CloseOk.index
# Client methods the server never accepts on a channel (RabbitMQ: "unimplemented method").
_REFUSED = (
    commands.Channel.CloseOk,
    commands.Basic.Deliver,
    commands.Basic.GetOk,
    commands.Basic.GetEmpty,
    commands.Basic.Return,
)


class ChannelTable:
    """Open channels by number, bounded by the negotiated channel_max."""

    def __init__(
        self, emit: Callable[[bytes], None], channel_max: int, max_message_size: int
    ) -> None:
        self._emit = emit
        self.channel_max = channel_max
        self.max_message_size = max_message_size
        self._channels: dict[int, Channel] = {}

    def __len__(self) -> int:
        return len(self._channels)

    def is_open(self, number: int) -> bool:
        channel = self._channels.get(number)
        return channel is not None and channel.state is ChannelState.OPEN

    def clear(self) -> None:
        self._channels.clear()

    def accepts_publish(self, number: int) -> bool:
        """Whether a whole publish on this channel may take the fast path (see on_publish)."""
        channel = self._channels.get(number)
        return (
            channel is not None
            and channel.state is ChannelState.OPEN
            and channel.content is ContentState.AWAIT_METHOD
        )

    def on_publish(self, frames: PublishFrames, events: list[Event]) -> None:
        """A publish cut in one step: the same checks and outcome as three frames. The
        channel awaits a method before and after (accepts_publish), so only a body over
        max_message_size needs the frame-by-frame steps (for their error)."""
        number, method, properties, body = frames
        head = decode_publish(method)
        if len(body) > self.max_message_size:
            channel = self._channels[number]
            channel.on_publish(head)
            header = _CONTENT_HEAD.pack(BASIC_CLASS_ID, 0, len(body)) + properties
            channel.on_header(header, self.max_message_size)  # raises
        events.append(Publish(number, *head, properties, body))

    def on_frame(self, frame: RawFrame, events: list[Event]) -> None:
        """Route one frame of a channel other than 0."""
        frame_type, number, payload = frame
        channel = self._channels.get(number)
        if channel is None:
            self._open(frame, events)
        elif channel.state is not ChannelState.OPEN:
            self._on_closing_frame(channel, frame)
        elif frame_type == FRAME_HEADER:
            publish = channel.on_header(payload, self.max_message_size)
            if publish is not None:
                events.append(publish)
        elif frame_type == FRAME_BODY:
            publish = channel.on_body(payload)
            if publish is not None:
                events.append(publish)
        elif method_index(payload) == PUBLISH_INDEX:
            channel.on_publish(decode_publish(payload))  # the hot path: no pamqp object
        else:
            channel.on_method()
            self._on_method(channel, decode_method(payload), events)

    def _open(self, frame: RawFrame, events: list[Event]) -> None:
        frame_type, number, payload = frame
        # RabbitMQ creates the channel on any frame, so the limit is checked first. It counts
        # open channels, whatever their numbers: channel 65535 may be the first one.
        if len(self._channels) >= self.channel_max:
            raise NotAllowed(
                f"number of channels opened ({len(self._channels)}) has reached "
                f"the negotiated channel_max ({self.channel_max})"
            )
        if frame_type != FRAME_METHOD:
            raise UnexpectedFrame("expected method frame, got non method frame instead")
        method = decode_method(payload)
        if isinstance(method, commands.Channel.CloseOk):
            return  # late close-ok for a channel we already forgot
        if not isinstance(method, commands.Channel.Open):
            raise ChannelError("expected 'channel.open'", *method_ids(method))
        self._channels[number] = Channel(number)
        self._emit(frame_writer.method(number, _OPEN_OK))
        events.append(ChannelOpened(number))

    def _on_closing_frame(self, channel: Channel, frame: RawFrame) -> None:
        # Dropped as RabbitMQ does, except what ends our closing handshake.
        if channel.state is not ChannelState.CLOSING or frame.frame_type != FRAME_METHOD:
            return
        index = method_index(frame.payload)
        if index == _CLOSE_OK_INDEX:
            self._free(channel, ChannelInput.CLIENT_CLOSE_OK)
        elif index == _CLOSE_INDEX:
            self._emit(frame_writer.method(channel.number, commands.Channel.CloseOk()))
            self._free(channel, ChannelInput.CLIENT_CLOSE)

    def _on_method(self, channel: Channel, method: base.Frame, events: list[Event]) -> None:
        if isinstance(method, commands.Channel.Close):
            channel.move(ChannelInput.CLIENT_CLOSE)
            events.append(
                ChannelCloseRequested(
                    channel.number,
                    method.reply_code or 0,
                    str(method.reply_text or ""),
                    method.class_id or 0,
                    method.method_id or 0,
                )
            )
        elif isinstance(method, commands.Channel.Open):
            raise ChannelError("second 'channel.open' seen", *method_ids(method))
        elif isinstance(method, _REFUSED) or method.name.startswith("Connection."):
            raise CommandInvalid("unimplemented method", *method_ids(method))
        else:
            events.append(ChannelMethod(channel.number, method))

    def _free(self, channel: Channel, event: ChannelInput) -> None:
        channel.move(event)
        del self._channels[channel.number]

    def close(self, number: int, error: AMQPError) -> bool:
        """Send channel.close for a soft error; frames are dropped until close-ok."""
        channel = self._channels.get(number)
        if channel is None or channel.state is not ChannelState.OPEN:
            return False
        channel.move(ChannelInput.SERVER_CLOSE)
        self._emit(frame_writer.method(number, channel_close(error)))
        return True

    def close_ok(self, number: int) -> bool:
        """Answer a client's channel.close once the layer above has cleaned up."""
        channel = self._channels.get(number)
        if channel is None or channel.state is not ChannelState.CLOSE_REQUESTED:
            return False
        self._free(channel, ChannelInput.SERVER_CLOSE_OK)
        self._emit(frame_writer.method(number, commands.Channel.CloseOk()))
        return True
