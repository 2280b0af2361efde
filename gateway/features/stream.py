"""Stream queues (``x-queue-type: stream``) on the log, as RabbitMQ 3.10 offers them over
AMQP 0-9-1 — where mqgw's design is native: a stream is a queue whose log is never consumed,
only read.

- The queue itself (``StreamQueue``) never delivers and keeps no buffer. Each consumer reads
  from its own position through a ``StreamSubscription`` (the machinery of broadcast
  consumption, gateway/features/broadcast.py: its own cursor, buffer and in-flight set, pushed
  by the same scheduler; the node's ``Broadcasts`` registry routes the queue's wake-ups to them).
- Reading removes nothing. An ack only gives the consumer its credit back (and moves a named
  consumer's tracked offset); ``basic.qos`` prefetch is required, automatic acknowledgement,
  basic.get, nack/reject and queue.purge are refused with RabbitMQ's codes and texts.
- Every delivery carries its offset in the ``x-stream-offset`` header (a signed 64-bit long,
  added last to the message's headers, as RabbitMQ does). Offsets count from 0 per stream.
- A stream has one partition: its offsets are one sequence, as RabbitMQ's are.
- Retention: ``x-max-age`` (the node's housekeeping drops what is older, see
  ``Node.apply_queue_retention``) and ``x-max-length-bytes`` (the oldest messages go as soon
  as the stream's bodies pass the limit). The queue's own consumer group holds the stream's
  start (its retention floor), which is what keeps the log from being reclaimed.
- mqgw extension, server-side offset tracking (what RabbitMQ's stream plugin offers and its
  AMQP 0-9-1 streams do not): a consumer passing ``x-mqgw-stream-consumer-name`` reads under
  that name; its position (the lowest offset delivered and not acked, or the next one) is
  stored in the queue's consumer group ``stream:<name>`` and a later consumer with the name
  resumes there, whatever its ``x-stream-offset`` (which only applies the first time).
  Stored offsets are biased by ``TRACKED_BIAS``: the store counts every group's offset as a
  read start, and a tracked offset must not keep data past the stream's retention (RabbitMQ's
  do not). One consumer at a time may use a name (403 otherwise).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.amqp import property_bytes as pb
from gateway.amqp.errors import AccessRefused, AMQPNotImplemented, NotFound, PreconditionFailed
from gateway.features.broadcast import Broadcasts, BroadcastSubscription
from gateway.features.stream_offset import (
    STREAM_OFFSET_ARG,
    InvalidStreamOffset,
    OffsetSpec,
    parse_stream_offset,
    start_offset,
)
from gateway.queues.consumer import LANE_ALL
from gateway.queues.runtime import PumpResult, QueueRuntime
from gateway.queues.store_reads import FETCH_BATCH
from meta.checks import queue_type_of
from meta.errors import resource_name
from storage import StoredMessage

if TYPE_CHECKING:
    from gateway.ports import ConnectionPort

STREAM = "stream"
CONSUMER_NAME_ARG = "x-mqgw-stream-consumer-name"
TRACKED_BIAS = 1 << 61  # added to stored tracked offsets (see the module doc)
_anonymous = itertools.count()  # numbers the anonymous subscriptions of this process


def is_stream(queue: QueueRuntime) -> bool:
    return isinstance(queue, StreamQueue | StreamSubscription)


def _where(queue: QueueRuntime) -> str:
    return resource_name("queue", queue.name, queue.definition.vhost)


def not_supported(what: str, queue: QueueRuntime, class_id: int, method_id: int) -> Exception:
    """RabbitMQ's 540 for what a stream queue does not do (basic.get, queue.purge...)."""
    detail = f"{what} not supported by stream queues {_where(queue)}"
    return AMQPNotImplemented(detail, class_id, method_id)


class StreamQueue(QueueRuntime):
    """The stream itself: its length, bytes and retention; it delivers nothing."""

    def caught_up(self, starts: Mapping[tuple[int, int], int]) -> bool:
        return False  # new messages go to the subscriptions, which read them from the store

    def congested(self) -> bool:
        return False  # the stream's length is no backlog: publishers never wait for readers

    def pump(self, quota: int, now: float) -> PumpResult:
        return PumpResult.NO_MESSAGES

    async def fill(self) -> None:
        return None

    async def message_count(self) -> int:
        return self.ready_count  # what the stream holds (RabbitMQ's declare-ok shows it too)

    async def expire(self, now_ms: int) -> int | None:
        return None  # a stream ignores message TTLs (as RabbitMQ's); retention removes

    def over_limit(self) -> bool:
        limit = self.behaviour.max_length_bytes
        return limit is not None and self.ready_bytes > limit

    async def enforce_limits(self) -> None:
        """x-max-length-bytes is retention here: the oldest messages go until the stream's
        bodies fit (nothing is dead-lettered; readers past them are unaffected)."""
        limit = self.behaviour.max_length_bytes
        if limit is None or self.ready_bytes <= limit:
            return
        excess = self.ready_bytes - limit
        offset, dropped, dropped_bytes = self.cursors[0], 0, 0
        while dropped_bytes < excess:
            result = await self.store.read(self.queue_id, 0, offset, FETCH_BATCH)
            offset = max(offset, result.min_offset)
            if not result.messages:
                break
            for message in result.messages:
                if dropped_bytes >= excess:
                    break
                dropped_bytes += len(message.body)
                dropped += 1
                offset = message.queue_offset + 1
        if offset > self.cursors[0]:
            self.cursors[0] = offset
            self.ready_count = max(0, self.ready_count - dropped)
            self.ready_bytes -= dropped_bytes
            self.dropped_by_retention += dropped
            self.commit_dirty = True
            await self.commit()  # the floor moves now: reclaim may free the oldest segments


