"""Redelivery backoff (vivo's and RocketMQ's gradient), for queues with x-redelivery=backoff.

A nack or reject with requeue=true does not put the message back at once: it waits on the
delay ladder (1s 5s 10s 30s 1m 2m ... 10m 20m 30m 1h 2h; attempt k waits the k-th step, the
last step repeating) in the log timer, on disk, and then re-enters its queue at the tail,
flagged redelivered and carrying ``x-delivery-count`` = k (as RabbitMQ's quorum queues
count). After ``x-max-redeliveries`` (default 16) the message is dead-lettered with reason
``delivery_limit``: to the queue's dead-letter exchange, or without one to ``<queue>.dlq``,
a durable queue an operator can inspect and re-drive (``mqgw queue redrive``).

Only explicit nacks and rejects back off; what a closing channel held goes back at once
(the consumer never judged it). The message stays unsettled in its queue until its timer
record is durable, so a crash in between redelivers it rather than losing it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gateway.amqp import property_bytes as pb
from gateway.features.log_timer import LogTimer, TimerItem, TimerMessage
from gateway.queues.dead_lettering import DELIVERY_COUNT, DLQ_SUFFIX, with_delivery_count
from storage import Record, StoredMessage, StoreError
from storage.record import REDELIVERED

if TYPE_CHECKING:
    from gateway.ports import VhostPort
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.redelivery")

REDELIVERY_KIND = 2  # this feature's kind in the log timer
REDRIVE_BATCH = 500
_S, _M, _H = 1000, 60_000, 3_600_000
DEFAULT_LADDER_MS: tuple[int, ...] = (
    *(_S * s for s in (1, 5, 10, 30)),
    *(_M * m for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30)),
    *(_H * h for h in (1, 2)),
)


def delivery_count(properties: bytes | memoryview) -> int:
    """The x-delivery-count header (0 when absent, not an integer, or unreadable)."""
    try:
        raw = pb.split_properties(properties).get(pb.HEADERS)
        entries = [] if raw is None else pb.split_table(raw)
    except (pb.PropertyError, IndexError):
        return 0
    for key, tag, value in entries:
        if key == DELIVERY_COUNT:
            count = pb.decode_scalar(tag, value)
            return count if isinstance(count, int) else 0
    return 0


class Redelivery:
    def __init__(
        self,
        vhosts: Mapping[str, VhostPort],
        timer: LogTimer,
        ladder_ms: tuple[int, ...] = DEFAULT_LADDER_MS,
    ) -> None:
        self.vhosts = vhosts
        self.timer = timer
        self.ladder_ms = ladder_ms
        self._waiting: list[tuple[VhostPort, QueueRuntime, int, StoredMessage, int]] = []
        self.scheduled = 0
        self.returned = 0
        self.dropped = 0

    @property
    def has_work(self) -> bool:
        return bool(self._waiting)

    def back_off(
        self, vhost: VhostPort, queue: QueueRuntime, partition: int, message: StoredMessage
    ) -> None:
        """A consumer refused the message: wait on the ladder, or give up after the limit."""
        attempt = delivery_count(message.properties) + 1
        if attempt > queue.behaviour.max_redeliveries:
            queue.give_up(partition, message)
            return
        queue.hold_for_retry(partition, message)
        self._waiting.append((vhost, queue, partition, message, attempt))

    async def flush(self) -> None:
        """Write the waiting messages' timer records, then let their queues forget them."""
        waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        records = [self._timer_record(*entry) for entry in waiting]
        try:
            await self.timer.add(records)
        except StoreError as error:
            log.error("%d message(s) requeued at once: backoff not stored: %s", len(records), error)
            for _, queue, partition, message, _ in waiting:
                queue.retry_failed(partition, message)
            return
        for _, queue, partition, message, _ in waiting:
            queue.retry_stored(partition, message)
        self.scheduled += len(waiting)

    def _timer_record(
        self,
        vhost: VhostPort,
        queue: QueueRuntime,
        partition: int,
        message: StoredMessage,
        attempt: int,
    ) -> Record:
        delay = self.ladder_ms[min(attempt, len(self.ladder_ms)) - 1]
        now = self.timer.clock()
        timer_message = TimerMessage(
            vhost.name,
            queue.name,
            message.exchange,
            message.routing_key,
            bytes(message.properties),
            bytes(message.body),
            message.flags,
            message.born_ts_ms,
        )
        return self.timer.schedule(REDELIVERY_KIND, now + delay, timer_message, attempt, 0, now)

    async def fire(self, items: list[TimerItem]) -> None:
        """Due: back into the queue's tail, flagged redelivered, counted."""
        batches: dict[str, list[Record]] = {}
        for item in items:
            m = item.message
            vhost = self.vhosts.get(m.vhost)
            queue = None if vhost is None else vhost.queues.get(m.target)
            if queue is None:
                self.dropped += 1
                log.warning(
                    "a message waiting to be redelivered to %r: its queue is gone", m.target
                )
                continue
            record = Record(
                m.exchange,
                m.routing_key,
                with_delivery_count(m.properties, item.attempt),
                m.body,
                ((queue.queue_id, 0),),
                m.born_ts_ms,
                m.flags | REDELIVERED,
            )
            batches.setdefault(m.vhost, []).append(record)
        for name, records in batches.items():
            await self.vhosts[name].append(records, wait_durable=True)
            self.returned += len(records)


async def redrive(vhost: VhostPort, name: str, limit: int) -> tuple[int, int]:
    """Move up to ``limit`` ready messages from ``<name>.dlq`` back to ``name`` (at its tail,
    as a publish to the default exchange, delivery count reset). Returns (moved, remaining).
    Each batch is appended durably before it leaves the dead-letter queue."""
    target = vhost.queues.get(name)
    dlq = vhost.queues.get(name + DLQ_SUFFIX)
    if target is None or dlq is None:
        raise KeyError(name if target is None else name + DLQ_SUFFIX)
    moved = 0
    while moved < limit:
        taken: list[tuple[int, StoredMessage]] = []
        while len(taken) < min(REDRIVE_BATCH, limit - moved):
            item = dlq.take()
            if item is None and not dlq.exhausted:
                await dlq.fill()
                item = dlq.take()
            if item is None:
                break
            taken.append((item[0], item[1]))
        if not taken:
            break
        records = [
            Record(
                b"",
                name.encode(),
                with_delivery_count(message.properties, None),
                bytes(message.body),
                ((target.queue_id, 0),),
                message.born_ts_ms,
                message.flags & ~REDELIVERED,
            )
            for _, message in taken
        ]
        try:
            await vhost.append(records, wait_durable=True)
        except StoreError:
            for partition, message in taken:
                dlq.requeue(partition, message)
            raise
        for partition, message in taken:
            dlq.settle(partition, message)
        moved += len(taken)
    return moved, await dlq.message_count()
