"""A queue's turn as the push scheduler gives it (``QueueRuntime.pump``), with a compiled twin
for the common case of a plain queue with one consumer.

The pure twin is the general path itself. The compiled one
(speedups/mqgw_speedups/plain_turn.pyx, picked by storage/twins.py) takes a plain queue
(``QueueRuntime.plain``: one partition, FIFO, no limits, TTL or delivery counts) on the
embedded node (no leases), neither paused nor rate limited, with one consumer: it asks the
consumer for credit and room in one call (``grant``) and the sink for byte room, takes
each message from the head inline (a message with an expiration, a requeued one and a
transient one from before a restart go through ``take``), and hands each run to the sink.
Anything else goes to ``queue.pump``. tests/gateway/queues/test_plain_turn_twins.py holds the
two equal on real sessions.
"""

from __future__ import annotations

from gateway.queues.runtime import PumpResult, QueueRuntime


def pump(queue: QueueRuntime, quota: int, now: float) -> PumpResult:
    """Deliver up to ``quota`` messages to consumers with credit (``queue.pump``)."""
    return queue.pump(quota, now)
