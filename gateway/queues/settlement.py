"""How a delivered message is settled, and how settling moves the committed offsets: an ack
(or a no-ack delivery) is done, a reject or a nack without requeue leaves through the queue's
departures (dead-lettered or dropped), a requeue puts it back before anything newer (or past
``x-delivery-limit``, out), and the redelivery backoff holds it until its timer record is
stored. The committed offset of a partition is its lowest unsettled offset; ``commit`` writes
it to the store (with the lease's fencing token and, on a cluster, the progress report other
gateways count by), and ``delivery_marks`` says what a next start must flag redelivered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.queues.queue_state import QueueState
from storage import QUEUE_GROUP, DeliveryProgress, StoredMessage
from storage.errors import StaleFence, StoreError


class Settlement(QueueState):
    """Acks, rejects, requeues and the committed offsets they move."""

    if TYPE_CHECKING:
        # Provided by the other parts of QueueRuntime (held_messages.py, leases.py).
        def _return(self, partition: int, message: StoredMessage) -> None: ...
        def lose_lease(self, partition: int, error: StaleFence, fence: int) -> None: ...

    def settle(self, partition: int, message: StoredMessage) -> None:
        """Ack, or a no-ack delivery: the message is done."""
        self.inflight[partition].discard(message.queue_offset)
        if self.returns:  # only messages that came back are counted there: mostly none
            self.returns.pop((partition, message.queue_offset), None)
        self.commit_dirty = True
        self.acked += 1

    def reject(self, partition: int, message: StoredMessage) -> None:
        """Reject or nack without requeue: dead-lettered (reason rejected) or dropped."""
        self.inflight[partition].discard(message.queue_offset)
        self.dead_letters.gone(partition, message, "rejected")

    def leave(self, partition: int, message: StoredMessage, reason: str) -> None:
        """A ready message leaves from the head: expired, maxlen (drop-head)."""
        self.ready_count -= 1
        self.ready_bytes -= len(message.body)
        self.dead_letters.gone(partition, message, reason)

    # -- redelivery backoff (gateway/features/redelivery.py) ------------------------------

    def hold_for_retry(self, partition: int, message: StoredMessage) -> None:
        """Nacked in backoff mode: stays in flight until its timer record is stored."""
        self.held_for_retry += 1

    def retry_stored(self, partition: int, message: StoredMessage) -> None:
        self.held_for_retry -= 1
        self.inflight[partition].discard(message.queue_offset)
        self.commit_dirty = True
        self.retried += 1

    def retry_failed(self, partition: int, message: StoredMessage) -> None:
        self.held_for_retry -= 1
        self.requeue(partition, message)

    def give_up(self, partition: int, message: StoredMessage) -> None:
        """Past x-max-redeliveries: to the dead-letter exchange, or the queue's .dlq."""
        self.inflight[partition].discard(message.queue_offset)
        self.dead_letters.gone(partition, message, "delivery_limit", to_dlq=True)

    def requeue(self, partition: int, message: StoredMessage) -> None:
        if self.deleted:
            return
        self.inflight[partition].discard(message.queue_offset)
        limit = self.behaviour.delivery_limit
        if limit is not None:
            key = (partition, message.queue_offset)
            returned = self.returns.get(key, 0) + 1
            if returned > limit:
                self.dead_letters.gone(partition, message, "delivery_limit")
                return
            self.returns[key] = returned  # take() stamps it on the next delivery
        self.ready_count += 1
        self.ready_bytes += len(message.body)
        self._return(partition, message)
        # Committed at the next pass (the offset may not move): in a cluster the progress
        # report sent with it counts the message ready again at the broker, where the other
        # gateways read their counts; at a shutdown, that final commit is the last report.
        self.commit_dirty = True

    # -- committed offsets ----------------------------------------------------------------

    def committed_offsets(self) -> list[int]:
        lowest = list(self.cursors)
        for partition, message in self.buffer:
            lowest[partition] = min(lowest[partition], message.queue_offset)
        for _, partition, message in self.requeued:
            lowest[partition] = min(lowest[partition], message.queue_offset)
        for partition, message in self.parked:
            lowest[partition] = min(lowest[partition], message.queue_offset)
        for partition, offsets in enumerate(self.inflight):
            if offsets:
                lowest[partition] = min(lowest[partition], *offsets)
        return lowest

    async def commit_partition(self, partition: int) -> bool:
        """The last commit of ``partition`` before its lease goes (it is no longer marked
        held, which ``commit`` skips): False if the broker refused the fence (the lease was
        lost meanwhile). StoreError if the broker is away."""
        progress = self.delivery_progress()
        report = progress[partition] if progress is not None else None
        offset, fence = self.committed_offsets()[partition], self.fences[partition]
        try:
            await self.store.commit_offset(
                QUEUE_GROUP, self.queue_id, partition, offset, fence, report
            )
        except StaleFence as error:
            self.lose_lease(partition, error, fence)
            return False
        return True

    async def report_progress(self) -> None:
        """Commit now, changed or not: refreshes the progress report (delivery_progress)
        that other gateways count and hold their publishers by."""
        self.commit_dirty = True
        await self.commit()

    async def commit(self) -> None:
        if not self.commit_dirty or self.deleted:
            return
        self.commit_dirty = False
        progress = self.delivery_progress()
        for partition, offset in enumerate(self.committed_offsets()):
            if self.leases is not None and not self.leases[partition]:
                # Cluster: the holder commits it. What is left here (a late ack after the
                # partition was handed over or lost) must not move its position, and an
                # unfenced commit (0 after lose_lease) would be admitted.
                continue
            fence = self.fences[partition]
            report = progress[partition] if progress is not None and fence else None  # held
            try:
                await self.store.commit_offset(
                    QUEUE_GROUP, self.queue_id, partition, offset, fence, report
                )
            except StaleFence as error:
                self.lose_lease(partition, error, fence)
            except StoreError:
                self.commit_dirty = True  # the broker is away: the next pass commits
                raise

    def delivery_progress(self) -> list[DeliveryProgress] | None:
        """Per partition where this gateway stands, for the store's ready counts and the
        flow control of the gateways that publish here (cluster only: an embedded node
        counts for itself). None where positions are not a single cursor (priority)."""
        if self.leases is None:
            return None
        behind = [0] * self.partitions
        for partition, _ in self.buffer:
            behind[partition] += 1
        for _, partition, _ in self.requeued:
            behind[partition] += 1
        # As congested() asks: a consumer this queue's choice would deliver to has credit.
        takers = (
            sum(1 for c in self.consumers if c.has_credit()) if self.choice.any_can_take() else 0
        )
        return [DeliveryProgress(at, behind[p], takers) for p, at in enumerate(self.cursors)]

    def delivery_marks(self) -> dict[int, int]:
        """Per partition where a message below may have been delivered and is not settled
        (past the committed offset): what the next start must flag redelivered."""
        committed = self.committed_offsets()
        marks = (max(pair) for pair in zip(self.maybe_delivered, self.delivered_below, strict=True))
        return {p: mark for p, mark in enumerate(marks) if mark > committed[p]}
