"""Typed errors: codes, hard/soft, RabbitMQ-shaped reply texts."""

from __future__ import annotations

import pytest

from gateway.amqp import errors, frame_writer
from gateway.amqp.errors import AMQPError, erlang_binary, error_for_code
from gateway.amqp.methods import channel_close

CASES = [
    (errors.ContentTooLarge, 311, False, "CONTENT_TOO_LARGE"),
    (errors.NoConsumers, 313, False, "NO_CONSUMERS"),
    (errors.ConnectionForced, 320, True, "CONNECTION_FORCED"),
    (errors.InvalidPath, 402, True, "INVALID_PATH"),
    (errors.AccessRefused, 403, False, "ACCESS_REFUSED"),
    (errors.NotFound, 404, False, "NOT_FOUND"),
    (errors.ResourceLocked, 405, False, "RESOURCE_LOCKED"),
    (errors.PreconditionFailed, 406, False, "PRECONDITION_FAILED"),
    (errors.FrameError, 501, True, "FRAME_ERROR"),
    (errors.AMQPSyntaxError, 502, True, "SYNTAX_ERROR"),
    (errors.CommandInvalid, 503, True, "COMMAND_INVALID"),
    (errors.ChannelError, 504, True, "CHANNEL_ERROR"),
    (errors.UnexpectedFrame, 505, True, "UNEXPECTED_FRAME"),
    (errors.ResourceError, 506, True, "RESOURCE_ERROR"),
    (errors.NotAllowed, 530, True, "NOT_ALLOWED"),
    (errors.AMQPNotImplemented, 540, True, "NOT_IMPLEMENTED"),
    (errors.InternalError, 541, True, "INTERNAL_ERROR"),
]


@pytest.mark.parametrize(("cls", "code", "hard", "name"), CASES)
def test_each_code(cls: type[AMQPError], code: int, hard: bool, name: str) -> None:
    err = cls("detail", 50, 10)  # type: ignore[call-arg]
    assert isinstance(err, AMQPError)
    assert (err.reply_code, err.hard, err.class_id, err.method_id) == (code, hard, 50, 10)
    assert err.reply_text == f"{name} - detail"
    assert type(error_for_code(code, "detail")) is cls


def test_rabbitmq_shaped_text() -> None:
    err = errors.NotFound("no queue 'q' in vhost '/'")
    assert str(err) == "NOT_FOUND - no queue 'q' in vhost '/'"
    assert (err.class_id, err.method_id) == (0, 0)
    assert err.with_method(50, 10) is err and (err.class_id, err.method_id) == (50, 10)
    assert err.with_method(60, 40).class_id == 50  # an explicit method is kept


def test_base_class_takes_a_ready_text() -> None:
    err = AMQPError(406, "PRECONDITION_FAILED - x", 60, 40)
    assert not err.hard and err.reply_text == "PRECONDITION_FAILED - x"


def test_reply_text_is_cut_on_the_wire_as_rabbitmq_cuts_it() -> None:
    """rabbit_binary_generator: above 255 bytes, the first 252 and "...", even inside a UTF-8
    character (tests/diff/test_diff_names.py shows RabbitMQ doing it)."""
    err = errors.PreconditionFailed("a" + "ü" * 300)
    assert err.reply_text == "PRECONDITION_FAILED - a" + "ü" * 300  # whole, for the logs
    wire = errors.reply_text_bytes(err.reply_text)
    assert len(wire) == 255 and wire.endswith(b"\xbc\xc3...")  # 23 + 2 * 114 + 1 bytes
    assert errors.reply_text_bytes("x" * 255) == b"x" * 255
    assert errors.reply_text_bytes("x" * 256) == b"x" * 252 + b"..."
    close = frame_writer.method(1, channel_close(err))
    assert close[7 + 6 : 7 + 6 + 256] == b"\xff" + wire  # u16 code, then the shortstr


@pytest.mark.parametrize(
    ("data", "text", "raw"),
    [
        (b"", "<<>>", "<<>>"),
        (b"abc", '<<"abc">>', "<<97,98,99>>"),
        (b'a"b\\\n', '<<"a\\"b\\\\\\n">>', "<<97,34,98,92,10>>"),
        (b"\x00\x01", "<<0,1>>", "<<0,1>>"),
        ("é".encode(), '<<"é"/utf8>>', "<<195,169>>"),
    ],
)
def test_erlang_binary_rendering(data: bytes, text: str, raw: str) -> None:
    assert erlang_binary(data) == text
    assert erlang_binary(data, as_text=False) == raw
