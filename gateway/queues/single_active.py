"""Single active consumer (``x-single-active-consumer: true``), as RabbitMQ 3.10's classic
queues do it (rabbit_amqqueue_process, rabbit_queue_consumers).

- Every consumer subscribes as usual and counts (queue.declare-ok, if-unused, auto-delete),
  but only one, the active one, gets deliveries; the others wait. Deliveries wait for it too
  while it has no credit (prefetch full, flow off): they never go to a waiting consumer.
- The first consumer becomes active. A later one with a higher ``x-priority`` does not take
  over (3.10 classic queues never pre-empt the active consumer).
- When the active consumer goes (basic.cancel, channel or connection closed, consumer
  timeout), the waiting consumer with the highest ``x-priority`` takes over, the earliest
  subscribed among equals. What the old one held unacked comes back when its channel closes
  and goes out first, redelivered, because a requeued message keeps its place in the queue.
  After a basic.cancel its unacked deliveries stay with its channel, as in RabbitMQ.
- basic.consume with exclusive=true is refused with 403 "in exclusive use", consumers or not
  (rabbit_amqqueue_process answers exclusive_consume_unavailable).
- Visible in the admin API as RabbitMQ's management shows it: the queue's
  ``single_active_consumer_tag``, each consumer's ``active`` and ``activity_status``
  (``single_active`` or ``waiting``).

In a cluster each gateway chooses among its own consumers and only the gateway holding the
queue's delivery lease delivers, so one consumer in the cluster gets messages; which one is
not the cluster-wide subscription order.

A consumer choice (gateway/queues/consumer_choice.py) that any queue layout takes: a priority
queue with a single active consumer is ``PriorityQueueRuntime`` given this choice. No
per-message cost: the choice is made when consumers come and go; delivery asks only whether
the active consumer has credit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.queues.consumer_choice import ConsumerChoice

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer as Consumer

SINGLE_ACTIVE_ARG = "x-single-active-consumer"


class SingleActiveChoice(ConsumerChoice):
    """Deliver to one consumer at a time (see the module doc)."""

    def __init__(self, consumers: list[Consumer] | None = None) -> None:
        super().__init__(consumers)
        self._active: Consumer | None = None

    @property
    def active(self) -> Consumer | None:
        return self._active

    def activity_status(self, consumer: Consumer) -> str:
        return "single_active" if consumer is self._active else "waiting"

    def add(self, consumer: Consumer) -> None:
        super().add(consumer)
        if self._active is None:
            self._active = consumer

    def remove(self, consumer: Consumer) -> bool:
        super().remove(consumer)
        if consumer is not self._active:
            return False
        # rabbit_queue_consumers:get_consumer/1: the head of the consumers' priority queue;
        # max() keeps the first of equals, and self.consumers is in subscription order.
        self._active = max(self.consumers, key=_priority, default=None)
        return self._active is not None  # its messages are waiting: wake the queue

    def next_consumer(self) -> Consumer | None:
        active = self._active
        return active if active is not None and active.has_credit() else None

    def any_can_take(self) -> bool:
        active = self._active
        return active is not None and active.has_credit()

    def rate_wake_at(self) -> float | None:
        """Only the active consumer's rate limit can make the queue deliver again."""
        active = self._active
        limits = None if active is None else active.sink.limits
        if limits is None or active is None or not active.has_credit_but_rate():
            return None
        return limits.next_at()  # "now" if a token came since has_credit looked


def _priority(consumer: Consumer) -> int:
    return consumer.priority
