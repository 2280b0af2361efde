"""Per-channel broker state: consumers, unacked deliveries, prefetch, confirm and tx modes.

Plain state with small invariants; the session (per connection) drives it. Delivery tags are
per channel and increase by one per delivery, as the spec requires.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.sessions import consumer_credit
from storage import Record, StoredMessage

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime
    from gateway.sessions.session import Session


@dataclass(eq=False, slots=True)
class Consumer:
    tag: str
    channel: ChannelState
    queue: QueueRuntime
    no_ack: bool
    exclusive: bool
    priority: int
    prefetch: int  # per-consumer limit (0: none), fixed when the consumer was created
    unacked: int = 0
    arguments: Mapping[str, Any] = field(default_factory=dict)  # basic.consume's, as given
    # The session, as the queue layer's DeliverySink (gateway/queues/consumer.py): a field,
    # not a property, since the push path reads it once per message.
    sink: Session = field(init=False)

    def __post_init__(self) -> None:
        self.sink = self.channel.session

    @property
    def lane(self) -> int:
        """Which partitions of a queue with gray ones it reads: its connection's gray state."""
        return self.sink.gray_lane

    def has_credit(self) -> bool:
        # Rate limits last: a bucket found empty here marks real demand (cluster shares
        # follow it).
        if not self.has_credit_but_rate():
            return False
        limits = self.channel.session.limits
        return limits is None or limits.ready()

    def has_credit_but_rate(self) -> bool:
        channel = self.channel
        session = channel.session
        if not channel.flow_active or not session.writable or channel.closing:
            return False
        # An operator's stop of the connection (unless the queue's own control says run).
        if session.stopped and not self.queue.control_running:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return not (channel.prefetch_global and len(channel.unacked) >= channel.prefetch_global)

    # has_credit(), then room(most), in one call: 0 when it has no credit
    # (gateway/sessions/consumer_credit.py, compiled where built).
    grant = consumer_credit.picked

    def room(self, most: int) -> int:
        # Within a run only its own deliveries change what has_credit reads: its unacked
        # counts, and the connection's backlog (the queue stops at sink.byte_room()).
        if self.channel.session.limits is not None:
            return 1  # a rate token per delivery: asked for each one
        if self.no_ack:
            return most
        room = most
        if self.prefetch:
            room = min(room, self.prefetch - self.unacked)
        channel = self.channel
        if channel.prefetch_global:
            room = min(room, channel.prefetch_global - len(channel.unacked))
        return room


@dataclass(eq=False, slots=True)
class Delivery:
    """A message handed to a client and not yet settled (ack, nack, reject, close)."""

    queue: QueueRuntime
    partition: int
    message: StoredMessage
    consumer: Consumer | None  # None for basic.get
    at: float = 0.0  # the node clock's monotonic() at delivery (consumer timeout)


@dataclass(slots=True)
class TxAction:
    """What tx.commit must apply: acks/nacks/rejects in their arrival order."""

    kind: str  # "ack" | "nack" | "reject"
    delivery_tag: int
    multiple: bool
    requeue: bool


@dataclass(slots=True)
class PendingPublish:
    """A routed publish waiting for its batch append (tx or confirm bookkeeping)."""

    record: Record | None  # None: routed nowhere (nothing to store)
    confirm_tag: int  # 0 when the channel is not in confirm mode


@dataclass(eq=False)
class ChannelState:
    number: int
    session: Session
    consumers: dict[str, Consumer] = field(default_factory=dict)
    unacked: dict[int, Delivery] = field(default_factory=dict)  # insertion order = tag order
    next_delivery_tag: int = 1
    prefetch_count: int = 0  # applies to consumers created after basic.qos(global=false)
    prefetch_global: int = 0  # channel-wide limit from basic.qos(global=true)
    flow_active: bool = True
    confirm_mode: bool = False
    next_publish_tag: int = 1
    tx_mode: bool = False
    tx_publishes: list[Record] = field(default_factory=list)
    tx_actions: list[TxAction] = field(default_factory=list)
    queue_partition: dict[int, int] = field(default_factory=dict)  # sticky publish partition
    last_queue: str = ""  # '' in a queue method means this one (RabbitMQ's shortcut)
    reply_key: str = ""  # set while the channel consumes from amq.rabbitmq.reply-to
    reply_consumer_tag: str = ""
    closing: bool = False

    def take_tag(self) -> int:
        tag = self.next_delivery_tag
        self.next_delivery_tag += 1
        return tag

    def record_delivery(
        self,
        consumer: Consumer,
        queue: QueueRuntime,
        partition: int,
        message: StoredMessage,
        now: Callable[[], float],
    ) -> int:
        """Book a delivery to ``consumer``: its tag, and its unacked entry unless no-ack
        (stamped with ``now()``, the node's monotonic clock, for the consumer timeout)."""
        tag = self.next_delivery_tag  # take_tag(), once per delivery: without the call
        self.next_delivery_tag = tag + 1
        if consumer.no_ack:
            queue.settle(partition, message)
        else:
            self.unacked[tag] = Delivery(queue, partition, message, consumer, now())
            consumer.unacked += 1
        return tag

    def pop_deliveries(self, tag: int, multiple: bool) -> list[Delivery]:
        """Remove and return the deliveries an ack/nack names; [] if ``tag`` is unknown.

        ``multiple`` with tag 0 means every outstanding delivery, as in RabbitMQ.
        """
        unacked = self.unacked
        if multiple and tag == 0:
            everything = list(unacked.values())
            unacked.clear()
            return everything
        if multiple:  # tags rise in insertion order: stop at the first one past ``tag``
            tags = []
            for t in unacked:
                if t > tag:
                    break
                tags.append(t)
            return [unacked.pop(t) for t in tags]
        delivery = unacked.pop(tag, None)
        return [] if delivery is None else [delivery]

    def queues_with_consumers(self) -> Iterator[QueueRuntime]:
        seen: set[int] = set()
        for consumer in self.consumers.values():
            if id(consumer.queue) not in seen:
                seen.add(id(consumer.queue))
                yield consumer.queue