class StreamSubscription(BroadcastSubscription):
    """One consumer's position in a stream (see the module doc)."""

    def __init__(self, queue: QueueRuntime, group: str, persistent: bool) -> None:
        super().__init__(queue, group, persistent)
        self.spec = OffsetSpec("next")

    async def start(self) -> None:
        store, queue_id = self.store, self.queue_id
        stats = await store.queue_stats(queue_id)
        part = stats.partitions[0]
        low = max(part.min_offset, self.queue.cursors[0])  # the stream's retention floor
        if self.persistent:
            stored = await store.committed_offset(self.group, queue_id, 0)
            if stored >= TRACKED_BIAS:
                self.cursors[0] = min(max(stored - TRACKED_BIAS, low), part.max_offset)
                return
        at = part.max_offset
        if self.spec.kind == "time":
            at = await store.offset_for_time(queue_id, 0, self.spec.value)
        self.cursors[0] = start_offset(self.spec, low, part.max_offset, at)
        if self.persistent:
            self.commit_dirty = True
            await self.commit()  # a reconnect resumes from here, even with nothing delivered

    async def fill(self) -> None:
        """Read on from the stream's retention floor if retention passed this position."""
        self.cursors[0] = max(self.cursors[0], self.queue.cursors[0])
        await super().fill()

    def take(
        self, now_ms: int | None = None, lane: int = LANE_ALL
    ) -> tuple[int, StoredMessage, bool] | None:
        taken = self._pop_head()
        if taken is None:
            return None
        partition, message, redelivered = taken
        self.ready_count -= 1
        self.ready_bytes -= len(message.body)
        self.inflight[partition].add(message.queue_offset)
        return partition, _with_offset(message), redelivered

    def requeue(self, partition: int, message: StoredMessage) -> None:
        """Unacked at a channel close: a named position goes back to it (not RabbitMQ's:
        its streams have no tracked positions over AMQP 0-9-1); others are forgotten."""
        if self.persistent:
            super().requeue(partition, message)
        else:
            self.inflight[partition].discard(message.queue_offset)

    async def commit(self) -> None:
        if not self.persistent or not self.commit_dirty or self.deleted:
            return
        self.commit_dirty = False
        offset = self.committed_offsets()[0]
        await self.store.commit_offset(self.group, self.queue_id, 0, offset + TRACKED_BIAS)


def _with_offset(message: StoredMessage) -> StoredMessage:
    """The message with its offset in the ``x-stream-offset`` header (signed long)."""
    try:
        properties = pb.set_header(
            message.properties, STREAM_OFFSET_ARG, "l", pb.long(message.queue_offset)
        )
    except pb.PropertyError:
        return message  # properties the broker cannot edit go out as they came in
    return message._replace(properties=memoryview(properties))


def offset_of(
    queue: QueueRuntime, arguments: Mapping[str, Any], types: Mapping[str, str]
) -> OffsetSpec:
    """Where a stream consumer starts, from its ``x-stream-offset`` (406 when invalid)."""
    try:
        return parse_stream_offset(
            arguments.get(STREAM_OFFSET_ARG), types.get(STREAM_OFFSET_ARG), queue.clock.wall_ms()
        )
    except InvalidStreamOffset as invalid:
        raise PreconditionFailed(
            f"invalid arg '{STREAM_OFFSET_ARG}' for {_where(queue)}: {invalid.term}", 60, 20
        ) from None


def check_consumer_name(queue: QueueRuntime, arguments: Mapping[str, Any]) -> None:
    name = arguments.get(CONSUMER_NAME_ARG)
    if name is not None and (not isinstance(name, str) or not name):
        raise PreconditionFailed(
            f"invalid arg '{CONSUMER_NAME_ARG}' for {_where(queue)}: a non-empty string", 60, 20
        )


def offset_refused(queue: QueueRuntime) -> PreconditionFailed:
    """``x-stream-offset`` on a queue that is not a stream (as classic and quorum queues)."""
    return PreconditionFailed(
        f"invalid arg '{STREAM_OFFSET_ARG}' for {_where(queue)} "
        f"of queue type rabbit_{queue_type_of(queue.definition)}_queue",
        60,
        20,
    )


async def consumer_queue(
    broadcasts: Broadcasts,
    connection: ConnectionPort,
    queue: QueueRuntime,
    tag: str,
    tag_given: bool,
    arguments: Mapping[str, Any],
    spec: OffsetSpec | None,
) -> QueueRuntime:
    """What a new consumer reads: its own subscription of a stream (starting at ``spec``,
    checked by the session), or what broadcast consumption gives for other queues."""
    if not isinstance(queue, StreamQueue) or spec is None:
        return await broadcasts.consumer_queue(queue, connection, tag, tag_given)
    name = arguments.get(CONSUMER_NAME_ARG)
    persistent = isinstance(name, str)
    # An anonymous position is its consumer's alone: a fresh group for every subscription.
    group = f"stream:{name}" if persistent else f"stream:{connection.id}:{tag}:{next(_anonymous)}"
    subscriptions = broadcasts.by_queue.setdefault(queue, {})
    subscription = subscriptions.get(group)
    if subscription is None:
        fresh = StreamSubscription(queue, group, persistent)
        fresh.spec = spec
        await fresh.start()
        if queue.deleted:
            raise NotFound(f"no {_where(queue)}", 60, 20)
        subscription = subscriptions.setdefault(group, fresh)
    if subscription.claimed:
        raise AccessRefused(f"{_where(queue)}: stream consumer name '{name}' is in use", 60, 20)
    subscription.claimed = True
    subscription.exhausted = False
    return subscription
