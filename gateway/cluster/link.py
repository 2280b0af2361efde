"""Cluster mode (`mqgw serve --meta redis://…`): metadata in Redis, messages on a broker, and
the tasks that keep several gateways in step. ``ClusterLink`` runs them; each has its module.

- **Backends.** ``open_cluster_backends`` (gateway/cluster/backends.py) opens the Redis
  metadata store and a store per broker group, routed per queue partition.
- **Gateway lease.** The gateway holds a lease in Redis (renewed every second, lapsing
  after 5 s). A gateway whose lease lapsed is reaped by whichever gateway sees it first: its
  exclusive queues are deleted, as RabbitMQ deletes them with their connection.
- **Change feed.** Every metadata change made anywhere reaches every gateway's caches (router,
  queue runtimes, users and permissions, policies, controls) within milliseconds; after a gap
  the gateway reloads everything (``Node.reload_metadata``). Applying a change twice is
  harmless, which is what a gateway's own changes coming back are.
- **Delivery leases** (gateway/cluster/delivery_leases.py). Each queue partition is delivered
  by one gateway at a time: the one holding its lease, taken among gateways with consumers on
  the queue. A gateway that takes a lease starts from the broker's committed offsets and flags
  what may have gone out before as redelivered: below the mark its last holder left giving the
  lease up cleanly (checked against the broker's fence), everything when that holder let it
  lapse. One that loses its lease stops delivering there; one with no use left for a lease (its
  consumers gone, its gets over, asked for it, stopping) commits and gives it up with such a
  note. Leases lapse 5 s after a gateway dies, so its unacked messages come back to the others.
- **basic.get** (gateway/cluster/hand_over.py) takes the queue's leases on demand (and keeps
  them a few seconds). Those another gateway holds are asked for (a request over Redis,
  ``HandOvers.serve`` answers it): a holder with no use for them hands them over at once, so a
  get is served after one hand-over; while the holder uses the queue a get here answers
  get-empty.
- **Fencing.** The lease's token goes with every offset commit of the partition, and the
  take-over read of the committed offset registers it on the broker: a holder that was replaced
  (paused past its lease, cut off from Redis) has its late commits refused (StaleFence) and
  stops delivering the partition, instead of moving the new holder's position.
- **Publishes from other gateways** (gateway/cluster/long_poll.py). A holder does not hear of
  them: for each partition it delivers that has consumers and nothing in hand, it keeps one
  read waiting on the broker (``wait_ms``, ``LONG_POLL_MS``), answered as soon as something is
  appended there; then the queue fills as usual. Partitions with messages in hand are looked at
  every ``POLL_S``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from gateway.cluster.delivery_leases import DeliveryLeases
from gateway.cluster.delivery_spread import place_slots
from gateway.cluster.hand_over import HandOvers
from gateway.cluster.long_poll import LongPollReads
from gateway.cluster.placement import QueuePlacement
from gateway.cluster.replies import ReplyRelay
from gateway.cluster.shares import ThrottleShares
from gateway.cluster.timings import (
    GATEWAY_LEASE_MS,
    POLL_S,
    QUEUE_IDS_WAIT_S,
    RELEASE_AT_STOP_S,
    RENEW_EVERY_S,
    RETRY_S,
)
from gateway.cluster.views import CLAIM_FRESH_MS, ClusterViews
from gateway.controls import Controls
from gateway.features.log_timer import TIMER_QUEUE_ID
from meta.change_feed import Change, Reload
from meta.errors import MetadataUnavailable
from meta.redis_store import RedisMetadataStore
from meta.reply_relay import ReplyInboxes
from meta.throttle_shares import ThrottleDemand
from storage import BrokerUnavailable
from storage.clients.routed import RoutedStore
from storage.errors import StoreError

if TYPE_CHECKING:
    from gateway.ports import ClusterNode
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.cluster")


class ClusterLink:
    """The cluster tasks of one gateway (see the module doc)."""

    def __init__(self, node: ClusterNode, meta: RedisMetadataStore, controls: Controls) -> None:
        self.node = node
        self.meta = meta
        self.gateway_id = node.name
        self.shares = ThrottleShares(controls, ThrottleDemand(meta), self.gateway_id)
        self.views = ClusterViews(meta, self.gateway_id, node.all_queues)  # (cluster/views.py)
        self.replies = ReplyRelay(node.direct_replies, ReplyInboxes(meta))  # direct reply-to
        self.leases = DeliveryLeases(node, meta, self.gateway_id)
        self.hand_overs = HandOvers(node, meta, self.gateway_id, self.leases)
        self.long_polls = LongPollReads(node, self.leases.held)
        # Several broker groups: the cache of the route table that the routed store reads.
        placement = node.store.placement if isinstance(node.store, RoutedStore) else None
        self.placement = placement if isinstance(placement, QueuePlacement) else None
        self.reloads = 0

    async def start(self) -> str:
        """Before connections are accepted: lease taken; returns the feed position to follow
        from (changes made while the node loaded come again: harmless)."""
        await self.meta.register_gateway(self.gateway_id, GATEWAY_LEASE_MS)
        return await self.meta.change_position()

    async def _queue_ids_past_brokers(self) -> None:
        """After a feed gap (Redis restarted or failed over, and may have lost the counter's
        last INCRs with the records of the queues they made): Redis hands out no queue id
        the brokers still hold. (At start there is nothing to do: node.start deletes the
        brokers' queues that no record names.)"""
        held: dict[int, int] | None = None
        try:
            with anyio.move_on_after(QUEUE_IDS_WAIT_S):  # a group away must not hold us up
                held = await self.node.store.queues()
        except StoreError as error:
            log.warning("cluster: queue ids not checked against the brokers (%s)", error)
            return
        if held is None:
            log.warning("cluster: queue ids not checked against the brokers (no answer "
                        "within %g s)", QUEUE_IDS_WAIT_S)  # fmt: skip
            return
        ids = [queue_id for queue_id in held if queue_id < TIMER_QUEUE_ID]  # not our own
        if ids:
            try:
                await self.meta.raise_queue_ids(max(ids))
            except MetadataUnavailable as error:  # the reload that follows must still run
                log.warning("cluster: queue ids not raised past the brokers' (%s)", error)

    async def run(self, position: str) -> None:
        """The cluster tasks, until cancelled (the server's stop, after the node's shutdown
        closed the connections and committed): then every delivery lease held is given up,
        with its note, rather than left to lapse."""
        try:
            async with anyio.create_task_group() as tg:
                self._tasks = tg
                self.long_polls.tasks = tg
                tg.start_soon(self._keep_lease)
                tg.start_soon(self._follow, position)
                tg.start_soon(self._deliver_leases)
                tg.start_soon(self.hand_overs.serve)
                tg.start_soon(self.replies.run)
                tg.start_soon(self.shares.run)
                tg.start_soon(self.views.run)
        finally:
            with anyio.move_on_after(RELEASE_AT_STOP_S, shield=True):
                await self.leases.give_all_up()

    # -- gateway lease and reaping ----------------------------------------------------------

    async def _keep_lease(self) -> None:
        while True:
            await anyio.sleep(RENEW_EVERY_S)
            try:
                if not await self.meta.renew_gateway(self.gateway_id, GATEWAY_LEASE_MS):
                    # Lapsed (a long pause, or Redis lost it): take it again; our exclusive
                    # queues may have been reaped meanwhile, which the feed tells us.
                    log.warning("cluster: gateway lease %s had lapsed; taken again",
                                self.gateway_id)  # fmt: skip
                    await self.meta.register_gateway(self.gateway_id, GATEWAY_LEASE_MS)
                for lapsed in await self.meta.lapsed_gateways():
                    if lapsed == self.gateway_id:
                        continue
                    deletions = await self.meta.reap_gateway(lapsed)
                    log.warning("cluster: gateway %s lapsed: %d exclusive queue(s) deleted",
                                lapsed, len(deletions.queues))  # fmt: skip
            except MetadataUnavailable as error:
                log.warning("cluster: %s", error)

    # -- change feed ------------------------------------------------------------------------

    async def _follow(self, position: str) -> None:
        while True:
            try:
                async for item in self.meta.follow(position):
                    if isinstance(item, Reload):
                        log.warning("cluster: metadata feed gap (%s): reloading", item.reason)
                        position = item.position
                        self.reloads += 1
                        await self._queue_ids_past_brokers()
                        await self.node.reload_metadata()
                        continue
                    position = item.id
                    await self._apply(item)
            except MetadataUnavailable as error:
                log.warning("cluster: change feed: %s", error)
                await anyio.sleep(1.0)

    async def _apply(self, change: Change) -> None:
        try:
            await self.node.apply_change(change)
        except (MetadataUnavailable, BrokerUnavailable):
            raise
        except Exception:
            log.exception("cluster: could not apply %s %s/%s; reloading",
                          change.kind, change.vhost, change.name)  # fmt: skip
            await self.node.reload_metadata()

    # -- delivery leases --------------------------------------------------------------------

    async def _deliver_leases(self) -> None:
        """Hold the lease of every partition of every queue with consumers here (tried at
        once for a new consumer, again every ``RETRY_S`` while another gateway holds it,
        renewed every second); give up the others; keep a long-poll read (``LongPollReads``)
        on each held partition with consumers, so that what other gateways write is read."""
        renew_at = 0.0
        retry_at: dict[tuple[int, int], float] = {}
        while True:
            now = anyio.current_time()
            try:
                if now >= renew_at:
                    renew_at = now + RENEW_EVERY_S
                    await self._spread()
                    await self.leases.renew_held()
                await self.leases.release_settled()
                for queue in self.node.all_queues():
                    for partition in range(queue.partitions):
                        if not self.leases.wanted(queue, partition, now):
                            continue
                        key = (queue.queue_id, partition)
                        if key not in self.leases.held and now >= retry_at.get(key, 0.0):
                            retry_at[key] = now + RETRY_S
                            await self.leases.hold_unless_away(queue, partition)
            except MetadataUnavailable as error:
                # Nobody can take a lease while Redis is away: keep delivering what we hold.
                log.warning("cluster: delivery leases not renewed: %s", error)
            self.long_polls.keep()
            await anyio.sleep(POLL_S)

    async def _spread(self) -> None:
        """Plain queues of several partitions: this gateway's share of their partitions
        (gateway/cluster/delivery_spread.py); given up or taken by the lease loop."""

        async def claimers(queues: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
            return await self.views.store.claimers(queues, CLAIM_FRESH_MS)

        for queue in await place_slots(self.node.all_queues(), claimers, self.gateway_id):
            self.node.scheduler.wake(queue)

    async def hold_for_get(self, queue: QueueRuntime) -> bool:
        """basic.get here: take the queue's leases now (``HandOvers.hold_for_get``)."""
        return await self.hand_overs.hold_for_get(queue)
