"""The fields of a queue's live state on this gateway, which every part of the queue runtime
reads and moves: where each partition is read (cursors, and the marks below which a message
may have gone out before), what is held (the buffer, the requeue heap), what is in flight,
the exact counts, the cluster leases and the scaled route, and the consumption controls.
``QueueState`` only sets them up; the behaviour lives in the mixins gateway/queues/runtime.py
composes into ``QueueRuntime`` (held_messages.py, store_reads.py, settlement.py, leases.py,
scaled_route.py, intake.py), each of which sees the others only through this state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, Self

import anyio

from gateway.amqp import Publish
from gateway.queues.behaviour import QueueBehaviour
from gateway.queues.breaker import DepthBreaker
from gateway.queues.clock import Clock
from gateway.queues.consumer_choice import ConsumerChoice
from gateway.queues.rate_limit import TokenBucket
from meta.cluster import HandedNote
from meta.models import QueueDef
from meta.queue_route import QueueRoute
from storage import StoredMessage, StorePort

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer as Consumer


class Departures(Protocol):
    """Where a message leaving the queue for good without an ack goes (dead_lettering.py)."""

    def gone(
        self, partition: int, message: StoredMessage, reason: str, to_dlq: bool = False
    ) -> None: ...

    def refused_publish(self, publish: Publish, properties: bytes, record_flags: int) -> None: ...


class QueueState:
    """A queue's per-partition positions, held messages, counts and controls."""

    # Every field in a slot: the hot paths read a queue for each message, the compiled ones
    # through the C API, where a slot is a fixed offset and an instance dict a lookup; and
    # with a thousand queues served in turn, 70 slots are a few cache lines where a dict of
    # 70 keys is many more (many-queues-1k: 0.94 -> 0.90 s of CPU per 100k). ``__dict__``
    # stays for the subclasses' own fields (ordered.py, priority.py, ...) and for tests;
    # tests/gateway/queues/test_queue_state_slots.py keeps the runtime's own out of it.
    __slots__ = (
        "__dict__", "acked", "appending", "appends_done", "behaviour", "behind_removed", "breaker",
        "broadcast", "buffer", "byte_limit", "caught_up_event", "choice", "clock", "commit_dirty",
        "consumers", "control_running", "cursors", "dead_lettered", "dead_letters", "definition",
        "deleted", "delivered", "delivered_below", "delivery_slot", "dropped",
        "dropped_by_retention", "enqueued", "exhausted", "expirations_seen", "fed", "fences",
        "getting", "gray_parts", "handed", "held_for_retry", "inflight", "last_get", "last_used",
        "leases", "leaving", "limits", "maybe_delivered", "name", "next_consumer", "normal_parts",
        "on_exhausted", "parked", "parked_until", "partitions", "paused", "plain", "queue_id",
        "rate_limit", "rate_wake_at", "read_parts", "ready_bytes", "ready_count",
        "rejected_publishes", "rejects_publish", "requeued", "restart_below", "retried", "returns",
        "rewake", "route", "scheduled", "started", "store", "waiting_for_broker", "wake",
        "write_parts",
    )  # fmt: skip

    # Set by the runtime once it is built: may deliver_now (read per publish: a plain field),
    # and its departures (DeadLettering: outbox the vhost's; None: dropped).
    plain: bool
    dead_letters: Departures

    def __init__(
        self,
        definition: QueueDef,
        store: StorePort,
        behaviour: QueueBehaviour,
        choice: ConsumerChoice,
        wake: Callable[[Self], None] | None,
        clock: Clock,
    ) -> None:
        self.definition = definition
        self.clock = clock  # the scheduler's: x-expires idle time and TTL deadlines
        self.name = definition.name
        self.queue_id = definition.queue_id
        self.partitions = definition.partitions
        # Broadcast consumption (gateway/features/broadcast.py): its consumers read through
        # their own positions. A declare's arguments never change: decided once.
        self.broadcast = definition.arguments.get("x-consume-mode") == "broadcast"
        # The gray partitions (gateway/queues/gray_lanes.py) and the rest; no gray ones: ().
        self.gray_parts: tuple[int, ...] = ()
        self.normal_parts: tuple[int, ...] = tuple(range(self.partitions))
        self.store = store
        self.behaviour = behaviour
        # Who gets the next message (single active consumer is a choice too); the list is
        # the choice's, and next_consumer is bound once: a delivery costs one call there.
        self.choice = choice
        self.consumers = self.choice.consumers
        self.next_consumer: Callable[[], Consumer | None] = self.choice.next_consumer
        # The depth breaker (gateway/queues/breaker.py), if its policy has one.
        self.breaker: DepthBreaker | None = None
        self.rejects_publish = False  # read per publish: a plain field (_set_rejects)
        # The push scheduler's wake (None in unit tests): for what the queue itself decides
        # may let it deliver, such as another consumer becoming the single active one.
        self.wake: Callable[[Self], None] | None = wake
        self._init_positions()
        self._init_cluster()
        self._init_flow()
        self._init_counts()

    def _init_positions(self) -> None:
        self.cursors = [0] * self.partitions  # next offset to fetch, per partition
        # Below these offsets a message may have gone out before a crash or a stop: flagged
        # redelivered (gateway/queues/delivery_marks.py carries them across a clean stop).
        self.maybe_delivered = [0] * self.partitions
        self.delivered_below = [0] * self.partitions  # past the highest offset delivered
        # Below these offsets a message was stored before the store last opened: a transient
        # one there is gone, as RabbitMQ loses non-persistent messages when it restarts.
        self.restart_below = [0] * self.partitions
        self.buffer: deque[tuple[int, StoredMessage]] = deque()
        self.requeued: list[tuple[int, int, StoredMessage]] = []  # (commit offset, partition, m)
        # Cluster: taken from the head while their partition's lease was being given up (a
        # queue spread over gateways serves on with its other partitions): not delivered,
        # still held back from the commit, dropped by the hand-over (or back, if kept).
        self.parked: list[tuple[int, StoredMessage]] = []
        # Cluster, spread: partitions still held while this gateway's consumers settle what
        # they hold of them (the split changed): nothing more of them is read or delivered
        # here (gateway/cluster/delivery_leases.py, ``settling``).
        self.leaving: set[int] = set()
        self.inflight: list[set[int]] = [set() for _ in range(self.partitions)]
        self.returns: dict[tuple[int, int], int] = {}  # (partition, offset) -> times requeued
        self.exhausted = False  # last fetch found nothing new
        self.fed = False  # just took the batch in hand up to the store's end (absorb)

    def _init_cluster(self) -> None:
        # Cluster mode: per partition, whether this gateway holds its delivery lease (None:
        # embedded, always delivers). See gateway/cluster/link.py.
        self.leases: list[bool] | None = None
        self.fences = [0] * self.partitions  # the lease's fencing token, sent with commits
        # The note the lease came with (its last holder's, from Redis): it says how far that
        # holder delivered, if the fence a copy says ours replaced is that holder's.
        self.handed: list[HandedNote | None] = [None] * self.partitions
        # Cluster: called when a fill reached the end of every partition (long-poll reads).
        self.on_exhausted: Callable[[Self], None] | None = None
        self.last_get = -1e9  # event-loop time of the last basic.get (cluster: lease kept)
        self.getting = 0  # basic.gets under way (cluster: the leases are not handed over)
        # Cluster, a plain queue of several partitions (``spreads_delivery``): this gateway's
        # place among the gateways with consumers on it, (index, count); each delivers every
        # count-th partition. None: not known yet, or the queue is delivered by one gateway.
        self.delivery_slot: tuple[int, int] | None = None
        # Attached while its broker group was down (cluster): not started, not delivered,
        # until VirtualHost.start_waiting finds the group back.
        self.waiting_for_broker = False
        # A plain queue that was scaled runs on its route (meta/channel_route.py): publishers
        # write to ``write_parts`` only (empty: every partition, the queue never scaled).
        self.route: QueueRoute | None = None
        self.write_parts: tuple[int, ...] = ()
        self.read_parts: Sequence[int] = range(self.partitions)  # all but removed ones
        self.started = False  # no route-driven moves of the cursors before start sets them
        # Cluster: removed partitions whose committed offset in the store lies below their
        # command record (a broker failover lost the last commits): held a moment to commit
        # past it, or they would hold the log back for good (RouteKeeper.check_removed).
        self.behind_removed: set[int] = set()

    def _init_flow(self) -> None:
        # Publishes on their way into the store (a session's batch between routing and
        # VirtualHost.stored), and appends that reached it so far: a read that began before
        # an append ended may have missed it, so it is not the end (_read_partitions), and
        # nothing bypasses the store (deliver_now) while one is out: order is kept.
        self.appending = 0
        self.appends_done = 0
        self.scheduled = False  # in the push scheduler's ready set or being served
        self.rewake = False
        self.deleted = False
        self.commit_dirty = False
        # Consumption controls (gateway/controls.py): the queue's own stop/run and limits.
        self.paused = False
        self.control_running = False  # its control says run: wider stops do not apply here
        self.rate_limit: TokenBucket | None = None
        self.byte_limit: TokenBucket | None = None
        self.rate_wake_at = 0.0  # when a rate-limited pump may deliver again
        self.parked_until = 0.0  # scheduler clock time of this queue's pending timer, if any
        self.caught_up_event: anyio.Event | None = None  # publishers waiting (flow control)
        self.last_used = self.clock.monotonic()  # for x-expires (touch() renews it)

    def _init_counts(self) -> None:
        # Exact counts: published = ready + unacked + acked + dead_lettered + dropped.
        self.ready_count = 0
        self.ready_bytes = 0
        self.enqueued = 0
        self.acked = 0
        self.dead_lettered = 0
        self.dropped = 0  # expired or overflowed with no dead-letter exchange
        self.dropped_by_retention = 0  # unread messages the store's retention removed
        self.rejected_publishes = 0  # refused by x-overflow reject-publish(-dlx)
        self.held_for_retry = 0  # nacked in backoff mode, timer record not yet stored
        self.retried = 0  # left for the redelivery timer (they re-enter as new messages)
        self.expirations_seen = False  # some message here has its own expiration
        self.delivered = 0  # total deliveries (consumers and basic.get), for stats and tests
