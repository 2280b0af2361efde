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

No per-message cost: the choice is made when consumers come and go; delivery asks only
whether the active consumer has credit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.queues.runtime import FLOW_HIGH, PumpResult, QueueRuntime

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer as Consumer

SINGLE_ACTIVE_ARG = "x-single-active-consumer"


class SingleActiveConsumer(QueueRuntime):
    """A queue runtime that delivers to one consumer at a time (see the module doc)."""

    _active: Consumer | None = None

    @property
    def active_consumer(self) -> Consumer | None:
        return self._active

    def activity_status(self, consumer: Consumer) -> str:
        return "single_active" if consumer is self._active else "waiting"

    def add_consumer(self, consumer: Consumer) -> None:
        super().add_consumer(consumer)
        if self._active is None:
            self._active = consumer

    def remove_consumer(self, consumer: Consumer) -> None:
        super().remove_consumer(consumer)
        if consumer is not self._active:
            return
        # rabbit_queue_consumers:get_consumer/1: the head of the consumers' priority queue;
        # max() keeps the first of equals, and self.consumers is in subscription order.
        self._active = max(self.consumers, key=_priority, default=None)
        if self._active is not None and self.wake is not None:
            self.wake(self)  # nothing else may wake the queue: its messages are waiting

    def next_consumer(self) -> Consumer | None:
        active = self._active
        return active if active is not None and active.has_credit() else None

    def congested(self) -> bool:
        active = self._active
        return self.ready_count > FLOW_HIGH and active is not None and active.has_credit()

    def _no_consumer_ready(self) -> PumpResult:
        """Only the active consumer's rate limit can make the queue deliver again."""
        active = self._active
        limits = None if active is None else active.sink.limits
        if limits is None or limits.ready():
            return PumpResult.NO_CREDIT
        self.rate_wake_at = limits.next_at()
        return PumpResult.RATE_LIMITED


def _priority(consumer: Consumer) -> int:
    return consumer.priority
