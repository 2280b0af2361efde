"""Large records read once for all the queues that hold them.

A fan-out stores one record for all its destinations, but each queue reads its messages for
itself: without sharing, a 100 MiB message routed to three queues with consumers would be
held three times. While any reader still holds a large record's body (a delivery in flight,
unacked), another read of the same commit offset gets the same buffer. Nothing is kept
alive here: entries are weak and go with the last reader's reference.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

# Records at least this large are shared; smaller ones are cheaper to read again.
SHARE_FROM_BYTES = 1 << 20


class SharedRecord(NamedTuple):
    """The parts of a record a reader builds its StoredMessage from (not the queue offset)."""

    exchange: bytes
    routing_key: bytes
    properties: memoryview
    body: memoryview
    born_ts_ms: int
    store_ts_ms: int
    flags: int


class _Entry(NamedTuple):
    exchange: bytes
    routing_key: bytes
    properties: weakref.ref[memoryview]
    body: weakref.ref[memoryview]
    born_ts_ms: int
    store_ts_ms: int
    flags: int


class SharedReads:
    """Commit offset -> the record as last read, for as long as someone holds its body."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, commit: int) -> SharedRecord | None:
        entry = self._entries.get(commit)
        if entry is None:
            return None
        properties, body = entry.properties(), entry.body()
        if properties is None or body is None:
            return None  # its readers are gone; the entry's callback is on its way
        return SharedRecord(
            entry.exchange,
            entry.routing_key,
            properties,
            body,
            entry.born_ts_ms,
            entry.store_ts_ms,
            entry.flags,
        )

    def put(self, commit: int, record: SharedRecord) -> None:
        entries = self._entries

        def forget(ref: weakref.ref[memoryview]) -> None:
            entry = entries.get(commit)
            if entry is not None and ref in (entry.body, entry.properties):
                del entries[commit]

        entries[commit] = _Entry(
            record.exchange,
            record.routing_key,
            weakref.ref(record.properties, forget),
            weakref.ref(record.body, forget),
            record.born_ts_ms,
            record.store_ts_ms,
            record.flags,
        )
