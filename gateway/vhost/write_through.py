"""Write-through: queues caught up with the store take a just-stored publish batch's messages
from the batch in hand instead of reading them back.

The hot path of every stored message, kept apart so that it has a compiled twin:
``speedups/mqgw_speedups/write_through.pyx`` does the same in C, and ``storage.twins`` picks it
when it is built (``MQGW_PURE_PYTHON=1`` forces this module). This module is the reference:
tests/gateway/vhost/test_write_through_twins.py holds the two equal on random batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from storage import AppendResult, Record, StoredMessage

# tuple.__new__ skips a NamedTuple's Python-level __new__ (a frame per message saved).
_make_tuple = tuple.__new__


class CatchingUp(Protocol):
    """What absorb asks of a queue (QueueRuntime is one: gateway/queues/store_reads.py)."""

    def caught_up(self, starts: Mapping[tuple[int, int], int]) -> bool: ...

    def absorb(self, messages: list[tuple[int, StoredMessage]]) -> bool: ...


Q = TypeVar("Q", bound=CatchingUp)


def absorb(by_id: Mapping[int, Q], records: Sequence[Record], result: AppendResult) -> set[Q]:
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
        views: tuple[memoryview, memoryview] | None = None  # one pair for all its queues
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
            if views is None:
                views = memoryview(properties), memoryview(body)
            fields = (
                offset,
                commit_offset,
                exchange,
                key,
                views[0],
                views[1],
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
