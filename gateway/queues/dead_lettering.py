"""Where a message goes when it leaves a queue for good without an ack: to the queue's
dead-letter exchange through the vhost's outbox (gateway/queues/dead_letter.py shapes it), or
dropped, counted either way in the queue's exact counts.

Reasons, as RabbitMQ names them: ``rejected`` (reject/nack without requeue), ``expired``
(TTL at the head), ``maxlen`` (drop-head, or a publish refused by reject-publish-dlx) and
``delivery_limit`` (requeued too often; past ``x-max-redeliveries`` a queue without a
dead-letter exchange sends it to its ``.dlq``). Quorum-queue style delivery counting stamps
``x-delivery-count`` per delivery, so a departing message leaves without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.amqp import Publish
from gateway.amqp import property_bytes as pb
from gateway.queues.dead_letter import DeadLetter
from storage import StoredMessage
from storage.record import PERSISTENT

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime

DLQ_SUFFIX = ".dlq"
DELIVERY_COUNT = "x-delivery-count"


class DeadLettering:
    """A queue's departures: dead letters to its outbox (None: every departure is dropped)."""

    def __init__(self, queue: QueueRuntime, outbox: Callable[[DeadLetter], None] | None) -> None:
        self.queue = queue
        self.outbox = outbox
        # Offsets kept in the queue's in-flight sets only until their dead letter is durable
        # (at-least-once): not deliveries, so not unacknowledged (observe/stats.py).
        self.held = 0

    def refused_publish(self, publish: Publish, properties: bytes, record_flags: int) -> None:
        """reject-publish-dlx: the refused message goes to the dead-letter exchange."""
        queue = self.queue
        b = queue.behaviour
        if b.dlx is None or self.outbox is None:
            return
        self.outbox(
            DeadLetter(
                queue.name,
                "maxlen",
                publish.exchange,
                publish.routing_key,
                properties,
                bytes(publish.body),
                bool(record_flags & PERSISTENT),
                b.dlx,
                b.dlrk,
            )
        )

    def gone(
        self, partition: int, message: StoredMessage, reason: str, to_dlq: bool = False
    ) -> None:
        """The message left for good: dead-lettered if the queue has somewhere to send it."""
        queue = self.queue
        queue.returns.pop((partition, message.queue_offset), None)
        queue.commit_dirty = True
        b = queue.behaviour
        if b.counts_deliveries:  # the count is stamped per delivery, not part of the message
            message = stamped(message, None)
        dlx, dlrk = b.dlx, b.dlrk
        if dlx is None and to_dlq:
            dlx, dlrk = "", queue.name + DLQ_SUFFIX
        if dlx is None or self.outbox is None:
            queue.dropped += 1
            return
        queue.dead_lettered += 1
        settled = None
        if b.dead_letter_at_least_once and not to_dlq:
            settled = self._held_until_stored(partition, message.queue_offset)
        self.outbox(
            DeadLetter(
                queue.name,
                reason,
                message.exchange.decode(),
                message.routing_key.decode(),
                bytes(message.properties),
                bytes(message.body),
                bool(message.flags & PERSISTENT),
                dlx,
                dlrk,
                to_dlq and b.dlx is None,
                settled,
            )
        )

    def _held_until_stored(self, partition: int, offset: int) -> Callable[[], None]:
        """At-least-once: the message holds the committed offset until its dead letter is
        durable (then the returned callback settles it)."""
        queue = self.queue
        queue.inflight[partition].add(offset)
        self.held += 1

        def settled() -> None:
            queue.inflight[partition].discard(offset)
            queue.commit_dirty = True
            self.held -= 1

        return settled


def with_delivery_count(properties: bytes | memoryview, count: int | None) -> bytes:
    """The properties with x-delivery-count set to ``count`` (None: removed)."""
    raw = None if count is None else pb.long(count)
    return pb.set_header(properties, DELIVERY_COUNT, "l", raw)


def stamped(message: StoredMessage, count: int | None) -> StoredMessage:
    """Quorum-queue style: each delivery carries x-delivery-count, the times it came back.
    Properties the broker cannot edit go out as they came in."""
    try:
        properties = with_delivery_count(message.properties, count)
    except pb.PropertyError:
        return message
    return message._replace(properties=memoryview(properties))
