"""A queue runtime keeps its fields in slots (gateway/queues/queue_state.py): a field added
without its slot would land in the instance dict, and the hot paths' reads of it would be
dict lookups again."""

from __future__ import annotations

from gateway.queues.runtime import QueueRuntime
from gateway.sessions.channel_state import Consumer
from meta.models import QueueDef
from storage import StoredMessage
from tests.gateway.queues.test_delivery_runs import subscribed


def test_a_runtime_served_and_settled_keeps_every_field_in_its_slots() -> None:
    queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=7, partitions=2), None)  # type: ignore[arg-type]
    session, channel, consumer = subscribed(queue, False, 10, 0, 0)
    for offset in range(3):
        message = StoredMessage(offset, offset, b"", b"q", memoryview(b"\0\0"),
                                memoryview(b"body"), 1, 2, 0)  # fmt: skip
        queue.buffer.append((offset % 2, message))
        queue.count_in(4)
    queue.exhausted = True
    queue.pump(10, 0.0)
    assert len(channel.unacked) == 3 and isinstance(consumer, Consumer)
    session.settle(channel, list(channel.unacked.values()), None)
    assert queue.acked == 3
    assert vars(queue) == {}
