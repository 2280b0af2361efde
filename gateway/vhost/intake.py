"""What a stored publish batch does to the queues it was routed to, given the store's
``AppendResult``: destinations the broker refused never entered their queues (and
reject-publish-dlx dead-letters them). Queues caught up with the store take their new messages
from the batch in hand (write_through.py). ``VirtualHost.stored`` calls both once per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from gateway.queues.dead_letter import DeadLetter
from gateway.queues.runtime import QueueRuntime
from storage import Record
from storage.record import PERSISTENT


def refuse(
    by_id: Mapping[int, QueueRuntime],
    records: Sequence[Record],
    refused: Iterable[tuple[int, int, int]],
    dead_letter: Callable[[DeadLetter], None],
) -> None:
    """The broker refused these destinations (x-max-length reject-publish, counted where
    every gateway's appends meet): they never entered their queues; reject-publish-dlx
    dead-letters them. The publishers' nacks are the session's."""
    for index, queue_id, _ in refused:
        queue = by_id.get(queue_id)
        if queue is None:
            continue
        record = records[index]
        queue.count_out(len(record.body))
        queue.rejected_publishes += 1
        b = queue.behaviour
        if b.overflow == "reject-publish-dlx" and b.dlx is not None:
            letter = DeadLetter(
                queue.name,
                "maxlen",
                record.exchange.decode(),
                record.routing_key.decode(),
                bytes(record.properties),
                bytes(record.body),
                bool(record.flags & PERSISTENT),
                b.dlx,
                b.dlrk,
            )
            dead_letter(letter)
