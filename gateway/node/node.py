"""The gateway node: one store, one metadata store, its vhosts, the push scheduler and the
connections. `mqgw serve` runs exactly one of these (embedded mode)."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from itertools import count
from typing import TYPE_CHECKING, cast

import anyio
from pamqp import commands

from gateway.amqp.errors import ConnectionForced, PreconditionFailed
from gateway.config.settings import GatewaySettings
from gateway.controls import Controls
from gateway.features.broadcast import Broadcasts
from gateway.features.delayed_exchange import DELAYED_KIND, DelayedDelivery
from gateway.features.direct_reply import DirectReplies
from gateway.features.gray import GrayRegistry
from gateway.features.log_timer import DEFAULT_LEVELS_MS, TIMER_QUEUE_ID, LogTimer
from gateway.features.redelivery import DEFAULT_LADDER_MS, REDELIVERY_KIND, Redelivery
from gateway.node import metadata_sync
from gateway.node.users import Users
from gateway.observe.stats import NodeStats
from gateway.observe.tracing import tracing_from_settings
from gateway.queues import delivery_marks
from gateway.queues.breaker import BreakerWatch
from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.resources import memory
from gateway.resources.alarms import Alarms, ResourceAlarm
from gateway.sessions import taps
from gateway.sessions.access import Access
from gateway.sessions.channel_state import ChannelState, Consumer
from gateway.sessions.publishing import deliver_reply, return_reply
from gateway.sessions.session import Session
from gateway.vhost import VirtualHost
from gateway.vhost.autoscale import Autoscaler
from gateway.vhost.group_moves import GroupMover
from gateway.vhost.rescale import RouteKeeper
from meta.change_feed import Change
from meta.errors import MetadataUnavailable
from meta.models import Deletions, Policy, User, VHost, VHostLimits
from meta.store import MetadataStore
from storage import StoredMessage, StoreError, StorePort

if TYPE_CHECKING:
    from gateway.cluster.backlog import RemoteBacklog
    from gateway.cluster.link import ClusterLink

log = logging.getLogger("mqgw.node")

COMMIT_INTERVAL_S = 1.0
COMMIT_YIELD_EVERY = 256
STORE_AWAY_LOG_EVERY_S = 10.0  # while store calls fail (a broker away): a line this often
# Housekeeping looks at the alarms once a second; a publisher may write more than that in
# between, so a publish batch also looks after a quarter segment (at most this) more.
RESOURCE_LOOK_EVERY_BYTES_MAX = 16 << 20


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
        # Disk: "on above" a shortfall reading (limit - free), so both alarms read upwards.
        self.disk_alarm = ResourceAlarm("disk", 0)
        backlog = settings.store_backlog_limit_bytes
        self.store_alarm = ResourceAlarm("store backlog", backlog, backlog // 4)
        limit = memory.high_watermark_bytes(
            settings.memory_high_watermark, memory.machine_bytes(), memory.cgroup_limit_bytes()
        )
        self.memory_alarm = ResourceAlarm("memory", limit, int(limit * 0.9))
        self.alarms = Alarms(self.disk_alarm, self.store_alarm, self.memory_alarm)
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
        self._dead_letters_waiting = anyio.Event()
        self.scheduler.on_unused = self._delete_unused
        self.cluster: ClusterLink | None = None  # set by the server in cluster mode
        self.remote_backlog: RemoteBacklog | None = None  # likewise
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
        """max_connections_per_address: refuse a socket from an address already at the cap
        (before the handshake, so it costs nothing; RabbitMQ has no such cap built in)."""
        cap = self.settings.max_connections_per_address
        if not cap:
            return True
        host = session.peer.rsplit(":", 1)[0]
        count = sum(1 for s in self.sessions if s.peer.rsplit(":", 1)[0] == host)
        if count < cap:
            return True
        log.warning(
            "refusing connection from %s: %d connections from this address (the cap)", host, cap
        )
        return False

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
        vhost.on_dead_letter = self._dead_letters_waiting.set
        vhost.gray_ended = self.gray.ended_in(name)
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
        await self._close_vhost_sessions(name, vhost)
        self.access.forget_vhost(name)
        await vhost.forget(Deletions(queues=tuple(q.definition for q in vhost.queues.values())))
        log.info("vhost %r deleted (elsewhere in the cluster)", name)

    async def _close_vhost_sessions(self, name: str, vhost: VirtualHost | None) -> None:
        error = ConnectionForced(f"vhost '{name}' is deleted")
        for session in list(self.sessions):
            if session.vhost is vhost:
                session.conn.close(error)
                session.mark_dirty()
                await session.release()

    async def delete_vhost(self, name: str) -> None:
        """Delete a vhost and everything in it; its connections are closed with 320."""
        vhost = self.vhosts.pop(name, None)
        await self._close_vhost_sessions(name, vhost)
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
        # The queue layer holds them as QueueConsumers; the node made them, as Consumers.
        for consumer in cast(list[Consumer], list(queue.consumers)):
            session = consumer.channel.session
            session.cancel_consumer(consumer)
            if session.conn.consumer_cancel_notify:
                cancel = commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True)
                session.conn.send_method(consumer.channel.number, cancel)
                session.mark_dirty()

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
        self.redelivery.back_off(vhost, queue, partition, message)
        self._dead_letters_waiting.set()

    async def dead_letter_loop(self) -> None:
        """One task stores what queues hand over: dead letters, backoff retries and the
        firehose's trace copies."""
        while True:
            await self._dead_letters_waiting.wait()
            self._dead_letters_waiting = anyio.Event()
            try:
                await self.redelivery.flush()
                for vhost in list(self.vhosts.values()):
                    vhost.on_dead_letter = self._dead_letters_waiting.set
                    if vhost.dead_letters:
                        await vhost.flush_dead_letters()
                    if vhost.firehose is not None and vhost.firehose.pending:
                        await vhost.firehose.flush()
            except Exception:
                # A bug here must not take the node down; what was being handed over is lost.
                log.exception("dead-letter / backoff hand-over failed")

    async def consumer_timeout_loop(self) -> None:
        """Close channels holding a delivery unacked past its queue's consumer timeout."""
        shortest = float(self.settings.consumer_timeout_ms)
        while True:
            try:
                shortest = await self.check_consumer_timeouts(time.monotonic())
            except Exception:
                log.exception("consumer timeout check failed")
            await anyio.sleep(min(1.0, max(0.01, shortest / 4000)))

    async def check_consumer_timeouts(self, now: float) -> float:
        """Fail the channels that timed out; returns the shortest timeout in use (ms)."""
        default = self.settings.consumer_timeout_ms
        shortest = float(default)
        timed_out: list[tuple[Session, ChannelState, int, int]] = []
        for session in self.sessions:
            for channel in session.channels.values():
                for tag, delivery in channel.unacked.items():
                    timeout = delivery.queue.behaviour.consumer_timeout_ms or default
                    shortest = min(shortest, timeout)
                    if now - delivery.at > timeout / 1000:
                        timed_out.append((session, channel, timeout, tag))
                        break
                    if now - delivery.at < shortest / 1000:
                        break  # later deliveries are younger still
        for session, channel, timeout, tag in timed_out:
            await self._time_out(session, channel, timeout, tag)
        return shortest

    async def _time_out(
        self, session: Session, channel: ChannelState, timeout_ms: int, tag: int
    ) -> None:
        if channel.closing or session.channels.get(channel.number) is not channel:
            return
        log.warning(
            "connection %s: channel %d: delivery %d was not acknowledged within %d ms "
            "(consumer timeout): closing the channel, its deliveries are requeued",
            session.id,
            channel.number,
            tag,
            timeout_ms,
        )
        error = PreconditionFailed(
            f"delivery acknowledgement on channel {channel.number} timed out. Timeout value "
            f"used: {timeout_ms} ms. This timeout value can be configured, see consumers doc "
            "guide to learn more"
        )
        await session.fail(channel, error)
        session.mark_dirty()

    def queue(self, vhost: str, name: str) -> QueueRuntime | None:
        host = self.vhosts.get(vhost)
        return None if host is None else host.queues.get(name)

    async def commit_offsets(self) -> None:
        """Commit every queue's position that moved. A queue whose broker is away stays due
        (the next pass commits it) and the others go on; StoreError, the last such error,
        after the pass."""
        committed = 0
        away: StoreError | None = None
        for vhost in self.vhosts.values():
            for queue in list(vhost.queues.values()):
                if queue.commit_dirty:
                    try:
                        await queue.commit()
                    except StoreError as error:
                        away = error
                    committed += 1
                    if committed % COMMIT_YIELD_EVERY == 0:
                        # 10,000 busy queues: let deliveries run between slices of the pass
                        await anyio.lowlevel.checkpoint()
        await self.broadcasts.commit()
        await self.timer.commit()
        if away is not None:
            raise away

    async def housekeeping(self) -> None:
        away_logged = float("-inf")
        steps: list[Callable[[], Awaitable[None]]] = [
            lambda: self.sample_stats(time.monotonic()),
            lambda: self.apply_queue_retention(time.time_ns() // 1_000_000),
            self.commit_offsets,
            self._start_waiting_queues,
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
                    if time.monotonic() - away_logged >= STORE_AWAY_LOG_EVERY_S:
                        away_logged = time.monotonic()
                        log.warning("housekeeping: store calls fail (%s); retrying every "
                                    "%.0f s", error, COMMIT_INTERVAL_S)  # fmt: skip
            if any(v.dead_letters for v in self.vhosts.values()):  # at-least-once retries
                self._dead_letters_waiting.set()
            await self._retry_metadata_write()
            await self._clean_owners()

    async def _start_waiting_queues(self) -> None:
        for vhost in list(self.vhosts.values()):
            await vhost.start_waiting()

    async def sample_stats(self, now: float) -> None:
        self.stats.sample(now)
        if self.stats.queues_due(now):
            await self.stats.sample_queues(self.all_queues(), now)

    async def _clean_owners(self) -> None:
        for owner in list(self.owners_to_clean):
            try:
                deletions = await self.meta.delete_exclusive_queues(owner)
            except MetadataUnavailable:
                return  # still away: next round
            self.owners_to_clean.discard(owner)
            for vhost in self.vhosts.values():
                await vhost.apply_deletions(deletions)
        for vhost_name, connection_id in list(self.connections_to_uncount):
            try:
                await self.meta.close_connection(vhost_name, connection_id)
            except MetadataUnavailable:
                return
            self.connections_to_uncount.discard((vhost_name, connection_id))

    async def _retry_metadata_write(self) -> None:
        """Write the metadata a full disk kept in memory (nothing to do when none waits)."""
        try:
            await self.meta.retry_write()
        except Exception:
            log.exception("metadata write failed; retrying in %.0f s", COMMIT_INTERVAL_S)

    async def apply_queue_retention(self, now_ms: int) -> None:
        """The explicit choices to drop unread data: x-max-age, and disk-overflow drop-oldest
        while the disk alarm is on (a queue's messages in the oldest commitlog segment go, so
        that reclaim can delete it). Every other queue keeps its messages until consumed."""
        drop_oldest: list[QueueRuntime] = []
        for vhost in self.vhosts.values():
            for queue in list(vhost.queues.values()):
                behaviour = queue.behaviour
                if behaviour.max_age_ms is not None and queue.ready_count:
                    await queue.drop_stored_before(
                        now_ms - behaviour.max_age_ms,
                        f"older than x-max-age ({behaviour.max_age_ms} ms)",
                    )
                if behaviour.disk_overflow == "drop-oldest" and queue.ready_count:
                    drop_oldest.append(queue)
        if not drop_oldest or not self.disk_alarm.blocked:
            return
        oldest = await self.store.oldest_segment_ts()
        if oldest is None:
            return
        for queue in drop_oldest:
            await queue.drop_stored_before(
                oldest + 1, "disk-overflow drop-oldest: the disk alarm is on"
            )

    async def look_at_resources(self, end_offset: int) -> None:
        """A publish batch ended at ``end_offset``, past ``next_resource_look``: look at the
        alarms now rather than at the next second, so that a disk budget holds within about
        a quarter segment however fast publishers write."""
        step = min(self.settings.segment_size_bytes // 4, RESOURCE_LOOK_EVERY_BYTES_MAX)
        self.next_resource_look = end_offset + step
        await self.check_resources()

    async def check_resources(self) -> None:
        """Update the alarms; tell every connection when publishers become (un)blocked."""
        was_blocked = self.alarms.blocked
        free = shutil.disk_usage(self.settings.data_dir).free
        shortfall = self.settings.min_free_disk_bytes - free
        budget = self.settings.disk_budget_bytes
        backlog: int | None = None
        try:
            if budget is not None:  # over the budget publishers wait; unread data is kept
                shortfall = max(shortfall, await self.store.disk_bytes() - budget)
            backlog = await self.store.backlog_bytes()
        except StoreError:
            pass  # a broker away (cluster): its alarm stays as it was; housekeeping says so
        if self.memory_alarm.blocked:
            memory.give_back()
        resident = memory.resident_bytes()
        limit = self.memory_alarm.on_above
        for alarm, reading, detail in (
            (self.disk_alarm, shortfall, f"{free} bytes free, budget {budget}"),
            (self.store_alarm, backlog, f"{backlog} bytes not yet durable"),
            (self.memory_alarm, resident, f"{resident} bytes resident, limit {limit}"),
        ):
            if reading is None:
                continue
            change = alarm.update(reading)
            if change is True:
                log.warning("%s alarm: %s: blocking publishers", alarm.name, detail)
            elif change is False:
                log.info("%s alarm cleared: %s", alarm.name, detail)
        self.alarms.changed()
        if self.alarms.blocked != was_blocked:
            for session in self.sessions:
                session.notify_blocked(self.alarms.blocked, self.block_reason())

    def block_reason(self) -> str:
        if self.disk_alarm.blocked:
            return "low on disk"
        return "low on memory" if self.memory_alarm.blocked else "store is behind"

    def memory_breakdown(self) -> dict[str, int]:
        """Where the gateway's memory goes (bytes; message bodies counted by their size)."""
        output = unacked = unacked_count = buffered = buffered_count = 0
        for session in self.sessions:
            output += session.pending_bytes + session.sending_bytes
            for channel in session.channels.values():
                unacked_count += len(channel.unacked)
                unacked += sum(len(d.message.body) for d in channel.unacked.values())
        queues = 0
        for vhost in self.vhosts.values():
            for queue in vhost.queues.values():
                queues += 1
                buffered_count += queue.held_count()
                buffered += sum(len(m.body) for _, m in queue.held())
        return {
            "resident": memory.resident_bytes(),
            "high_watermark": self.memory_alarm.on_above,
            "connection_output_buffers": output,
            "unacked_deliveries": unacked,
            "unacked_delivery_count": unacked_count,
            "queue_read_buffers": buffered,
            "queue_buffered_count": buffered_count,
            "queues": queues,
            "connections": len(self.sessions),
        }

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
        await self._retry_metadata_write()
