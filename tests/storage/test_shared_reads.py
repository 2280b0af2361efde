"""A large record routed to several queues is read once while any of them holds it
(storage/log/shared_reads.py): fan-out of a 100 MiB message must not cost 100 MiB per queue."""

from __future__ import annotations

import gc
from dataclasses import replace

from storage import LogStore, StoreConfig
from storage.log.shared_reads import SHARE_FROM_BYTES
from tests.storage.helpers import rec

LARGE = SHARE_FROM_BYTES + 1


def _store(small_config: StoreConfig) -> LogStore:
    config = replace(small_config, segment_size_bytes=8 << 20, max_record_bytes=4 << 20)
    store = LogStore.open(config)
    for queue_id in (1, 2, 3):
        store.create_queue(queue_id, 1)
    return store


def test_queues_reading_one_large_record_share_its_buffer(small_config: StoreConfig) -> None:
    store = _store(small_config)
    try:
        body = bytes(range(256)) * (LARGE // 256 + 1)
        store.append([rec(b"small", (1, 0), (2, 0)), rec(body, (1, 0), (2, 0), (3, 0))])
        first = store.read(1, 0, 0).messages
        assert [bytes(m.body) for m in first] == [b"small", body]
        others = [store.read(q, 0, 0).messages[-1] for q in (2, 3)]
        for message in others:
            assert message.body.obj is first[1].body.obj  # the same read, not a copy
            assert bytes(message.body) == body and bytes(message.properties) == b"\x90\x00\x02"
            assert message.exchange == b"ex" and message.routing_key == b"rk"
        assert others[1].queue_offset == 0 and first[1].queue_offset == 1  # their own offsets
        small_again = store.read(2, 0, 0).messages[0]
        # A small record is not shared but kept, decoded (storage/log/recent_records.py).
        assert small_again.body.obj is first[0].body.obj and len(store.shared_reads) == 1
    finally:
        store.close()


def test_a_large_record_nobody_holds_is_read_again(small_config: StoreConfig) -> None:
    store = _store(small_config)
    try:
        store.append([rec(b"x" * LARGE, (1, 0), (2, 0))])
        held = store.read(1, 0, 0).messages[0]
        assert len(store.shared_reads) == 1
        del held
        gc.collect()
        assert len(store.shared_reads) == 0  # nothing kept alive for later readers
        again = store.read(2, 0, 0).messages[0]
        assert bytes(again.body) == b"x" * LARGE and len(store.shared_reads) == 1
    finally:
        store.close()
