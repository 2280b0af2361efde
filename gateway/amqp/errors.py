"""Typed AMQP 0-9-1 protocol errors, each carrying its reply code.

Soft errors close one channel (``channel.close``); hard errors close the whole
connection (``connection.close``). The reply text follows RabbitMQ's shape,
``"<CONSTANT_NAME> - <detail>"``, because client libraries and operators grep for
it (e.g. ``"NOT_FOUND - no queue 'q' in vhost '/'"``). Subclasses take only the
detail; the base class takes a ready-made reply text.
"""

from __future__ import annotations

from typing import ClassVar

# Reply codes named by the 0-9-1 spec (RabbitMQ's constant names, underscores).
REPLY_SUCCESS = 200
NO_ROUTE = 312  # used in basic.return, never in a close

_CONSTANT_NAMES: dict[int, str] = {
    200: "REPLY_SUCCESS",
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}
# Channel-level codes; every other code closes the connection.
SOFT_CODES: frozenset[int] = frozenset({311, 312, 313, 403, 404, 405, 406})

REPLY_TEXT_MAX_BYTES = 255  # reply-text is a shortstr


def truncate_shortstr(text: str, limit: int = REPLY_TEXT_MAX_BYTES) -> str:
    """Cut ``text`` to at most ``limit`` UTF-8 bytes without splitting a character."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore")


def reply_text_bytes(text: str) -> bytes:
    """A close's reply-text on the wire, cut as rabbit_binary_generator does: above 255 bytes,
    the first 252 and "...". Bytes, not characters: a long UTF-8 name (a 255-byte queue name
    in "NOT_FOUND - no queue '...'") is cut inside a character, as RabbitMQ sends it."""
    raw = text.encode("utf-8")
    return raw if len(raw) <= REPLY_TEXT_MAX_BYTES else raw[:252] + b"..."


def format_reply_text(reply_code: int, detail: str) -> str:
    """``"NOT_FOUND - detail"`` (whole: reply_text_bytes cuts it for the wire)."""
    name = _CONSTANT_NAMES.get(reply_code, "INTERNAL_ERROR")
    return f"{name} - {detail}"


class AMQPError(Exception):
    """Any AMQP protocol exception; ``hard`` ones close the connection."""

    def __init__(
        self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        self.reply_code = reply_code
        self.reply_text = reply_text  # whole, for logs; cut when sent (reply_text_bytes)
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(self.reply_text)

    @property
    def hard(self) -> bool:
        """True when the error closes the connection rather than a channel."""
        return self.reply_code not in SOFT_CODES

    def with_method(self, class_id: int, method_id: int) -> AMQPError:
        """Fill in the failing method when none was given (RabbitMQ's ``method = none``)."""
        if self.class_id == 0 and self.method_id == 0:
            self.class_id, self.method_id = class_id, method_id
        return self

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.reply_code}, {self.reply_text!r}, "
            f"{self.class_id}, {self.method_id})"
        )


class _CodedError(AMQPError):
    """Base of the per-code subclasses: callers pass only the detail text."""

    code: ClassVar[int] = 541

    def __init__(self, detail: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(self.code, format_reply_text(self.code, detail), class_id, method_id)


class ContentTooLarge(_CodedError):
    code = 311


class NoConsumers(_CodedError):
    code = 313


class ConnectionForced(_CodedError):
    code = 320


class InvalidPath(_CodedError):
    code = 402


class AccessRefused(_CodedError):
    code = 403


class NotFound(_CodedError):
    code = 404


class ResourceLocked(_CodedError):
    code = 405


class PreconditionFailed(_CodedError):
    code = 406


class FrameError(_CodedError):
    code = 501


class AMQPSyntaxError(_CodedError):
    code = 502


class CommandInvalid(_CodedError):
    code = 503


class ChannelError(_CodedError):
    code = 504


class UnexpectedFrame(_CodedError):
    code = 505


class ResourceError(_CodedError):
    code = 506


class NotAllowed(_CodedError):
    code = 530


class AMQPNotImplemented(_CodedError):
    code = 540


class InternalError(_CodedError):
    code = 541


class PropertiesUndecodable(AMQPError):
    """A publish whose content-header properties RabbitMQ 3.10 cannot decode: its channel
    process crashes in the decoder, and the reader closes the connection with the bare text
    of a non-AMQP exit, "INTERNAL_ERROR", naming no method (rabbit_binary_generator:
    map_exception). Nothing is stored or delivered."""

    def __init__(self) -> None:
        super().__init__(541, "INTERNAL_ERROR")


_BY_CODE: dict[int, type[_CodedError]] = {
    cls.code: cls
    for cls in (
        ContentTooLarge,
        NoConsumers,
        ConnectionForced,
        InvalidPath,
        AccessRefused,
        NotFound,
        ResourceLocked,
        PreconditionFailed,
        FrameError,
        AMQPSyntaxError,
        CommandInvalid,
        ChannelError,
        UnexpectedFrame,
        ResourceError,
        NotAllowed,
        AMQPNotImplemented,
        InternalError,
    )
}


def error_for_code(
    reply_code: int, detail: str, class_id: int = 0, method_id: int = 0
) -> AMQPError:
    """Build the typed error for ``reply_code`` from a detail text."""
    cls = _BY_CODE.get(reply_code)
    if cls is None:
        return AMQPError(reply_code, format_reply_text(reply_code, detail), class_id, method_id)
    return cls(detail, class_id, method_id)


# Erlang's printable set for ``~tp`` of a binary (io_lib:printable_unicode_list).
_ERLANG_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\b": "\\b",
    "\f": "\\f",
    "\x1b": "\\e",
}


def _erlang_printable(char: str) -> bool:
    point = ord(char)
    if char in _ERLANG_ESCAPES or 32 <= point <= 126:
        return True
    return point >= 0xA0 and not (0xD800 <= point <= 0xDFFF) and point not in (0xFFFE, 0xFFFF)


def erlang_binary(data: bytes, as_text: bool = True) -> str:
    """Render bytes as Erlang prints a binary (``~tp`` if ``as_text`` else ``~w``).

    RabbitMQ puts these renderings into FRAME_ERROR / UNEXPECTED_FRAME reply
    texts; reproducing them keeps our close reasons identical to the broker's.
    """
    if not data:
        return "<<>>"
    if as_text:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        if text and all(_erlang_printable(c) for c in text):
            escaped = "".join(_ERLANG_ESCAPES.get(c, c) for c in text)
            suffix = "/utf8" if any(ord(c) > 127 for c in text) else ""
            return f'<<"{escaped}"{suffix}>>'
    return "<<" + ",".join(str(b) for b in data) + ">>"


def payload_snippet(payload: bytes) -> tuple[str, bytes]:
    """RabbitMQ quotes at most the first 16 octets of a bad frame."""
    if len(payload) <= 16:
        return "all", payload
    return "first 16", payload[:16]


def frame_error_detail(frame_type: int, payload: bytes, reason: str) -> str:
    """``"type 9, all octets = <<>>: unknown_frame"`` (rabbit_reader:frame_error)."""
    which, snippet = payload_snippet(payload)
    return f"type {frame_type}, {which} octets = {erlang_binary(snippet)}: {reason}"


def unexpected_frame_detail(frame_type: int, payload: bytes) -> str:
    """``"type 8, all octets = <<>>"`` (rabbit_reader:unexpected_frame)."""
    which, snippet = payload_snippet(payload)
    return f"type {frame_type}, {which} octets = {erlang_binary(snippet)}"
