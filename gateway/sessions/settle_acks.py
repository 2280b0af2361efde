"""What acks do to the deliveries they name (``Session.settle`` with no requeue): each one's
queue settles it, its consumer's unacked count drops, and the queues they came from that
have more to deliver (``may_deliver``) are given a turn.

This pure module is the reference: it asks each queue (``settle``, ``may_deliver``). Its
compiled twin (speedups/mqgw_speedups/settle_acks.pyx, picked by storage/twins.py) answers
them itself for a plain QueueRuntime, from its slots, as Settlement.settle and
HeldMessages.may_deliver would (as the compiled write-through answers caught_up and absorb),
and asks any other queue. tests/gateway/sessions/test_settle_acks_twins.py holds the two
equal on real queues and consumers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from storage import twins

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime
    from gateway.sessions.channel_state import Delivery


def settle(deliveries: list[Delivery]) -> set[QueueRuntime]:
    """Each delivery acked, in order; the queues they came from."""
    woken: set[QueueRuntime] = set()
    for delivery in deliveries:
        queue = delivery.queue
        queue.settle(delivery.partition, delivery.message)
        if delivery.consumer is not None:
            delivery.consumer.unacked -= 1
        woken.add(queue)
    return woken


def worth_a_turn(queues: Iterable[QueueRuntime]) -> list[QueueRuntime]:
    """Those of ``queues`` with messages to deliver (an idle queue is woken by its next
    publish instead)."""
    return [queue for queue in queues if queue.may_deliver]


picked_settle = twins.pick(settle)
picked_worth_a_turn = twins.pick(worth_a_turn)
