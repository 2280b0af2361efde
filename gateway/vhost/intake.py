"""What a stored publish batch does to the queues it was routed to, given the store's
``AppendResult``: destinations the broker refused never entered their queues (and
reject-publish-dlx dead-letters them), and queues caught up with the store take their new
messages from the batch in hand instead of reading them back (write-through). Pure functions
of the vhost's queues by id; ``VirtualHost.stored`` calls them once per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from gateway.queues.dead_letter import DeadLetter
from gateway.queues.runtime import QueueRuntime
from storage import AppendResult, Record, StoredMessage
from storage.record import PERSISTENT

# tuple.__new__ skips a NamedTuple's Python-level __new__ (a frame per message saved).
_make_tuple = tuple.__new__


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


def absorb(
    by_id: Mapping[int, QueueRuntime], records: Sequence[Record], result: AppendResult
) -> set[QueueRuntime]:
    """Hand each new message to its queue if that queue is caught up with the store (it
    has consumers and has read every partition to the end); returns those queues."""
    starts = result.queue_starts
    if not starts or len(result.record_offsets) != len(records):
        return set()
    next_offset = dict(starts)
    taken: dict[int, list[tuple[int, StoredMessage]]] = {}  # queue id -> its messages
    refused: set[int] = set()
    store_ts = result.store_ts_ms
    make = _make_tuple
    for record, commit_offset in zip(records, result.record_offsets, strict=True):
        exchange, key, properties, body, destinations, born, flags = record
        for destination in destinations:
            offset = next_offset.get(destination)
            if offset is None:
                continue
            next_offset[destination] = offset + 1
            queue_id = destination[0]
            messages = taken.get(queue_id)
            if messages is None:
                if queue_id in refused:
                    continue
                queue = by_id.get(queue_id)
                if queue is None or not queue.caught_up(starts):
                    refused.add(queue_id)
                    continue
                messages = taken[queue_id] = []
            fields = (
                offset,
                commit_offset,
                exchange,
                key,
                memoryview(properties),
                memoryview(body),
                born,
                store_ts,
                flags,
            )
            messages.append((destination[1], make(StoredMessage, fields)))
    absorbed = set()
    for queue_id, messages in taken.items():
        queue = by_id[queue_id]
        if queue.absorb(messages):
            absorbed.add(queue)
    return absorbed
