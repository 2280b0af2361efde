"""Closed ("sealed") partitions: a record flagged CLOSES closes the partitions it reaches
(LogStore.mark_closed; kept in the queue registry and rebuilt by recovery and on replicas).
A keyed-order queue closes a partition when it rescales (docs/ordering.md); a gateway still
routing by the old table must learn it, so the broker refuses appends naming a closed
partition, per destination (AppendResult.refused), and the gateway routes those again.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from storage.record import Destination, Record

Refusal = tuple[int, int, int]  # (record index in the batch, queue id, partition)


def refuse_closed(
    records: Sequence[Record], closed: Set[Destination]
) -> tuple[Sequence[Record], list[Refusal]]:
    """The records with their destinations in ``closed`` taken out (a record left with none
    is not kept; one that had none is), and the refused (record index, queue, partition).
    ``records`` itself comes back when nothing is refused: the common case builds nothing."""
    if not closed:
        return records, []
    first = _first_hit(records, closed)
    if first is None:
        return records, []
    kept = list(records[:first])
    refused: list[Refusal] = []
    last: object = None
    hit = False
    for index in range(first, len(records)):
        record = records[index]
        destinations = record.destinations
        if destinations is not last:  # batches usually repeat one destination tuple
            last = destinations
            hit = not closed.isdisjoint(destinations)
        if not hit:
            kept.append(record)
            continue
        admitted = tuple(d for d in destinations if d not in closed)
        refused += [(index, q, p) for q, p in destinations if (q, p) in closed]
        if admitted:
            kept.append(record._replace(destinations=admitted))
    return kept, refused


def _first_hit(records: Sequence[Record], closed: Set[Destination]) -> int | None:
    last: object = None
    for index, record in enumerate(records):
        destinations = record.destinations
        if destinations is not last:
            last = destinations
            if not closed.isdisjoint(destinations):
                return index
    return None


def merge_refusals(
    records: Sequence[Record], refused: Sequence[Refusal], later: Sequence[Refusal]
) -> list[Refusal]:
    """``refused`` (refuse_closed's, indexes into ``records``) and ``later``, the refusals
    of a check of what it kept (indexes into that), as indexes into ``records``, sorted."""
    if not refused:
        return sorted(later)
    gone: dict[int, int] = {}
    for index, _, _ in refused:
        gone[index] = gone.get(index, 0) + 1
    # A record is gone when every one of its destinations was refused (one with none stays).
    kept_at = [
        index
        for index, record in enumerate(records)
        if not record.destinations or gone.get(index, 0) < len(record.destinations)
    ]
    return sorted([*refused, *((kept_at[i], q, p) for i, q, p in later)])
