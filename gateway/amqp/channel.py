"""Per-channel state: lifecycle and content assembly (method -> header -> body*).

Theory of operation
-------------------
A channel has two small state machines, both written as tables so that every
legal move is visible in one place and anything else is an error.

Lifecycle (``LIFECYCLE``): a channel is OPEN after channel.open. When the
client sends channel.close it becomes CLOSE_REQUESTED until the layer above has
cleaned up and calls ``channel_close_ok``; when *we* close it (a soft error) it
is CLOSING until the client's close-ok (or its own crossing close). In both
closing states every other frame on the channel is dropped, as RabbitMQ does;
FREED means the number may be opened again.

Content (``CONTENT``): basic.publish is followed by exactly one content header
and then body frames until the announced size is reached (none for an empty
body). A frame that does not fit the current state is an UNEXPECTED_FRAME (505)
with RabbitMQ's texts (rabbit_command_assembler); a body frame overrunning the
announced size is a FRAME_ERROR (501).
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from gateway.amqp import publish_cut
from gateway.amqp.errors import (
    FrameError,
    PreconditionFailed,
    PropertiesUndecodable,
    UnexpectedFrame,
    erlang_binary,
)
from gateway.amqp.events import Publish
from storage import twins

# The property check in use (its compiled twin when built); the fast path's cut_publish
# makes the same check, so a publish is checked once whichever way it arrives.
properties_well_formed = twins.pick(publish_cut.properties_well_formed)

BASIC_CLASS_ID = 60
PUBLISH_IDS = (60, 40)
PUBLISH_INDEX = 0x003C0028
# RabbitMQ's absolute cap (?MAX_MSG_SIZE); above it the header is a FRAME_ERROR.
MAX_MSG_SIZE = 536_870_912

_CONTENT_HEAD = struct.Struct(">HHQ")
_EXCHANGE_AT = 6  # basic.publish: class, method, a deprecated u16 ticket, then the exchange


class ChannelState(enum.Enum):
    OPEN = "open"
    CLOSE_REQUESTED = "close_requested"  # client sent close, awaiting our close-ok
    CLOSING = "closing"  # we sent close, awaiting the client's close-ok
    FREED = "freed"


class ChannelInput(enum.Enum):
    CLIENT_CLOSE = "client_close"
    CLIENT_CLOSE_OK = "client_close_ok"
    SERVER_CLOSE = "server_close"
    SERVER_CLOSE_OK = "server_close_ok"


LIFECYCLE: dict[tuple[ChannelState, ChannelInput], ChannelState] = {
    (ChannelState.OPEN, ChannelInput.CLIENT_CLOSE): ChannelState.CLOSE_REQUESTED,
    (ChannelState.OPEN, ChannelInput.SERVER_CLOSE): ChannelState.CLOSING,
    (ChannelState.CLOSING, ChannelInput.CLIENT_CLOSE_OK): ChannelState.FREED,
    # Both sides closed at once: we answer their close and forget the channel.
    (ChannelState.CLOSING, ChannelInput.CLIENT_CLOSE): ChannelState.FREED,
    (ChannelState.CLOSE_REQUESTED, ChannelInput.SERVER_CLOSE_OK): ChannelState.FREED,
}


class ContentState(enum.Enum):
    AWAIT_METHOD = "await_method"
    AWAIT_HEADER = "await_header"
    AWAIT_BODY = "await_body"


class ContentInput(enum.Enum):
    METHOD = "method"
    PUBLISH = "publish"
    HEADER = "header"  # announces a non-empty body
    HEADER_EMPTY = "header_empty"  # body size 0: the message is complete
    BODY = "body"
    BODY_LAST = "body_last"


CONTENT: dict[tuple[ContentState, ContentInput], ContentState] = {
    (ContentState.AWAIT_METHOD, ContentInput.METHOD): ContentState.AWAIT_METHOD,
    (ContentState.AWAIT_METHOD, ContentInput.PUBLISH): ContentState.AWAIT_HEADER,
    (ContentState.AWAIT_HEADER, ContentInput.HEADER): ContentState.AWAIT_BODY,
    (ContentState.AWAIT_HEADER, ContentInput.HEADER_EMPTY): ContentState.AWAIT_METHOD,
    (ContentState.AWAIT_BODY, ContentInput.BODY): ContentState.AWAIT_BODY,
    (ContentState.AWAIT_BODY, ContentInput.BODY_LAST): ContentState.AWAIT_METHOD,
}

# What RabbitMQ says when a frame does not fit the assembler's state.
_UNEXPECTED_TEXT = {
    ContentState.AWAIT_METHOD: "expected method frame, got non method frame instead",
    ContentState.AWAIT_HEADER: (
        "expected content header for class 60, got non content header frame instead"
    ),
    ContentState.AWAIT_BODY: "expected content body, got non content body frame instead",
}


class PublishHead(NamedTuple):
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool


def decode_publish(payload: bytes) -> PublishHead:
    """Hand-decode basic.publish (the hot inbound method): ticket, exchange, key, bits."""
    try:
        end = _EXCHANGE_AT + 1 + payload[_EXCHANGE_AT]
        if end > len(payload):
            raise ValueError("shortstr overruns the frame")
        exchange = payload[_EXCHANGE_AT + 1 : end].decode("utf-8")
        start = end + 1
        end = start + payload[end]
        if end > len(payload):
            raise ValueError("shortstr overruns the frame")
        routing_key = payload[start:end].decode("utf-8")
        bits = payload[end]
    except (IndexError, ValueError) as err:
        detail = f"cannot decode {erlang_binary(payload[4:68], as_text=False)}"
        raise FrameError(detail, *PUBLISH_IDS) from err
    # tuple.__new__ skips the NamedTuple's Python-level __new__ (once per message).
    return _make_head(PublishHead, (exchange, routing_key, (bits & 1) == 1, (bits & 2) == 2))


_make_head = tuple.__new__


class Channel:
    """One open channel number: lifecycle state plus the publish being assembled."""

    __slots__ = ("_body", "_head", "_properties", "_remaining", "content", "number", "state")

    def __init__(self, number: int) -> None:
        self.number = number
        self.state = ChannelState.OPEN
        self.content = ContentState.AWAIT_METHOD
        self._head: PublishHead | None = None
        self._properties = b""
        self._remaining = 0
        # A body of several frames grows here in place: a list of frames joined at the end
        # would hold it twice, and the freed frames stay in the heap (RSS) afterwards.
        self._body = bytearray()

    def move(self, event: ChannelInput) -> ChannelState:
        """Apply a lifecycle input; an illegal one is a bug in the caller."""
        try:
            self.state = LIFECYCLE[(self.state, event)]
        except KeyError:
            raise RuntimeError(f"channel {self.number}: {event} in {self.state}") from None
        if self.state is not ChannelState.OPEN:
            self.reset_content()
        return self.state

    def reset_content(self) -> None:
        self.content = ContentState.AWAIT_METHOD
        self._head = None
        self._properties = b""
        self._body = bytearray()

    def _advance(self, event: ContentInput) -> None:
        next_state = CONTENT.get((self.content, event))
        if next_state is None:
            # The failing method is basic.publish once one is under way.
            ids = (0, 0) if self.content is ContentState.AWAIT_METHOD else PUBLISH_IDS
            raise UnexpectedFrame(_UNEXPECTED_TEXT[self.content], *ids)
        self.content = next_state

    def on_method(self) -> None:
        """A non-content method arrived: only legal between messages."""
        self._advance(ContentInput.METHOD)

    def on_publish(self, head: PublishHead) -> None:
        self._advance(ContentInput.PUBLISH)
        self._head = head

    def on_header(self, payload: bytes, max_message_size: int) -> Publish | None:
        """Content header; returns the finished Publish when the body is empty."""
        class_id, weight, body_size = _CONTENT_HEAD.unpack_from(payload)
        if self.content is ContentState.AWAIT_HEADER:
            if weight != 0:  # RabbitMQ treats it as "non content header frame"
                raise UnexpectedFrame(_UNEXPECTED_TEXT[self.content], *PUBLISH_IDS)
            if class_id != BASIC_CLASS_ID:
                raise UnexpectedFrame(
                    f"expected content header for class 60, got one for class {class_id} instead",
                    *PUBLISH_IDS,
                )
            if body_size > MAX_MSG_SIZE:
                raise FrameError(
                    f"content body size {body_size} exceeds maximum allowed size {MAX_MSG_SIZE}",
                    *PUBLISH_IDS,
                )
            if body_size > max_message_size:
                kind = "max size" if max_message_size == MAX_MSG_SIZE else "configured max size"
                raise PreconditionFailed(
                    f"message size {body_size} is larger than {kind} {max_message_size}",
                    *PUBLISH_IDS,
                )
        self._advance(ContentInput.HEADER if body_size else ContentInput.HEADER_EMPTY)
        self._properties = payload[12:]
        if body_size == 0:
            return self._finish(b"")
        self._remaining = body_size
        return None

    def on_body(self, payload: bytes) -> Publish | None:
        """Body frame; returns the finished Publish on the last one."""
        if self.content is not ContentState.AWAIT_BODY:
            self._advance(ContentInput.BODY)  # raises: no body expected now
        if len(payload) > self._remaining:
            raise FrameError("content body frame exceeds remaining content size", *PUBLISH_IDS)
        self._remaining -= len(payload)
        last = self._remaining == 0
        self._advance(ContentInput.BODY_LAST if last else ContentInput.BODY)
        if last and not self._body:
            return self._finish(payload)  # the whole body in one frame: no copy
        self._body += payload
        return self._finish(self._body) if last else None

    def _finish(self, body: bytes | bytearray) -> Publish:
        head = self._head
        assert head is not None  # guaranteed by the CONTENT table
        if not properties_well_formed(self._properties):
            raise PropertiesUndecodable  # RabbitMQ decodes them once the body is complete
        publish = Publish(
            self.number,
            head.exchange,
            head.routing_key,
            head.mandatory,
            head.immediate,
            self._properties,
            body,
        )
        self.reset_content()
        return publish
