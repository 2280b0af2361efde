"""The gateway node: one store, one metadata store, its vhosts, the push scheduler and the
connections. `mqgw serve` runs exactly one of these (embedded mode). The node builds and
holds every part; what it does with them lives beside it: the alarms (``resources.py``), the
once-a-second duties (``housekeeping.py``), the dead-letter outbox task (``hand_over.py``),
consumer timeouts and the connections as a whole (``consumer_timeouts.py``,
``connections.py``), the change feed (``metadata_sync.py``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from itertools import count
from typing import TYPE_CHECKING

import anyio

from gateway.amqp.errors import ConnectionForced
from gateway.config.settings import GatewaySettings
from gateway.controls import Controls
from gateway.features.broadcast import Broadcasts
from gateway.features.delayed_exchange import DELAYED_KIND, DelayedDelivery
from gateway.features.direct_reply import DirectReplies
from gateway.features.gray import GrayRegistry
from gateway.features.log_timer import DEFAULT_LEVELS_MS, TIMER_QUEUE_ID, LogTimer
from gateway.features.redelivery import DEFAULT_LADDER_MS, REDELIVERY_KIND, Redelivery
from gateway.node import consumer_timeouts, metadata_sync
from gateway.node import housekeeping as chores
from gateway.node.connections import admits, cancel_consumers, close_vhost_sessions
from gateway.node.hand_over import HandOver
from gateway.node.housekeeping import COMMIT_INTERVAL_S, STORE_AWAY_LOG_EVERY_S
from gateway.node.resources import ResourceWatch, memory_breakdown
from gateway.node.users import Users
from gateway.observe.stats import NodeStats
from gateway.observe.tracing import tracing_from_settings
from gateway.queues import delivery_marks
from gateway.queues.breaker import BreakerWatch
from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.sessions import taps
from gateway.sessions.access import Access
from gateway.sessions.channel_state import ChannelState
from gateway.sessions.publishing import deliver_reply, return_reply
from gateway.sessions.session import Session
from gateway.vhost import VirtualHost
from gateway.vhost.autoscale import Autoscaler
from gateway.vhost.group_mover import GroupMover
from gateway.vhost.rescale import RouteKeeper
from meta.change_feed import Change
from meta.models import Deletions, Policy, User, VHost, VHostLimits
from meta.store import MetadataStore
from storage import StoredMessage, StoreError, StorePort

if TYPE_CHECKING:
    from gateway.cluster.backlog import RemoteBacklog
    from gateway.cluster.link import ClusterLink

log = logging.getLogger("mqgw.node")


class Node:
    def __init__(self, settings: GatewaySettings, store: StorePort, meta: MetadataStore) -> None:
        self.settings = settings
        self.store = store
        self.meta = meta
        self.broadcasts = Broadcasts()
        self.scheduler = PushScheduler(settings.push_tasks, settings.push_quota)
        self.scheduler.redirect = self.broadcasts.wake_instead
        self.vhosts: dict[str, VirtualHost] = {}
        self._opening: dict[str, anyio.Event] = {}  # vhost name -> set once open
        self.sessions: set[Session] = set()
        self.open_connections = 0
        self.stats = NodeStats()  # message counters and rates (management API, /metrics)
        self.tracing = tracing_from_settings(settings)  # OpenTelemetry spans; None: off
        self._numbers = count(1)
        self.name = settings.node_name
        self.access = Access(meta)
        self.controls = Controls(self)
        self.resources = ResourceWatch(settings, store)
        # The same alarm objects under the names sessions and the admin API read (plain
        # attributes: a publish batch reads ``alarms`` without a property call).
        self.disk_alarm = self.resources.disk_alarm
        self.store_alarm = self.resources.store_alarm
        self.memory_alarm = self.resources.memory_alarm
        self.alarms = self.resources.alarms
        self.next_resource_look = 0  # store offset past which a publish batch looks again
        self.direct_replies: DirectReplies[ChannelState] = DirectReplies(
            settings.node_name, deliver_reply, return_reply
        )
        self.timer = LogTimer(
            store,
            settings.timer_levels_ms or DEFAULT_LEVELS_MS,
            # Read well before an opt-in age retention may drop it.
            max_level_ms=None if settings.retention_ms is None else settings.retention_ms // 2,
        )
        self.delayed = DelayedDelivery(self.vhosts)
        self.timer.register(DELAYED_KIND, self.delayed.fire)
        ladder = tuple(settings.redelivery_ladder_ms or DEFAULT_LADDER_MS)
        self.redelivery = Redelivery(self.vhosts, self.timer, ladder)
        self.timer.register(REDELIVERY_KIND, self.redelivery.fire)
        self.hand_over = HandOver(self.vhosts, self.redelivery)  # the dead-letter outbox task
        self.scheduler.on_unused = self._delete_unused
        self.cluster: ClusterLink | None = None  # set by the server in cluster mode
        self.remote_backlog: RemoteBacklog | None = None  # likewise
        self.closing_refused: str | None = None  # likewise (VirtualHost.closing_refused)
        self.users = Users(meta, settings, self.scheduler.clock)
        # Connections closed while the metadata store was away: their exclusive queues.
        self.owners_to_clean: set[str] = set()
        # Per-vhost limits (meta/vhost_limits.py), kept by the change feed and the admin API;
        # and (vhost, "<gateway>/<n>") of connections closed while Redis was away, still
        # counted there.
        self.vhost_limits: dict[str, VHostLimits] = {}
        self.connections_to_uncount: set[tuple[str, str]] = set()
        # Gray release rules (gateway/features/gray.py), kept by the change feed.
        self.gray = GrayRegistry()
        self.gray.on_end = self._gray_end
        # Keyed-order queues' route changes in progress (gateway/vhost/rescale.py).
        self.routes = RouteKeeper(self._routed_queues)
        self.group_mover = GroupMover(self.vhosts.get, self.routes)  # drain, rebalance
        self.autoscaler = Autoscaler(self.hosted_queues, self._queue_depth, self.routes)
        # Depth breakers (gateway/queues/breaker.py): judged by the runtime's count here, by
        # the broker's on a cluster.
        self.breakers = BreakerWatch(self.all_queues, self._queue_depth,
                                     self.scheduler.clock.monotonic)  # fmt: skip

    async def _queue_depth(self, queue: QueueRuntime) -> int:
        if self.remote_backlog is None:
            return queue.ready_count
        # The broker's count (at most SAMPLE_TTL_S old) and what this gateway routed since.
        sample = await self.remote_backlog.sample(queue)
        return sample.depth + max(0, queue.enqueued - sample.routed_here)

    def hosted_queues(self) -> Iterator[tuple[VirtualHost, QueueRuntime]]:
        """Every queue with its vhost (group moves, autoscale)."""
        for host in list(self.vhosts.values()):
            for queue in list(host.queues.values()):
                yield host, queue

    def _routed_queues(self) -> Iterator[tuple[VirtualHost, QueueRuntime]]:
        for host in list(self.vhosts.values()):
            for queue in list(host.routed.values()):
                yield host, queue

    def _gray_end(self, vhost: str, queue: str, ended: bool) -> None:
        host = self.vhosts.get(vhost)
        if host is not None:
            host.set_gray_ended(queue, ended)

    def admit(self, session: Session) -> bool:
        """max_connections_per_address: refuse a socket from an address already at the cap."""
        return admits(self.sessions, session, self.settings.max_connections_per_address)

    @property
    def clustered(self) -> bool:
        return self.cluster is not None

    def next_connection_number(self) -> int:
        return next(self._numbers)

    async def start(self) -> None:
        """Apply configured users and vhosts, rebuild vhosts, drop transient leftovers, and
        read the alarms once, before any connection is accepted: a node started on a full
        disk blocks publishers from the first frame and serves consumers and deletes."""
        await self.users.apply_configured()
        for policy in self.settings.policies:
            await self.meta.put_policy(Policy.model_validate(policy.model_dump()))
        await self.access.load()
        await self.refresh_users()
        await self.controls.load()
        await self.load_vhost_limits()
        self.gray.load(await self.meta.list_gray_rules())
        self.gray.load_ends(await self.meta.list_gray_ends())
        await self.meta.forget_connections(self.name)  # a former process of this name
        known: set[int] = {TIMER_QUEUE_ID}
        for vhost_def in await self.meta.list_vhosts():
            vhost = await self.open_vhost(vhost_def.name)
            known.update(vhost.queues_by_id)
        for queue_id in await self.store.queues():
            if queue_id not in known:  # a transient queue from before a restart
                await self.store.delete_queue(queue_id)
        if self.cluster is None:  # what went out unacked before a clean stop: redelivered
            delivery_marks.apply(delivery_marks.load(self.settings.data_dir), self.all_queues())
            for queue in self.all_queues():
                await queue.leave_lost_transients()
        await self.timer.start()
        await self.check_resources()

    async def load_vhost_limits(self) -> None:
        self.vhost_limits = {v.vhost: v for v in await self.meta.list_vhost_limits()}

    async def open_vhost(self, name: str) -> VirtualHost:
        """The vhost, opened unless it is already; once per name at a time (in a cluster the
        change feed brings add_vhost's own change back while the vhost is still loading: a
        second VirtualHost would replace the first, and what was declared on it)."""
        while (pending := self._opening.get(name)) is not None:
            await pending.wait()
        known = self.vhosts.get(name)
        if known is not None:
            return known
        self._opening[name] = opened = anyio.Event()
        try:
            return await self._open_vhost(name)
        finally:
            del self._opening[name]
            opened.set()

    async def _open_vhost(self, name: str) -> VirtualHost:
        vhost = VirtualHost(
            name, self.meta, self.store, self.scheduler, self.settings.queue_partitions
        )
        vhost.on_queue_deleted = self._queue_deleted
        vhost.on_queue_attached = self._queue_attached
        vhost.on_dead_letter = self.hand_over.waiting.set
        vhost.gray_ended = self.gray.ended_in(name)
        vhost.closing_refused = self.closing_refused
        if self.cluster is not None:  # several broker groups: queues are placed first
            vhost.placement = self.cluster.placement
        definition = await self.meta.get_vhost(name)
        vhost.default_groups = () if definition is None else definition.default_groups
        await vhost.load()
        self.vhosts[vhost.name] = vhost
        await taps.restore_firehose(self, vhost)
        return vhost

    async def add_vhost(self, definition: VHost) -> None:
        """Create a vhost at run time (the admin API, definitions import)."""
        await self.meta.add_vhost(definition)
        if definition.name not in self.vhosts:
            await self.open_vhost(definition.name)
            log.info("vhost %r created", definition.name)

    def _queue_attached(self, queue: QueueRuntime) -> None:
        self.controls.attach_queue(queue)
        if self.cluster is not None:  # nothing delivered before this gateway holds the lease
            queue.start_leasing()

    def all_queues(self) -> list[QueueRuntime]:
        return [q for vhost in self.vhosts.values() for q in vhost.queues.values()]

    def queue_by_id(self, queue_id: int) -> QueueRuntime | None:
        for vhost in self.vhosts.values():
            queue = vhost.queues_by_id.get(queue_id)
            if queue is not None:
                return queue
        return None

    async def apply_change(self, change: Change) -> None:
        await metadata_sync.apply_change(self, change)

    async def reload_metadata(self) -> None:
        await metadata_sync.reload(self)

    async def forget_vhost(self, name: str) -> None:
        """A vhost deleted elsewhere: close its connections here, drop its runtimes."""
        vhost = self.vhosts.pop(name, None)
        self.vhost_limits.pop(name, None)
        if vhost is None:
            return
        await close_vhost_sessions(self.sessions, name, vhost)
        self.access.forget_vhost(name)
        await vhost.forget(Deletions(queues=tuple(q.definition for q in vhost.queues.values())))
        log.info("vhost %r deleted (elsewhere in the cluster)", name)

    async def delete_vhost(self, name: str) -> None:
        """Delete a vhost and everything in it; its connections are closed with 320."""
        vhost = self.vhosts.pop(name, None)
        await close_vhost_sessions(self.sessions, name, vhost)
        deletions = await self.meta.delete_vhost(name)
        self.vhost_limits.pop(name, None)
        self.access.forget_vhost(name)
        await self.controls.forget_vhost(name)
        if vhost is not None:
            await vhost.apply_deletions(deletions)
        log.info("vhost %r deleted", name)

    # -- users (gateway/node/users.py) ----------------------------------------------------

    async def authenticate(self, username: str, password: bytes) -> User | None:
        return await self.users.authenticate(username, password)

    def known_user(self, name: str) -> User | None:
        return self.users.known(name)

    async def get_user(self, name: str) -> User | None:
        return await self.users.get(name)

    async def refresh_users(self) -> None:
        await self.users.refresh()

    def _queue_deleted(self, queue: QueueRuntime) -> None:
        """Consumers of a deleted queue are cancelled; clients that can hear it are told."""
        self.broadcasts.queue_deleted(queue)
        self.gray.end_deleted(queue.definition.vhost, queue.name)  # a new one starts afresh
        cancel_consumers(queue)

    async def _delete_unused(self, queue: QueueRuntime) -> None:
        """x-expires: the queue went unused (no consumer, get or redeclare) for too long."""
        vhost = self.vhosts.get(queue.definition.vhost)
        if vhost is None or vhost.queues.get(queue.name) is not queue:
            return
        log.info("queue %r in vhost %r expired (x-expires)", queue.name, vhost.name)
        await vhost.delete_queue(queue.name, None, check=False)

    def back_off(
        self, vhost: VirtualHost, queue: QueueRuntime, partition: int, message: StoredMessage
    ) -> None:
        """A nack in backoff mode: the redelivery ladder (stored by the outbox task)."""
        self.hand_over.back_off(vhost, queue, partition, message)

    async def dead_letter_loop(self) -> None:
        """The outbox task: dead letters, backoff retries, trace copies (hand_over.py)."""
        await self.hand_over.run()

    async def consumer_timeout_loop(self) -> None:
        """Close channels holding a delivery unacked past its queue's consumer timeout."""
        await consumer_timeouts.run(self.sessions, self.settings, self.scheduler.clock)

    def queue(self, vhost: str, name: str) -> QueueRuntime | None:
        host = self.vhosts.get(vhost)
        return None if host is None else host.queues.get(name)

    async def commit_offsets(self) -> None:
        """Commit every queue's position that moved (gateway/node/housekeeping.py)."""
        await chores.commit_offsets(self.vhosts, self.broadcasts, self.timer)

    async def housekeeping(self) -> None:
        clock = self.scheduler.clock
        away_logged = float("-inf")
        steps: list[Callable[[], Awaitable[None]]] = [
            lambda: self.sample_stats(clock.monotonic()),
            lambda: self.apply_queue_retention(clock.wall_ms()),
            self.commit_offsets,
            lambda: chores.start_waiting_queues(self.vhosts),
        ]
        while True:
            await self.check_resources()
            await anyio.sleep(COMMIT_INTERVAL_S)
            for step in steps:
                try:
                    await step()
                except StoreError as error:
                    # A broker group away (cluster): its queues wait, the step runs again in
                    # a second; the gateway and the other groups' queues carry on.
                    if clock.monotonic() - away_logged >= STORE_AWAY_LOG_EVERY_S:
                        away_logged = clock.monotonic()
                        log.warning("housekeeping: store calls fail (%s); retrying every "
                                    "%.0f s", error, COMMIT_INTERVAL_S)  # fmt: skip
            if any(v.dead_letters for v in self.vhosts.values()):  # at-least-once retries
                self.hand_over.waiting.set()
            await chores.retry_metadata_write(self.meta)
            await chores.clean_owners(
                self.meta, self.vhosts, self.owners_to_clean, self.connections_to_uncount
            )

    async def sample_stats(self, now: float) -> None:
        self.stats.sample(now)
        if self.stats.queues_due(now):
            await self.stats.sample_queues(self.all_queues(), now)

    async def apply_queue_retention(self, now_ms: int) -> None:
        """x-max-age, and disk-overflow drop-oldest while the disk alarm is on
        (gateway/node/housekeeping.py)."""
        await chores.apply_queue_retention(self.vhosts, self.store, self.disk_alarm, now_ms)

    async def look_at_resources(self, end_offset: int) -> None:
        """A publish batch ended at ``end_offset``, past ``next_resource_look``: look at the
        alarms now rather than at the next second, so that a disk budget holds within about
        a quarter segment however fast publishers write."""
        self.next_resource_look = self.resources.next_look(end_offset)
        await self.check_resources()

    async def check_resources(self) -> None:
        """Update the alarms; tell every connection when publishers become (un)blocked."""
        was_blocked = self.alarms.blocked
        await self.resources.read()
        if self.alarms.blocked != was_blocked:
            for session in self.sessions:
                session.notify_blocked(self.alarms.blocked, self.block_reason())

    def block_reason(self) -> str:
        return self.resources.block_reason()

    def memory_breakdown(self) -> dict[str, int]:
        """Where the gateway's memory goes (bytes; message bodies counted by their size)."""
        return memory_breakdown(self.sessions, self.vhosts.values(), self.memory_alarm.on_above)

    async def shutdown(self, grace_s: float = 3.0) -> None:
        """Close every connection with 320 CONNECTION_FORCED and wait for them to finish."""
        error = ConnectionForced("broker forced connection closure with reason 'shutdown'")
        for session in list(self.sessions):
            session.conn.close(error)
            session.mark_dirty()
        with anyio.move_on_after(grace_s):
            while self.sessions:
                await anyio.sleep(0.02)
        await self.commit_offsets()
        if self.cluster is None:
            delivery_marks.save(self.settings.data_dir, self.all_queues())
        await chores.retry_metadata_write(self.meta)
