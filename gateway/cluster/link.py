"""Cluster mode (`mqgw serve --meta redis://…`): metadata in Redis, messages on a broker, and
the tasks that keep several gateways in step.

- **Backends.** ``open_cluster_backends`` opens the Redis metadata store and finds the broker
  groups through it (brokers register themselves, see `mqgw broker --meta`; a replicated
  group's also heartbeat for the controller), then connects a store per group: a RemoteStore
  to an unreplicated group's broker, a GroupStore following a replicated group's master;
  both reconnect by themselves. A RoutedStore (storage/clients/routed.py) routes each queue
  partition to its group, as the route table in Redis says (gateway/cluster/placement.py: each new
  queue is placed on the live groups with the fewest partitions before it is created), with
  one group as with several: groups registered while the gateway runs are found and join it
  within about a second (gateway/cluster/groups.py).
- **Gateway lease.** The gateway holds a lease in Redis (renewed every second, lapsing after
  5 s). A gateway whose lease lapsed is reaped by whichever gateway sees it first: its
  exclusive queues are deleted, as RabbitMQ deletes them with their connection.
- **Change feed.** Every metadata change made anywhere reaches every gateway's caches
  (router, queue runtimes, users and permissions, policies, controls) within milliseconds;
  after a gap the gateway reloads everything (``Node.reload_metadata``). Applying a change
  twice is harmless, which is what a gateway's own changes coming back are.
- **Delivery leases.** Each queue partition is delivered by one gateway at a time: the one
  holding its lease, taken among gateways with consumers on the queue. A gateway that takes
  a lease starts from the broker's committed offsets and flags what may have gone out before
  as redelivered: below the mark its last holder left giving the lease up cleanly (checked
  against the broker's fence), everything when that holder let it lapse. One that loses its
  lease stops delivering there; one with no use left for a lease (its consumers gone, its
  gets over, asked for it, stopping) commits and gives it up with such a note. Leases lapse
  5 s after a gateway dies, so its unacked messages come back to the others.
- **basic.get** takes the queue's leases on demand (and keeps them a few seconds). Those
  another gateway holds are asked for (a request over Redis, ``_serve_hand_overs`` answers
  it): a holder with no use for them hands them over at once, so a get is served after one
  hand-over; while the holder uses the queue a get here answers get-empty.
- **Fencing.** The lease's token goes with every offset commit of the partition, and the
  take-over read of the committed offset registers it on the broker: a holder that was
  replaced (paused past its lease, cut off from Redis) has its late commits refused
  (StaleFence) and stops delivering the partition, instead of moving the new holder's
  position.
- **Publishes from other gateways.** A holder does not hear of them: for each partition it
  delivers that has consumers and nothing in hand, it keeps one read waiting on the broker
  (``wait_ms``, ``LONG_POLL_MS``), answered as soon as something is appended there; then the
  queue fills as usual. Partitions with messages in hand are looked at every ``POLL_S``.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from gateway.cluster.groups import BrokerGroups, find_start_groups, open_group
from gateway.cluster.placement import QueuePlacement
from gateway.cluster.replies import ReplyRelay
from gateway.cluster.shares import ThrottleShares
from gateway.cluster.views import ClusterViews
from gateway.controls import Controls
from meta.change_feed import Change, Reload
from meta.cluster import HandedNote, token_counter
from meta.errors import MetadataUnavailable
from meta.redis_store import RedisMetadataStore
from meta.reply_relay import ReplyInboxes
from meta.throttle_shares import ThrottleDemand
from storage import BrokerUnavailable, ReadStatus, StoreError
from storage.clients.routed import RoutedStore
from storage.errors import StaleFence
from storage.port import StorePort

if TYPE_CHECKING:
    from gateway.config.settings import GatewaySettings
    from gateway.ports import ClusterNode
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.cluster")

GATEWAY_LEASE_MS = 5_000
DELIVERY_LEASE_MS = 5_000
RENEW_EVERY_S = 1.0
POLL_S = 0.05
LONG_POLL_MS = 5_000  # a held read's longest wait on the broker (then it is sent again)
RETRY_S = 0.5
GET_HOLD_S = 5.0  # a queue read by basic.get keeps its leases this long after the last get
# basic.get on a gateway that does not hold the queue's leases asks the holder to hand them
# over and waits this long at most for its answer (docs/cluster.md: one hand-over is a few
# Redis and broker round trips; this bound is for a holder that is slow or gone).
HANDOVER_WAIT_S = 0.5
HANDOVER_LISTEN_S = 1.0  # the blocking read of requests to this gateway (then read again)
BUSY_S = POLL_S  # a holder's "busy" answer stands for the gets here during this long
SILENT_S = 1.0  # a holder that did not answer is not asked again during this long
RELEASE_AT_STOP_S = 2.0  # at a stop, the leases are given up within this (else they lapse)


@asynccontextmanager
async def open_cluster_backends(
    settings: GatewaySettings, exchange_types: frozenset[str]
) -> AsyncIterator[tuple[StorePort, RedisMetadataStore]]:
    assert settings.meta is not None
    url = settings.meta
    meta = RedisMetadataStore(url, exchange_types=exchange_types, default_user=not settings.users)
    try:
        groups = await find_start_groups(meta, url)
        async with AsyncExitStack() as stack:
            stores: dict[str, StorePort] = {}
            for group, address in groups.items():
                try:
                    stores[group] = await stack.enter_async_context(
                        open_group(url, group, address, settings.node_name)
                    )
                except (BrokerUnavailable, TimeoutError) as error:
                    # Its queues wait for it (BrokerGroups adds it once it is back); the
                    # gateway serves the others meanwhile.
                    log.warning("cluster: broker group %s is down at start (%s); its queues "
                                "are unavailable until it is back", group, error)  # fmt: skip
            if not stores:
                raise SystemExit(f"mqgw: no broker group of {url} could be reached")
            # A routed store even over one group: groups registered later join it.
            placement = QueuePlacement(meta, list(stores))
            for group, store in stores.items():
                placement.note_stored(group, await store.queues())
            routed = RoutedStore(stores, placement)
            later = BrokerGroups(meta, url, settings.node_name, routed, placement)
            placement.live = later.live
            placement.discover = later.ensure
            log.info("cluster: metadata in %s, queues placed over broker groups %s",
                     url, ", ".join(sorted(stores)))  # fmt: skip
            async with later.running():
                yield routed, meta
    finally:
        with anyio.CancelScope(shield=True):
            await meta.close()


class ClusterLink:
    """The cluster tasks of one gateway (see the module doc)."""

    def __init__(self, node: ClusterNode, meta: RedisMetadataStore, controls: Controls) -> None:
        self.node = node
        self.meta = meta
        self.gateway_id = node.name
        self.shares = ThrottleShares(controls, ThrottleDemand(meta), self.gateway_id)
        self.views = ClusterViews(meta, self.gateway_id, node.all_queues)  # (cluster/views.py)
        self.replies = ReplyRelay(node.direct_replies, ReplyInboxes(meta))  # direct reply-to
        self.held: dict[tuple[int, int], int] = {}  # (queue id, partition) -> fencing token
        # Several broker groups: the cache of the route table that the routed store reads.
        placement = node.store.placement if isinstance(node.store, RoutedStore) else None
        self.placement = placement if isinstance(placement, QueuePlacement) else None
        self.reloads = 0
        # Long-poll reads, one task per delivered partition with consumers (see _watch).
        self._watchers: dict[tuple[int, int], anyio.CancelScope] = {}
        self._exhausted: dict[int, anyio.Event] = {}  # queue id -> set when it read all
        self._away: set[tuple[int, int]] = set()  # partitions whose take-over failed (logged)
        self._tasks: anyio.abc.TaskGroup | None = None
        # Partitions being taken over, and being given up (neither is started again
        # meanwhile); per queue id, the hand-over request out for the gets here and when
        # another may be sent; the note a lease was taken with, kept until its take-over
        # succeeded (token, note).
        self._taking: set[tuple[int, int]] = set()
        self._releasing: set[tuple[int, int]] = set()
        # Per partition, the counter a new token must pass (``_spent``).
        self._floors: dict[tuple[int, int], int] = {}
        self._asking: dict[int, anyio.Event] = {}
        self._ask_after: dict[int, float] = {}
        self._notes: dict[tuple[int, int], tuple[int, HandedNote | None]] = {}
        self._requests = itertools.count(1)
        self._run_id = uuid.uuid4().hex[:12]  # request ids stay unique across restarts

    async def start(self) -> str:
        """Before connections are accepted: lease taken; returns the feed position to follow
        from (changes made while the node loaded come again: harmless)."""
        await self.meta.register_gateway(self.gateway_id, GATEWAY_LEASE_MS)
        return await self.meta.change_position()

    async def run(self, position: str) -> None:
        """The cluster tasks, until cancelled (the server's stop, after the node's shutdown
        closed the connections and committed): then every delivery lease held is given up,
        with its note, rather than left to lapse."""
        try:
            async with anyio.create_task_group() as tg:
                self._tasks = tg
                tg.start_soon(self._keep_lease)
                tg.start_soon(self._follow, position)
                tg.start_soon(self._deliver_leases)
                tg.start_soon(self._serve_hand_overs)
                tg.start_soon(self.replies.run)
                tg.start_soon(self.shares.run)
                tg.start_soon(self.views.run)
        finally:
            with anyio.move_on_after(RELEASE_AT_STOP_S, shield=True):
                await self._give_all_up()

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
        renewed every second); give up the others; keep a long-poll read (``_watch``) on
        each held partition with consumers, so that what other gateways write is read."""
        renew_at = 0.0
        retry_at: dict[tuple[int, int], float] = {}
        while True:
            now = anyio.current_time()
            try:
                if now >= renew_at:
                    renew_at = now + RENEW_EVERY_S
                    await self._renew_held()
                for queue in self.node.all_queues():
                    for partition in range(queue.partitions):
                        if not self._wanted(queue, partition, now):
                            continue
                        key = (queue.queue_id, partition)
                        if key not in self.held and now >= retry_at.get(key, 0.0):
                            retry_at[key] = now + RETRY_S
                            await self._hold_unless_away(queue, partition)
            except MetadataUnavailable as error:
                # Nobody can take a lease while Redis is away: keep delivering what we hold.
                log.warning("cluster: delivery leases not renewed: %s", error)
            self._keep_watchers()
            await anyio.sleep(POLL_S)

    # -- long-poll reads ----------------------------------------------------------------------

    def _watched(self, key: tuple[int, int]) -> QueueRuntime | None:
        queue = self.node.queue_by_id(key[0])
        if queue is None or queue.deleted or not queue.consumers or key not in self.held:
            return None
        return queue

    def _keep_watchers(self) -> None:
        """A watcher per held partition with consumers here; the others' are cancelled."""
        for key in [k for k in self._watchers if self._watched(k) is None]:
            self._watchers.pop(key).cancel()
        for key in self.held:
            queue = self._watched(key)
            if queue is not None and key not in self._watchers and self._tasks is not None:
                scope = self._watchers[key] = anyio.CancelScope()
                queue.on_exhausted = self._queue_exhausted
                self._tasks.start_soon(self._watch, queue, key[1], scope)

    def _queue_exhausted(self, queue: QueueRuntime) -> None:
        event = self._exhausted.pop(queue.queue_id, None)
        if event is not None:
            event.set()

    async def _watch(self, queue: QueueRuntime, partition: int, scope: anyio.CancelScope) -> None:
        """While the queue has read everything: a read held on the broker from its cursor;
        when it answers with something, the queue fills (the scheduler reads it all)."""
        key = (queue.queue_id, partition)
        with scope:
            while True:
                if not (queue.exhausted and queue.may_serve()):
                    # Messages in hand: wait until a fill reads to the end (or look again
                    # shortly: some queue kinds decide exhaustion without a fill).
                    event = self._exhausted.setdefault(queue.queue_id, anyio.Event())
                    with anyio.move_on_after(POLL_S):
                        await event.wait()
                    continue
                offset, fence = queue.cursors[partition], queue.fences[partition]
                try:
                    found = await self.node.store.read(
                        queue.queue_id, partition, offset, 1, wait_ms=LONG_POLL_MS, fence=fence
                    )
                except StaleFence as error:  # taken over: the lease loop sees it lost next
                    queue.lose_lease(partition, error, fence)
                    await anyio.sleep(RETRY_S)
                    continue
                except StoreError as error:
                    log.debug("cluster: long-poll read of %r/%d: %s", queue.name, partition,
                              error)  # fmt: skip
                    await anyio.sleep(RETRY_S)
                    continue
                if found.status is ReadStatus.OFFSET_OVERFLOW:
                    await anyio.sleep(RETRY_S)  # past the end (a truncated log): no spinning
                if (found.messages or found.status is not ReadStatus.NO_NEW_MESSAGE) and (
                    queue.exhausted and queue.cursors[partition] == offset
                ):
                    queue.exhausted = False
                    self.node.scheduler.wake(queue)
        if self._watchers.get(key) is scope:
            del self._watchers[key]

    async def hold_for_get(self, queue: QueueRuntime) -> bool:
        """basic.get here: take the queue's leases now, and keep them a while (``GET_HOLD_S``)
        for the gets that usually follow. Those another gateway holds are asked for: one
        with no use for them (no consumer on the queue there, no get under way, nothing of
        them delivered and unacked) commits and gives them up (``_hand_over``), and they are
        taken here at once. False while it does use them, or gives no answer within
        ``HANDOVER_WAIT_S`` (the get answers get-empty, as for a queue another consumer
        drains)."""
        queue.last_get = anyio.current_time()
        if queue.holds_all_leases():
            return True
        try:
            others = await self._hold_free(queue)
            if others and await self._asked_to_hand_over(queue, others):
                await self._hold_free(queue)
        except MetadataUnavailable:
            return False
        return queue.holds_all_leases()

    async def _hold_free(self, queue: QueueRuntime) -> dict[str, list[int]]:
        """Take the queue's leases nobody holds; the partitions others hold, by holder."""
        others: dict[str, list[int]] = {}
        for partition in range(queue.partitions):
            if (queue.queue_id, partition) not in self.held:
                holder = await self._try_hold(queue, partition)
                if holder is not None:
                    others.setdefault(holder, []).append(partition)
        return others

    async def _asked_to_hand_over(self, queue: QueueRuntime, others: dict[str, list[int]]) -> bool:
        """Ask the holders of the queue's other partitions to hand them over; True if each
        said it gave them up. One request at a time per queue: the gets that come while it
        is out wait for its answer. After "busy" no new request goes out for ``BUSY_S``,
        after no answer for ``SILENT_S``: those gets answer get-empty at once."""
        queue_id = queue.queue_id
        pending = self._asking.get(queue_id)
        if pending is not None:
            with anyio.move_on_after(HANDOVER_WAIT_S):
                await pending.wait()
            return True  # whatever it answered, holding again is cheap
        if anyio.current_time() < self._ask_after.get(queue_id, 0.0):
            return False
        self._ask_after.pop(queue_id, None)
        event = self._asking[queue_id] = anyio.Event()
        try:
            for holder, partitions in others.items():
                names = [_lease_name((queue_id, p)) for p in partitions]
                request_id = f"{self.gateway_id}/{self._run_id}/{next(self._requests)}"
                answer = await self.meta.ask_hand_over(holder, names, request_id, HANDOVER_WAIT_S)
                if answer != RELEASED:
                    pause = BUSY_S if answer == BUSY else SILENT_S
                    self._ask_after[queue_id] = anyio.current_time() + pause
                    if answer is None:
                        log.info("cluster: gateway %s did not answer for queue %r within "
                                 "%.1f s", holder, queue.name, HANDOVER_WAIT_S)  # fmt: skip
                    return False
            return True
        finally:
            del self._asking[queue_id]
            event.set()

    # -- handing leases over --------------------------------------------------------------

    async def _serve_hand_overs(self) -> None:
        """Answer the other gateways' requests for leases held here (``hold_for_get``)."""
        while True:
            try:
                requests = await self.meta.hand_over_requests(self.gateway_id, HANDOVER_LISTEN_S)
                for request in requests:
                    answer = await self._hand_over(request.names)
                    await self.meta.answer_hand_over(request.request_id, answer)
            except MetadataUnavailable as error:
                log.warning("cluster: lease hand-over requests: %s", error)
                await anyio.sleep(RETRY_S)

    async def _hand_over(self, names: tuple[str, ...]) -> str:
        """Give the leases ``names`` (one queue's partitions) up if this gateway has no use
        for them: no consumer on the queue here, no get under way, nothing of theirs
        delivered and unacknowledged (a hand-over would deliver it twice). All or none."""
        keys = [k for k in (_lease_key(n) for n in names) if k is not None and k in self.held]
        if not keys:
            return RELEASED  # not held here (any more)
        if any(k in self._taking for k in keys) or keys[0][0] in self._asking:
            return BUSY  # just taken here, or a get here asks for its other partitions
        queue = self.node.queue_by_id(keys[0][0])
        if queue is not None and not queue.deleted:
            if _in_use(queue, [p for _, p in keys]):
                return BUSY
            queue.last_get = -1e9  # the gets are the asker's now: not taken back for them
        for key in keys:
            if not await self._give_up(queue, key, must_commit=True):
                return BUSY  # its broker is away: nothing given up that was not committed
        log.debug("cluster: queue %r partition(s) %s handed over on request",
                  queue.name if queue else keys[0][0], [p for _, p in keys])  # fmt: skip
        return RELEASED

    async def _give_up(
        self, queue: QueueRuntime | None, key: tuple[int, int], must_commit: bool
    ) -> bool:
        """Commit, then give lease ``key`` up with the note for its next holder (the offset
        below which a message may have gone out and is not settled, ``hand_over``). With
        ``must_commit``, a commit that fails keeps the lease (False); otherwise the lease
        goes all the same: the note still covers everything delivered here."""
        token = self.held.pop(key, None)
        if token is None:
            return True
        partition = key[1]
        self._releasing.add(key)
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
            await self.meta.drop_lease(_lease_name(key), self.gateway_id, mark)
            return True
        finally:
            self._releasing.discard(key)

    async def _give_all_up(self) -> None:
        """At a stop: every lease held here goes, each with its note."""
        for key in list(self.held):
            queue = self.node.queue_by_id(key[0])
            try:
                await self._give_up(queue, key, must_commit=False)
            except MetadataUnavailable as error:
                log.warning("cluster: delivery leases left to lapse: %s", error)
                return
        log.info("cluster: delivery leases given up")  # (at a stop, even if there were none)

    def _wanted(self, queue: QueueRuntime, partition: int, now: float) -> bool:
        if queue.waiting_for_broker:  # started first (its take-over needs the broker too)
            return False
        # A queue with gray partitions: only the lane that consumers here read.
        return queue.wants_partition(partition) or now - queue.last_get < GET_HOLD_S

    async def _try_hold(self, queue: QueueRuntime, partition: int) -> str | None:
        """Hold (take or renew) the partition's lease; the holder's name if another holds
        it. A lease taken changes hands with its last holder's note (``take_over``)."""
        key = (queue.queue_id, partition)
        if key in self._releasing or key in self._taking:
            return None  # being given up or taken over here (another task): not again
        lease = await self.meta.take_lease(
            _lease_name(key), self.gateway_id, DELIVERY_LEASE_MS, self._floors.get(key, 0)
        )
        if not lease.mine:
            if self.held.pop(key, None) is not None:
                log.warning("cluster: lost the delivery lease of queue %r partition %d",
                            queue.name, partition)  # fmt: skip
            queue.set_lease(partition, False)
            return lease.holder
        token = lease.token
        if lease.taken:
            self._notes[key] = (token, lease.handed)
        if self.held.get(key) != token or (
            queue.leases is not None and not queue.leases[partition]
        ):
            self.held[key] = token
            queue.fences[partition] = token
            kept = self._notes.get(key)
            handed = kept[1] if kept is not None and kept[0] == token else None
            self._taking.add(key)
            try:
                await queue.take_over(partition, handed)
            except StaleFence as error:  # a token below one the broker saw: not ours to use
                del self.held[key]
                self._notes.pop(key, None)
                queue.lose_lease(partition, error, token)
                await self._spent(queue, key)
                return None
            finally:
                self._taking.discard(key)
            self._notes.pop(key, None)
            self._floors.pop(key, None)
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
        self._floors[key] = token_counter(stats.partitions[key[1]].fence)
        await self.meta.drop_lease(_lease_name(key), self.gateway_id)

    async def _hold_unless_away(self, queue: QueueRuntime, partition: int) -> None:
        """``_try_hold``; while the partition's broker is away (the take-over's reads fail)
        it is not delivered here, and a later round tries again: a consumer on a queue whose
        group is down must not end the gateway."""
        key = (queue.queue_id, partition)
        try:
            await self._try_hold(queue, partition)
        except StoreError as error:
            self.held.pop(key, None)  # the take-over is still to do: nothing delivered or
            queue.fences[partition] = 0  # committed here until it is done
            queue.set_lease(partition, False)
            if key not in self._away:
                self._away.add(key)
                log.warning("cluster: queue %r partition %d not delivered here while its "
                            "broker is away: %s", queue.name, partition, error)  # fmt: skip
            return
        self._away.discard(key)

    async def _renew_held(self) -> None:
        now = anyio.current_time()
        for key in list(self.held):
            if key in self._taking:
                continue  # a get's take-over (in its session's task): renewed next time
            queue = self.node.queue_by_id(key[0])
            if queue is not None and self._wanted(queue, key[1], now):
                await self._hold_unless_away(queue, key[1])
                continue
            # No consumer here any more: let another gateway deliver.
            await self._give_up(queue, key, must_commit=False)


RELEASED = "released"
BUSY = "busy"


def _lease_name(key: tuple[int, int]) -> str:
    return f"q:{key[0]}:{key[1]}"


def _lease_key(name: str) -> tuple[int, int] | None:
    kind, _, rest = name.partition(":")
    queue_id, _, partition = rest.partition(":")
    if kind != "q" or not queue_id.isdigit() or not partition.isdigit():
        return None
    return int(queue_id), int(partition)


def _in_use(queue: QueueRuntime, partitions: list[int]) -> bool:
    """Whether this gateway uses the queue's ``partitions``: a consumer on the queue, a
    basic.get under way, or a message of theirs delivered and not yet settled."""
    return bool(
        any(queue.wants_partition(p) for p in partitions)
        or queue.getting
        or any(queue.inflight[p] for p in partitions)
    )
