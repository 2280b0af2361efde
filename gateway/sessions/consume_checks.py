"""What basic.consume and basic.recover must check of a channel for the queue kinds that
need it (streams), in RabbitMQ's order. The queue kinds (gateway/features/stream.py) know
their arguments; the channel's prefetch, ack mode and unacked deliveries are the session's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.amqp.errors import PreconditionFailed
from gateway.features import stream
from gateway.features.stream_offset import STREAM_OFFSET_ARG, OffsetSpec
from gateway.queues.runtime import QueueRuntime
from gateway.sessions.channel_state import ChannelState
from meta.errors import resource_name


def check_consume(
    queue: QueueRuntime,
    channel: ChannelState,
    arguments: Mapping[str, Any],
    types: Mapping[str, str],
    no_ack: bool,
) -> OffsetSpec | None:
    """A stream consumer's start (None for other queues): the offset argument, then the
    prefetch, then the ack mode, then the consumer name, as RabbitMQ checks them."""
    if not isinstance(queue, stream.StreamQueue):
        if STREAM_OFFSET_ARG in arguments:
            raise stream.offset_refused(queue)
        return None
    spec = stream.offset_of(queue, arguments, types)
    if not channel.prefetch_count:
        where = resource_name("queue", queue.name, queue.definition.vhost)
        raise PreconditionFailed(f"consumer prefetch count is not set for '{where}'", 60, 20)
    if no_ack:
        raise stream.not_supported("automatic acknowledgement", queue, 60, 20)
    stream.check_consumer_name(queue, arguments)
    return spec


def check_recover(channel: ChannelState, class_id: int, method_id: int) -> None:
    """basic.recover on a channel reading a stream: refused (RabbitMQ 3.10 fails the
    connection with 541 there; mqgw answers 540 like the other methods streams lack)."""
    for delivery in channel.unacked.values():
        if stream.is_stream(delivery.queue):
            raise stream.not_supported("basic.recover", delivery.queue, class_id, method_id)
    for consumer in channel.consumers.values():
        if stream.is_stream(consumer.queue):
            raise stream.not_supported("basic.recover", consumer.queue, class_id, method_id)
