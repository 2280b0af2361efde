"""Message TTL at a queue's head (``x-message-ttl`` and each message's ``expiration``), as
RabbitMQ 3.10's classic queues apply it: a message expires only at the head, and a queue
whose head is not expired keeps everything behind it.

A delivery checks the message it takes (``QueueRuntime.take``, with ``deadline_ms``); a
queue nobody takes from lets its expired head leave here, on the push scheduler's turn, and
is parked until the next head's deadline.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.amqp import property_bytes as pb
from storage import StoredMessage
from storage.record import EXPIRES

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def message_expiration(message: StoredMessage) -> int | None:
    """The per-message TTL in ms, read from the property bytes only when flagged."""
    if not message.flags & EXPIRES:
        return None
    try:
        raw = pb.split_properties(message.properties).get(pb.EXPIRATION)
        value = pb.shortstr_value(raw)
        return None if value is None else int(value)
    except ValueError:
        return None


def deadline_ms(message: StoredMessage, ttl_ms: int | None) -> int | None:
    """When ``message`` expires (wall ms), from the queue's TTL and its own expiration."""
    own = message_expiration(message)
    if own is not None:
        ttl_ms = own if ttl_ms is None else min(ttl_ms, own)
    return None if ttl_ms is None else message.store_ts_ms + ttl_ms


async def expire_head(queue: QueueRuntime, now_ms: int) -> int | None:
    """Let expired messages leave ``queue``'s head; returns the next head's deadline, if any."""
    if queue.behaviour.message_ttl_ms is None and not _head_may_expire(queue):
        return None
    while True:
        head = await queue._fetch_head(always=False)
        if head is None:
            return None
        deadline = deadline_ms(head, queue.behaviour.message_ttl_ms)
        if deadline is None or deadline > now_ms:
            return deadline
        taken = queue._pop_head()
        assert taken is not None
        queue.leave(taken[0], taken[1], "expired")


def _head_may_expire(queue: QueueRuntime) -> bool:
    head = queue._peek_head()
    if head is not None:
        return bool(head.flags & EXPIRES)
    return queue.expirations_seen and queue.ready_count > 0
