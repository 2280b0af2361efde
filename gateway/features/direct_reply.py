"""Direct reply-to (RabbitMQ's `amq.rabbitmq.reply-to`): RPC replies without a reply queue.

A channel consumes from the pseudo-queue `amq.rabbitmq.reply-to` (no-ack only) and gets a
key. Requests it publishes with `reply_to = amq.rabbitmq.reply-to` carry
`amq.rabbitmq.reply-to.<key>` instead; a reply published to that routing key on the default
exchange goes straight to the consumer. Replies are never stored: like RabbitMQ's, they are
lost if the requester is gone (a mandatory reply then comes back 312 NO_ROUTE).
"""

from __future__ import annotations

import base64
import os
from typing import Generic, TypeVar

from gateway.ports import ReplyChannel

Channel = TypeVar("Channel", bound=ReplyChannel)

REPLY_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_QUEUE + "."


class DirectReplies(Generic[Channel]):
    """Node-wide: reply key -> (channel, consumer tag)."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[Channel, str]] = {}

    def register(self, channel: Channel, consumer_tag: str) -> str:
        key = base64.urlsafe_b64encode(os.urandom(18)).decode()
        self._by_key[key] = (channel, consumer_tag)
        return key

    def unregister(self, key: str) -> None:
        self._by_key.pop(key, None)

    def lookup(self, routing_key: str) -> tuple[Channel, str] | None:
        target = self._by_key.get(routing_key[len(REPLY_PREFIX) :])
        if target is None or target[0].closing:
            return None
        return target
