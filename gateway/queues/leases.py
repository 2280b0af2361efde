"""A queue's delivery leases on a cluster (gateway/cluster/link.py hands them out): which of
its partitions this gateway delivers, whether it wants one, taking a partition over from the
broker's committed offset (flagging redelivered what the last holder may have sent) and
handing it over after a final commit, and losing it when the broker refuses the lease's
fencing token. An embedded node has no leases (``leases`` is None) and delivers everything.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway.queues.queue_state import QueueState
from meta.cluster import HandedNote
from storage import QUEUE_GROUP, PartitionStats
from storage.errors import StaleFence

log = logging.getLogger("mqgw.queue")


class DeliveryLeases(QueueState):
    """Which partitions this gateway delivers, and moving them between gateways."""

    if TYPE_CHECKING:
        # Provided by the other parts of QueueRuntime (held_messages.py, store_reads.py,
        # settlement.py, scaled_route.py).
        def held_count(self) -> int: ...
        def _forget_partition(self, partition: int) -> None: ...
        def unpark(self, partition: int) -> None: ...
        def known(self, parts: Sequence[PartitionStats]) -> Sequence[PartitionStats]: ...
        def committed_offsets(self) -> list[int]: ...
        async def commit(self) -> None: ...
        def is_removed(self, partition: int) -> bool: ...
        def pass_removed_records(self) -> None: ...

    def start_leasing(self) -> None:
        """Cluster: nothing is delivered before this gateway holds a partition's lease."""
        self.leases = [False] * self.partitions

    def holds_all_leases(self) -> bool:
        """Cluster: the leases of every partition that may still deliver."""
        if self.leases is None:
            return True
        if self.route is None:
            return all(self.leases)
        return all(held or self.is_removed(p) for p, held in enumerate(self.leases))

    def may_serve(self) -> bool:
        """Whether this gateway delivers anything of the queue now (cluster: its leases;
        a queue with gray partitions: those of one lane are enough; a plain queue spread over
        the gateways: any one partition's)."""
        if self.delivery_slot is not None and self.leases is not None:
            return any(self.leases)
        return self.holds_all_leases()

    def wants_partition(self, partition: int) -> bool:
        """Whether a consumer here reads ``partition`` (cluster: worth holding its lease).
        Spread over the gateways with consumers (``delivery_slot``): every count-th partition
        not removed. Otherwise a scaled queue's lowest partition not removed first, the others
        by its holder (one gateway delivers the queue: a partition opened by a grow goes to
        it); an unscaled one's, all of them."""
        if partition in self.behind_removed:
            return bool(self.consumers)
        if not self.consumers or self.is_removed(partition):
            return False
        live = self.read_parts
        slot = self.delivery_slot
        route = self.route
        # A partition opening (a grow, read-first) goes to the lead's holder, which opens it
        # once it holds them all (gateway/vhost/elastic.py); once open, to its slot.
        opening = (
            route is not None
            and partition < len(route.partitions)
            and route.partitions[partition].state == "opening"
        )
        if slot is not None and not opening:
            return partition in live and live.index(partition) % slot[1] == slot[0]
        if route is None:
            return True
        lead = live[0] if live else 0
        return partition == lead or self.holds_lease(lead)

    def holds_lead(self) -> bool:
        """Whether this gateway delivers the queue's lowest partition not removed (the one
        that decides for the queue, as autoscale does, when several deliver it)."""
        live = self.read_parts
        return self.leases is None or (bool(live) and self.leases[live[0]])

    def holds_lease(self, partition: int) -> bool:
        return self.leases is None or self.leases[partition]

    def set_lease(self, partition: int, held: bool) -> None:
        if self.leases is not None:
            self.leases[partition] = held
            if held:
                self.unpark(partition)

    async def take_over(self, partition: int, handed: HandedNote | None = None) -> None:
        """This gateway now delivers ``partition``: start from the broker's committed offset
        (another gateway may have delivered and committed meanwhile) and flag as redelivered
        what may have gone out before (``_delivered_before``: what the last holder's note
        says, checked against the broker's fence). The read registers the lease's fencing
        token (``fences``, set by the cluster link): the holder replaced can commit no more
        (StaleFence)."""
        self.leaving.discard(partition)  # a lease taken afresh is not being given up
        fence = self.fences[partition]
        # The fence the last holder left (0: nobody ever held it), read before ours goes in.
        before = (await self.store.queue_stats(self.queue_id)).partitions[partition]
        committed = await self.store.committed_offset(QUEUE_GROUP, self.queue_id, partition, fence)
        # From here on the replaced holder's reads are refused: it can have read nothing past
        # the end these stats give, so that is how far "may have gone out" reaches.
        stats = await self.store.queue_stats(self.queue_id)
        if self.fences[partition] != fence:
            # A read with this token was refused while the take-over ran (``lose_lease``):
            # a higher one holds the partition. Going on would deliver it unfenced beside
            # that holder (nemesis seed 120).
            raise StaleFence(
                f"fencing token {fence} of queue {self.queue_id}/{partition} was refused "
                "during its take-over"
            )
        # Dropped after the reads (which yield): the partition is read again from committed.
        self._forget_partition(partition)
        part = stats.partitions[partition]
        self.cursors[partition] = max(committed, part.min_offset)
        self.maybe_delivered[partition] = _delivered_before(before, handed, part.max_offset)
        self.handed[partition] = handed
        self.ready_count = (
            sum(
                max(0, s.max_offset - self.cursors[s.partition])
                for s in self.known(stats.partitions)
            )
            + self.held_count()
        )
        self.exhausted = False
        self.set_lease(partition, True)
        if self.is_removed(partition):  # taken only to commit past its command record
            self.pass_removed_records()
            await self.commit()
            self.behind_removed.discard(partition)

    async def hand_over(self, partition: int) -> int:
        """This gateway stops delivering ``partition`` (after its final commit; the lease goes
        to another gateway): what it holds of it is dropped and its cursor goes back to the
        committed offset (a later commit here cannot move past what it dropped). Returns the
        note for the next holder: the offset below which a message may have gone out and is
        not settled (from here, or from a holder before, as the take-over learnt it)."""
        committed = self.committed_offsets()[partition]
        self._forget_partition(partition)
        self.cursors[partition] = committed
        self.set_lease(partition, False)
        self.leaving.discard(partition)
        return max(self.maybe_delivered[partition], self.delivered_below[partition], committed)

    def note_replaced(self, partition: int, fence: int, end: int) -> None:
        """A fenced read says our fence replaced ``fence`` at the copy it was read from, when
        the partition ended at ``end``: what that holder may have delivered from there is
        flagged redelivered, as at the take-over (the copy may not be the one the take-over
        read: a failover, or gateways that follow two masters for a moment, seed 107)."""
        below = _left_below(self.handed[partition], fence, end)
        self.maybe_delivered[partition] = max(self.maybe_delivered[partition], below)

    def lose_lease(self, partition: int, error: StaleFence, fence: int) -> None:
        """The broker refused fencing token ``fence`` on a commit or a read: another gateway
        took the partition over (our lease lapsed while we were paused or cut off from
        Redis). Stop delivering it; what our consumers hold unacked is redelivered from
        there. A call that went out with an older token than ours (this gateway took the
        lease again meanwhile: ours may be the one that shut it out) tells nothing."""
        if fence == 0 or fence != self.fences[partition]:
            return
        log.warning(
            "queue %r partition %d: fencing token refused (%s); lease token %d replaced, "
            "no longer delivering this partition",
            self.name,
            partition,
            error,
            self.fences[partition],
        )
        self.fences[partition] = 0
        self.set_lease(partition, False)


def _delivered_before(part: PartitionStats, handed: HandedNote | None, end: int) -> int:
    """Below which offset of a partition just taken over a message may have been delivered
    (cluster): nothing if no gateway ever took it over (no fence at the broker, no note in
    Redis); the mark its last holder left when it gave the lease up cleanly, if the broker's
    highest fence is that holder's (so nobody took it over since, even if Redis lost the
    newer note); otherwise (the lease lapsed, the note is gone) everything up to ``end``
    (the partition's end once the new token shut the last holder out)."""
    if handed is None and part.fence == 0:
        return 0
    return _left_below(handed, part.fence, end)


def _left_below(note: HandedNote | None, fence: int, end: int) -> int:
    """Below which offset the holder of ``fence`` may have delivered: the mark of its note,
    when the note is that holder's and it gave the lease up cleanly; else ``end``."""
    if note is not None and note.mark is not None and note.token == fence:
        return note.mark
    return end
