"""What a publish asks of a queue runtime, per message and before the append: which
partition it goes to (any, a lane's, a scaled queue's open ones, or by key for a keyed-order
queue), counting it in (and out again if the append fails), whether it would pass a length
limit under reject-publish (the refused one dead-lettered under reject-publish-dlx), and
publish flow control: a queue far behind while its consumers could take messages holds its
publishers until the push scheduler finds it caught up (RabbitMQ's credit flow, per queue).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import anyio

from gateway.amqp import Publish
from gateway.queues.queue_state import QueueState
from meta.channel_route import successor
from storage.record import EXPIRES

# Publish flow control (RabbitMQ's credit flow, per queue): a publisher into a queue whose
# consumers could take messages but are this far behind is not read until they catch up.
FLOW_HIGH = 2_000
FLOW_LOW = 500


class PublishIntake(QueueState):
    """Partition choice, counting in, reject-publish and flow control for publishes."""

    def pick_partition(self, gray: bool = False) -> int:
        """Where a message without a sticky channel goes: any partition (delivery merges
        them by commit offset), or, where the queue has gray ones, one of its lane's."""
        if self.write_parts:  # scaled: the open ones
            return random.choice(self.write_parts)
        if self.partitions == 1:
            return 0
        if self.gray_parts:
            return random.choice(self.gray_parts if gray else self.normal_parts)
        return random.randrange(self.partitions)

    def successor(self, partition: int) -> int:
        """A scaled queue: where a channel whose ``partition`` closed writes from now on."""
        if self.route is None or partition in self.write_parts:
            return partition
        return successor(self.route, partition)

    def key_partition(self, routing_key: str, headers: Mapping[str, Any] | None) -> int:
        """A keyed-order queue's partition for a message (gateway/queues/ordered.py)."""
        raise NotImplementedError("only a keyed-order queue partitions by key")

    def count_in(self, body_size: int, record_flags: int = 0) -> None:
        """A message was routed here (counted before its append; count_out if that fails)."""
        self.ready_count += 1
        self.ready_bytes += body_size
        self.enqueued += 1
        if record_flags & EXPIRES:
            self.expirations_seen = True

    def dead_letter_publish(self, publish: Publish, properties: bytes, record_flags: int) -> None:
        """reject-publish-dlx: the refused message goes to the dead-letter exchange."""
        self.dead_letters.refused_publish(publish, properties, record_flags)

    def count_out(self, body_size: int) -> None:
        self.ready_count -= 1
        self.ready_bytes -= body_size
        self.enqueued -= 1

    def congested(self) -> bool:
        """Far behind while a consumer could take messages: its publishers should wait."""
        return self.ready_count > FLOW_HIGH and self.choice.any_can_take()

    def caught_up_signal(self) -> anyio.Event:
        if self.caught_up_event is None:
            self.caught_up_event = anyio.Event()
        return self.caught_up_event

    def release_publishers(self) -> None:
        """Called by the push scheduler after a turn: wake publishers once below FLOW_LOW,
        or when nobody can take messages now (waiting would not help)."""
        event = self.caught_up_event
        if event is not None:
            self.caught_up_event = None
            event.set()

    def would_overflow(self, body_size: int) -> bool:
        """reject-publish: would one more message of this size pass a limit?"""
        if self.leases is not None:
            # Cluster: the broker counts both limits at the append (this gateway's counts
            # see neither the others' publishes nor their consumers' acks).
            return False
        b = self.behaviour
        if b.max_length is not None and self.ready_count + 1 > b.max_length:
            return True
        return b.max_length_bytes is not None and self.ready_bytes + body_size > b.max_length_bytes

    def over_limit(self) -> bool:
        b = self.behaviour
        if b.max_length is not None and self.ready_count > b.max_length:
            return True
        return b.max_length_bytes is not None and self.ready_bytes > b.max_length_bytes
