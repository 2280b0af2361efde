"""The ``x-stream-offset`` consumer argument of a stream queue, as RabbitMQ 3.10 reads it
(rabbit_stream_queue / rabbit_amqqueue:check_max_age), and where it starts a consumer.

- absent or ``"next"``: what is published after the consumer subscribed;
- ``"first"``: the oldest message the stream still holds;
- ``"last"``: the last message (RabbitMQ: the start of the last chunk, which is the last
  message when publishes are confirmed one by one; mqgw has no chunks);
- an integer: that offset, clamped to what the stream holds (below its start: the start;
  past its end: the next message);
- an AMQP timestamp (seconds): the first message stored at or after it;
- a string ``<positive integer><Y|M|D|h|m|s>``: the first message stored within that
  interval before now (``"1h"``).

Anything else is refused with RabbitMQ's 406 text
``invalid arg 'x-stream-offset' for queue 'q' in vhost '/': {invalid_stream_offset_arg,
{longstr,<<"0s">>}}``. RabbitMQ 3.10 itself crashes the connection (541 INTERNAL_ERROR) on
strings without leading digits ("abc", "-1h"), floats and booleans; mqgw answers those with
the same 406 as the values RabbitMQ does refuse.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from meta.amqp_values import erlang_repr, infer_type, timestamp_seconds, type_class
from meta.queue_arguments import parse_max_age

STREAM_OFFSET_ARG = "x-stream-offset"
NAMED_POSITIONS = ("first", "last", "next")


class InvalidStreamOffset(ValueError):
    """The argument is not an offset specification; ``term`` is RabbitMQ's error term."""

    def __init__(self, term: str) -> None:
        super().__init__(term)
        self.term = term


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    kind: str  # first | last | next | offset | time
    value: int = 0  # the offset, or the time in ms since the epoch


NEXT = OffsetSpec("next")


def parse_stream_offset(value: Any, amqp_type: str | None, now_ms: int) -> OffsetSpec:
    """The start ``value`` asks for (``amqp_type``: its wire type, when known)."""
    if value is None:
        return NEXT
    wire_type = amqp_type or infer_type(value)
    if isinstance(value, str) and wire_type == "longstr":
        if value in NAMED_POSITIONS:
            return OffsetSpec(value)
        interval_ms = parse_max_age(value)
        if interval_ms is None:
            raise InvalidStreamOffset(_term(wire_type, value))
        return OffsetSpec("time", now_ms - interval_ms)
    if isinstance(value, dt.datetime):
        return OffsetSpec("time", timestamp_seconds(value) * 1000)
    if isinstance(value, int) and not isinstance(value, bool) and type_class(wire_type) == "int":
        return OffsetSpec("offset", value)
    raise InvalidStreamOffset(_term(wire_type, value))


def _term(wire_type: str, value: Any) -> str:
    return f"{{invalid_stream_offset_arg,{{{wire_type},{erlang_repr(value)}}}}}"


def start_offset(spec: OffsetSpec, min_offset: int, max_offset: int, time_offset: int) -> int:
    """Where a consumer with ``spec`` starts in a stream holding [min_offset, max_offset);
    ``time_offset``: the first offset stored at or after ``spec.value`` (for kind time)."""
    if spec.kind == "first":
        return min_offset
    if spec.kind == "last":
        return max(min_offset, max_offset - 1)
    if spec.kind == "offset":
        return min(max(spec.value, min_offset), max_offset)
    if spec.kind == "time":
        return min(max(time_offset, min_offset), max_offset)
    return max_offset
