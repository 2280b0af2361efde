"""Which consumer gets a queue's next message: a strategy the queue runtime is given when it
is built (gateway/features/queue_kinds.py chooses it from the queue's arguments).

``ConsumerChoice`` is RabbitMQ's classic choice (rabbit_queue_consumers): round-robin among
the consumers of the highest ``x-priority`` that have credit. Other choices refine it: one
active consumer at a time (gateway/queues/single_active.py), a broadcast position's own
consumer (gateway/features/broadcast.py). The choice owns the queue's consumer list; the
runtime holds the same list as ``consumers`` and binds ``next_consumer`` once, so a delivery
costs one call here, as it did when the choice was a method of the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer as Consumer


class ConsumerChoice:
    """Round-robin among the highest-priority consumers that have credit."""

    def __init__(self, consumers: list[Consumer] | None = None) -> None:
        # Subscription order, which the choices rely on; shared with the queue runtime.
        self.consumers: list[Consumer] = [] if consumers is None else consumers
        self._rr = 0

    @property
    def active(self) -> Consumer | None:
        """The single active consumer, for the choices that have one."""
        return None

    def activity_status(self, consumer: Consumer) -> str:
        """RabbitMQ's consumer ``activity_status``: every consumer here is up."""
        return "up"

    def add(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)

    def remove(self, consumer: Consumer) -> bool:
        """Forget ``consumer``; True if that lets a waiting consumer take the queue's
        messages (nothing else would wake the queue for them)."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        return False

    def next_consumer(self) -> Consumer | None:
        consumers = self.consumers
        n = len(consumers)
        if n == 1:  # the common case, without the loop (same outcome)
            consumer = consumers[0]
            if consumer.has_credit():
                self._rr = 1
                return consumer
            return None
        best: Consumer | None = None
        best_index = 0
        for k in range(n):
            index = (self._rr + k) % n
            consumer = consumers[index]
            if (best is None or consumer.priority > best.priority) and consumer.has_credit():
                best, best_index = consumer, index
        if best is not None:
            self._rr = best_index + 1
        return best

    def any_can_take(self) -> bool:
        """Some consumer that this choice would deliver to has credit now (flow control)."""
        return any(c.has_credit() for c in self.consumers)

    def rate_wake_at(self) -> float | None:
        """When none can take a message: the earliest time one held only by its connection's
        rate limit gets a token; None if they are all out of credit."""
        wake_at: float | None = None
        for consumer in self.consumers:
            limits = consumer.sink.limits
            # A token that came since has_credit looked makes next_at "now": the queue is
            # served again at once instead of waiting for a credit that never comes.
            if limits is not None and consumer.has_credit_but_rate():
                at = limits.next_at()
                wake_at = at if wake_at is None else min(wake_at, at)
        return wake_at
