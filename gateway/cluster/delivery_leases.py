"""The delivery leases one gateway holds: each queue partition is delivered by the gateway
holding its lease in Redis. ``DeliveryLeases`` takes and renews them (``try_hold``), takes a
partition over from its last holder's note and registers the lease's fencing token on the
broker, moves the token counter past what a broker saw when Redis handed out a spent value
(the per-partition floors, ``_spent``), keeps a partition whose broker is away undelivered
until it is back, and gives leases up with the note for their next holder (``give_up``). It
owns the map of held leases (partition -> fencing token) that the hand-overs and the
long-poll reads look at; the cluster link's lease loop drives it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from gateway.cluster.timings import DELIVERY_LEASE_MS, GET_HOLD_S, SETTLE_S
from meta.cluster import HandedNote, token_counter
from meta.errors import MetadataUnavailable
from meta.redis_store import RedisMetadataStore
from storage import StoreError
from storage.errors import StaleFence

if TYPE_CHECKING:
    from gateway.ports import ClusterNode
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.cluster")


def lease_name(key: tuple[int, int]) -> str:
    return f"q:{key[0]}:{key[1]}"


def lease_key(name: str) -> tuple[int, int] | None:
    kind, _, rest = name.partition(":")
    queue_id, _, partition = rest.partition(":")
    if kind != "q" or not queue_id.isdigit() or not partition.isdigit():
        return None
    return int(queue_id), int(partition)


class DeliveryLeases:
    """The delivery leases of one gateway (see the module doc)."""

    def __init__(self, node: ClusterNode, meta: RedisMetadataStore, gateway_id: str) -> None:
        self.node = node
        self.meta = meta
        self.gateway_id = gateway_id
        self.held: dict[tuple[int, int], int] = {}  # (queue id, partition) -> fencing token
        self.away: set[tuple[int, int]] = set()  # partitions whose take-over failed (logged)
        # Partitions being taken over, and being given up (neither is started again
        # meanwhile); the note a lease was taken with, kept until its take-over succeeded
        # (token, note).
        self.taking: set[tuple[int, int]] = set()
        self.releasing: set[tuple[int, int]] = set()
        # Per partition, the counter a new token must pass (``_spent``).
        self.floors: dict[tuple[int, int], int] = {}
        self.notes: dict[tuple[int, int], tuple[int, HandedNote | None]] = {}
        # Held partitions no longer wanted, kept while their deliveries here settle (``settling``):
        # since when.
        self.settling_since: dict[tuple[int, int], float] = {}

    async def give_up(
        self, queue: QueueRuntime | None, key: tuple[int, int], must_commit: bool
    ) -> bool:
        """Commit, then give lease ``key`` up with the note for its next holder (the offset
        below which a message may have gone out and is not settled, ``hand_over``). With
        ``must_commit``, a commit that fails keeps the lease (False); otherwise the lease
        goes all the same: the note still covers everything delivered here."""
        if self.settling_since.pop(key, None) is not None and queue is not None:
            queue.leaving.discard(key[1])
        token = self.held.pop(key, None)
        if token is None:
            return True
        partition = key[1]
        self.releasing.add(key)
        try:
            mark = None
            # A take-over that did not finish (cancelled at a stop) delivered nothing and
            # commits nothing; it leaves no note (it has not read the one it was handed).
            if queue is not None and not queue.deleted and queue.holds_lease(partition):
                queue.set_lease(partition, False)  # nothing delivered from here meanwhile
                try:
                    ours = await queue.commit_partition(partition)
                except StoreError:
                    if must_commit:
                        self.held[key] = token
                        queue.set_lease(partition, True)
                        return False
                    ours = True
                if ours:  # not refused: the note is ours to leave
                    mark = await queue.hand_over(partition)
            await self.meta.drop_lease(lease_name(key), self.gateway_id, mark)
            return True
        finally:
            self.releasing.discard(key)

    async def give_all_up(self) -> None:
        """At a stop: every lease held here goes, each with its note."""
        for key in list(self.held):
            queue = self.node.queue_by_id(key[0])
            try:
                await self.give_up(queue, key, must_commit=False)
            except MetadataUnavailable as error:
                log.warning("cluster: delivery leases left to lapse: %s", error)
                return
        log.info("cluster: delivery leases given up")  # (at a stop, even if there were none)

    def wanted(self, queue: QueueRuntime, partition: int, now: float) -> bool:
        if queue.waiting_for_broker:  # started first (its take-over needs the broker too)
            return False
        # A queue with gray partitions: only the lane that consumers here read.
        return queue.wants_partition(partition) or now - queue.last_get < GET_HOLD_S

    async def try_hold(self, queue: QueueRuntime, partition: int) -> str | None:
        """Hold (take or renew) the partition's lease; the holder's name if another holds
        it. A lease taken changes hands with its last holder's note (``take_over``)."""
        key = (queue.queue_id, partition)
        if key in self.releasing or key in self.taking:
            return None  # being given up or taken over here (another task): not again
        lease = await self.meta.take_lease(
            lease_name(key), self.gateway_id, DELIVERY_LEASE_MS, self.floors.get(key, 0)
        )
        if not lease.mine:
            if self.held.pop(key, None) is not None:
                log.warning("cluster: lost the delivery lease of queue %r partition %d",
                            queue.name, partition)  # fmt: skip
            queue.set_lease(partition, False)
            return lease.holder
        token = lease.token
        if lease.taken:
            self.notes[key] = (token, lease.handed)
        if self.held.get(key) != token or (
            queue.leases is not None and not queue.leases[partition]
        ):
            if key in self.taking:
                # Another task (a get's, or the lease loop) took it during the call above and
                # is taking it over: a second take-over would start again from the committed
                # offset without the note, and deliver again, flagged, what the first did.
                return None
            self.held[key] = token
            queue.fences[partition] = token
            kept = self.notes.get(key)
            handed = kept[1] if kept is not None and kept[0] == token else None
            self.taking.add(key)
            try:
                await queue.take_over(partition, handed)
            except StaleFence as error:  # a token below one the broker saw: not ours to use
                del self.held[key]
                self.notes.pop(key, None)
                queue.lose_lease(partition, error, token)
                await self._spent(queue, key)
                return None
            finally:
                self.taking.discard(key)
            self.notes.pop(key, None)
            self.floors.pop(key, None)
            self.node.scheduler.wake(queue)
            log.info("cluster: delivering queue %r partition %d (lease token %d)",
                     queue.name, partition, token)  # fmt: skip
        return None

    async def _spent(self, queue: QueueRuntime, key: tuple[int, int]) -> None:
        """A broker refused the token Redis gave: Redis lost the writes that spent the
        counter's values up to the broker's token (a failover) or answered from an old master.
        The lease goes, and the next one taken gets a counter past the broker's: renewing
        this one would be refused for as long as it lasted."""
        try:
            stats = await queue.store.queue_stats(queue.queue_id)
        except StoreError:
            return  # the broker is away: the next round finds out again
        self.floors[key] = token_counter(stats.partitions[key[1]].fence)
        await self.meta.drop_lease(lease_name(key), self.gateway_id)

    async def hold_unless_away(self, queue: QueueRuntime, partition: int) -> None:
        """``try_hold``; while the partition's broker is away (the take-over's reads fail)
        it is not delivered here, and a later round tries again: a consumer on a queue whose
        group is down must not end the gateway."""
        key = (queue.queue_id, partition)
        try:
            await self.try_hold(queue, partition)
        except StoreError as error:
            self.held.pop(key, None)  # the take-over is still to do: nothing delivered or
            queue.fences[partition] = 0  # committed here until it is done
            queue.set_lease(partition, False)
            if key not in self.away:
                self.away.add(key)
                log.warning("cluster: queue %r partition %d not delivered here while its "
                            "broker is away: %s", queue.name, partition, error)  # fmt: skip
            return
        self.away.discard(key)

    async def renew_held(self) -> None:
        now = anyio.current_time()
        for key in list(self.held):
            if key in self.taking:
                continue  # a get's take-over (in its session's task): renewed next time
            queue = self.node.queue_by_id(key[0])
            if queue is not None and self._kept(queue, key, now):
                await self.hold_unless_away(queue, key[1])
                continue
            # No consumer here any more: let another gateway deliver.
            await self.give_up(queue, key, must_commit=False)

    def _kept(self, queue: QueueRuntime, key: tuple[int, int], now: float) -> bool:
        """Whether a held partition stays held: wanted here (ending a settling), or
        settling."""
        if self.wanted(queue, key[1], now):
            self._stay(queue, key)
            return True
        return self.settling(queue, key, now)

    def settling(self, queue: QueueRuntime, key: tuple[int, int], now: float) -> bool:
        """Whether a held partition no longer wanted here stays held a while: the queue's
        split changed (its consumers here remain) and they hold deliveries of it. Nothing
        more of it is read or delivered here (``queue.leaving``); handed over once those are
        settled, or after ``SETTLE_S``, its next holder has nothing to deliver again."""
        partition = key[1]
        if queue.deleted or not queue.consumers or not queue.inflight[partition]:
            return False
        since = self.settling_since.setdefault(key, now)
        if now - since >= SETTLE_S:
            return False
        queue.leaving.add(partition)
        return True

    def _stay(self, queue: QueueRuntime, key: tuple[int, int]) -> None:
        """Wanted here again while settling: delivered on, parked messages first."""
        if self.settling_since.pop(key, None) is None:
            return
        queue.leaving.discard(key[1])
        queue.unpark(key[1])
        self.node.scheduler.wake(queue)

    async def release_settled(self) -> None:
        """Give up the settling partitions whose deliveries here are settled (or that have
        waited ``SETTLE_S``): looked at every poll, so a hand-over follows the last ack."""
        if not self.settling_since:
            return
        now = anyio.current_time()
        for key in list(self.settling_since):
            queue = self.node.queue_by_id(key[0])
            if key in self.taking or key in self.releasing:
                continue
            if queue is not None and key in self.held and self._kept(queue, key, now):
                continue
            await self.give_up(queue, key, must_commit=False)
