"""Direct reply-to (RabbitMQ's `amq.rabbitmq.reply-to`): RPC replies without a reply queue.

A channel consumes from the pseudo-queue `amq.rabbitmq.reply-to` (no-ack only) and gets a
key. Requests it publishes with `reply_to = amq.rabbitmq.reply-to` carry
`amq.rabbitmq.reply-to.<key>` instead; a reply published to that routing key on the default
exchange goes straight to the consumer. Replies are never stored: like RabbitMQ's, they are
lost if the requester is gone (a mandatory reply then comes back 312 NO_ROUTE).

A key is "<tag>.<random>", the tag naming the gateway that holds the consumer (as RabbitMQ
encodes its node in the key): in a cluster, a reply to another gateway's key is handed to
``relay`` (gateway/cluster/replies.py), which carries it there.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class ReplyChannel(Protocol):
    """A channel as direct reply-to holds it: a reply is dropped once it is closing."""

    @property
    def closing(self) -> bool: ...


Channel = TypeVar("Channel", bound=ReplyChannel)
Channel_contra = TypeVar("Channel_contra", bound=ReplyChannel, contravariant=True)

REPLY_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_QUEUE + "."
TAG_LENGTH = 12  # characters of a gateway's tag in a key

# (channel, consumer tag, routing key, properties, body): a reply delivered to its consumer.
Deliver = Callable[[Channel, str, str, bytes, bytes], None]
# (channel, routing key, properties, body): a mandatory reply given back (312 NO_ROUTE).
GiveBack = Callable[[Channel, str, bytes, bytes | bytearray], None]


def gateway_tag(gateway_id: str) -> str:
    """A gateway's tag in its reply keys: short, fixed-length and free of dots."""
    digest = hashlib.blake2b(gateway_id.encode(), digest_size=TAG_LENGTH * 3 // 4).digest()
    return base64.urlsafe_b64encode(digest).decode()


class ReplyForwarder(Protocol[Channel_contra]):
    """Where replies to requesters on other gateways go (the cluster's relay)."""

    def forward(
        self,
        tag: str,
        routing_key: str,
        properties: bytes,
        body: bytes | bytearray,
        returns_to: Channel_contra | None,
    ) -> bool:
        """Take the reply for gateway ``tag``; ``returns_to``: the publishing channel of a
        mandatory reply (it gets the reply back if the requester is gone). False: it
        cannot be relayed now (the caller treats it as unroutable)."""
        ...


class DirectReplies(Generic[Channel]):
    """Node-wide: reply key -> (channel, consumer tag)."""

    def __init__(
        self,
        gateway_id: str = "",
        deliver: Deliver[Channel] | None = None,
        give_back: GiveBack[Channel] | None = None,
    ) -> None:
        self.tag = gateway_tag(gateway_id)
        self._by_key: dict[str, tuple[Channel, str]] = {}
        # What the relay uses on the layers above: deliver a relayed reply, give one back.
        self.deliver = deliver
        self.give_back = give_back
        self.relay: ReplyForwarder[Channel] | None = None  # set in a cluster only

    def register(self, channel: Channel, consumer_tag: str) -> str:
        key = self.tag + "." + base64.urlsafe_b64encode(os.urandom(18)).decode()
        self._by_key[key] = (channel, consumer_tag)
        return key

    def unregister(self, key: str) -> None:
        self._by_key.pop(key, None)

    def lookup(self, routing_key: str) -> tuple[Channel, str] | None:
        target = self._by_key.get(routing_key[len(REPLY_PREFIX) :])
        if target is None or target[0].closing:
            return None
        return target

    def remote_tag(self, routing_key: str) -> str | None:
        """The tag of the other gateway a reply key belongs to; None for one of ours or a
        key no gateway hands out."""
        tag = routing_key[len(REPLY_PREFIX) : len(REPLY_PREFIX) + TAG_LENGTH]
        if (
            len(tag) != TAG_LENGTH
            or tag == self.tag
            or routing_key[len(REPLY_PREFIX) + TAG_LENGTH : len(REPLY_PREFIX) + TAG_LENGTH + 1]
            != "."
        ):
            return None
        return tag
