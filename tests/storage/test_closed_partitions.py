"""Closed partitions: a record flagged CLOSES closes the partitions it reaches, in the store
(kept in the queue registry, rebuilt by recovery and by a replica's dispatch) and at the
broker, which refuses appends naming them (AppendResult.refused) so that a gateway routing by
an old table learns it. The broker half runs real `mqgw broker` processes."""

from __future__ import annotations

import dataclasses
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from storage import (
    BrokerUnavailable,
    LogStore,
    Record,
    RemoteStore,
    StoreConfig,
    connect_remote_store,
)
from storage.clients.routed import RoutedStore
from storage.log.closed_partitions import merge_refusals, refuse_closed
from storage.log.state_files import QueueInfo
from storage.record import CLOSES, PERSISTENT
from storage.replication.replica_log import read_chunk, write_chunk
from tests.storage.test_broker_byte_limits_remote import brokers


def rec(body: bytes, *dests: tuple[int, int], flags: int = PERSISTENT) -> Record:
    return Record(b"ex", b"rk", b"", body, tuple(dests), born_ts_ms=7, flags=flags)


def closing(*dests: tuple[int, int]) -> Record:
    return rec(b"close", *dests, flags=PERSISTENT | CLOSES)


# -- refuse_closed ----------------------------------------------------------------------------


def test_nothing_closed_or_nothing_hit_returns_the_batch_itself() -> None:
    batch = [rec(b"a", (1, 0)), rec(b"b", (1, 1))]
    assert refuse_closed(batch, set()) == (batch, [])
    kept, refused = refuse_closed(batch, {(2, 0), (1, 2)})
    assert kept is batch and refused == []


def test_closed_destinations_are_taken_out_with_their_batch_indexes() -> None:
    shared = ((1, 0), (1, 1))
    batch = [
        rec(b"a", (1, 0)),
        rec(b"b", (1, 1)),
        rec(b"c", *shared),
        rec(b"d"),  # routed nowhere: kept, as the store takes it
        rec(b"e", *shared),
        rec(b"f", (2, 0), (1, 0)),
    ]
    kept, refused = refuse_closed(batch, {(1, 0)})
    assert [(r.body, r.destinations) for r in kept] == [
        (b"b", ((1, 1),)),
        (b"c", ((1, 1),)),
        (b"d", ()),
        (b"e", ((1, 1),)),
        (b"f", ((2, 0),)),
    ]
    assert refused == [(0, 1, 0), (2, 1, 0), (4, 1, 0), (5, 1, 0)]
    assert batch[2].destinations == shared  # the batch itself is left as it was


def test_later_refusals_are_renumbered_through_the_records_kept() -> None:
    batch = [rec(b"a", (1, 0)), rec(b"b", (1, 1)), rec(b"c"), rec(b"d", (1, 0), (1, 1))]
    kept, refused = refuse_closed(batch, {(1, 0)})
    assert [r.body for r in kept] == [b"b", b"c", b"d"]
    # A length limit then refuses kept records 0 and 2: batch records 1 and 3.
    later = [(0, 1, 1), (2, 1, 1)]
    assert merge_refusals(batch, refused, later) == [(0, 1, 0), (1, 1, 1), (3, 1, 0), (3, 1, 1)]
    assert merge_refusals(batch, [], [(2, 1, 1), (0, 1, 1)]) == [(0, 1, 1), (2, 1, 1)]


# -- the log store ----------------------------------------------------------------------------


def _registry(config: StoreConfig) -> dict[str, dict[str, object]]:
    queues: dict[str, dict[str, object]] = json.loads(
        (config.data_dir / "queues.json").read_bytes()
    )["queues"]
    return queues


def test_a_closing_record_closes_its_partition_only(small_config: StoreConfig) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 2)
    store.create_queue(2, 1)
    store.append([rec(b"before", (1, 0)), closing((1, 0), (9, 0)), rec(b"after", (1, 1))])
    assert store.closed == {(1, 0)}  # queue 9 does not exist: nothing to close
    assert store.registry.queues[1].closed == [0]
    assert store.registry.queues[2].closed == []
    # The store itself indexes what it is given (the broker refuses): the record is readable.
    assert [bytes(m.body) for m in store.read(1, 0, 0).messages] == [b"before", b"close"]
    assert store.read(1, 0, 0).messages[1].flags & CLOSES
    store.append([rec(b"x", (2, 0))])  # the next append saves the registry first
    assert _registry(small_config)["1"]["closed"] == [0]
    assert "closed" not in _registry(small_config)["2"]  # readable by older versions
    store.close()
    reopened = LogStore.open(small_config)
    assert reopened.closed == {(1, 0)}
    reopened.close()


def test_queue_info_loads_with_or_without_closed() -> None:
    entry: dict[str, Any] = {"queue_id": 1, "partitions": 2, "created_at": 0}  # as loaded
    old = QueueInfo(**entry)
    assert old.closed == []
    closed = QueueInfo(**entry, closed=[1])
    assert closed.document()["closed"] == [1]
    closed.grow(4, 100)
    assert closed.closed == [1]
    assert "closed" not in old.document()


def test_a_registry_entry_holds_every_field_of_a_queue_that_grew_and_closed() -> None:
    info = QueueInfo(queue_id=3, partitions=2, created_at=7, floors=[1, 2], dropped=[0, 4])
    info.grow(3, 90)
    info.closed = [0]
    assert info.document() == dataclasses.asdict(info)  # a field added later is written too
    assert QueueInfo(**json.loads(json.dumps(info.document()))) == info


def test_closure_survives_a_crash_before_the_registry_is_saved(
    small_config: StoreConfig,
) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 2)
    store.append([rec(b"a", (1, 0))])  # registry saved: queue 1 on disk
    store.append([closing((1, 0))])
    store._release()  # a kill: no close, no checkpoint, the registry change unsaved
    assert "closed" not in _registry(small_config)["1"]
    recovered = LogStore.open(small_config)
    # The record was indexed before the kill: recovery closes the partition all the same.
    assert recovered.recovery is not None and recovered.recovery.redispatched == 0
    assert recovered.closed == {(1, 0)}
    assert _registry(small_config)["1"]["closed"] == [0]  # written with the checkpoint
    recovered._release()
    again = LogStore.open(small_config)
    assert again.closed == {(1, 0)}
    again.close()


def test_deleting_the_queue_drops_its_closure_and_recovery_does_not_bring_it_back(
    small_config: StoreConfig,
) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 2)
    store.append([closing((1, 0), (1, 1))])
    assert store.closed == {(1, 0), (1, 1)}
    store.delete_queue(1)
    assert store.closed == set()
    store.create_queue(1, 2)
    store.append([rec(b"new", (1, 0))])
    assert store.closed == set()
    store._release()
    # Recovery from the very start re-reads the old closing record: not the new queue's.
    (small_config.data_dir / "checkpoint.json").unlink()
    recovered = LogStore.open(small_config)
    assert recovered.closed == set()
    assert [bytes(m.body) for m in recovered.read(1, 0, 0).messages] == [b"new"]
    recovered.close()


def test_a_replica_closes_what_the_masters_log_closes(tmp_path: Path) -> None:
    def config(name: str) -> StoreConfig:
        return StoreConfig(
            tmp_path / name,
            segment_size_bytes=4096,
            cq_entries_per_segment=16,
            max_record_bytes=1024,
        )

    master, replica = LogStore.open(config("master")), LogStore.open(config("replica"))
    for store in (master, replica):
        store.create_queue(1, 2)
    master.append([rec(b"a", (1, 0)), rec(b"b", (1, 1))])
    master.append([closing((1, 1))])
    offset = 0
    while offset < master.commit_log.write_offset:
        chunk = read_chunk(master, offset, 1 << 20)
        write_chunk(replica, chunk)
        offset = chunk.end
    assert replica.closed == {(1, 1)}
    assert replica.registry.queues[1].closed == [1]
    master.close()
    replica.close()


# -- over real brokers (tests/storage/test_broker_byte_limits_remote.py's) ------------------


async def bodies(store: RemoteStore | RoutedStore, queue_id: int, partition: int) -> list[bytes]:
    return [bytes(m.body) for m in (await store.read(queue_id, partition, 0)).messages]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_the_broker_refuses_closed_partitions_and_still_does_after_kill_9(
    tmp_path: Path,
) -> None:
    async with (
        brokers(tmp_path, "g1") as procs,
        connect_remote_store(procs["g1"].address, unavailable_wait_s=5.0) as store,
    ):
        await store.create_queue(1, 2)
        await store.create_queue(2, 2)
        assert (await store.append([closing((1, 0))])).refused == ()
        assert (await store.append([closing((2, 0))])).refused == ()
        procs["g1"].kill()  # kill -9 right away: the registry was not saved since
        procs["g1"].start()
        result = None
        batch = [
            rec(b"a", (1, 0)),
            rec(b"b", (1, 1)),
            rec(b"c", (1, 0), (1, 1)),
            rec(b"d", (1, 1)),
        ]
        with anyio.fail_after(20):
            while result is None:
                try:
                    result = await store.append(batch)
                except BrokerUnavailable:
                    await anyio.sleep(0.05)
        assert result.refused == ((0, 1, 0), (2, 1, 0))
        assert result.record_offsets == () and result.queue_starts is None
        assert await bodies(store, 1, 0) == [b"close"]
        assert await bodies(store, 1, 1) == [b"b", b"c", b"d"]

        # With a length limit too: what a closed partition refuses takes no room, and the
        # limit's refusal keeps its index in the batch as sent.
        store.set_append_limit(2, 3)  # the closing record counts as one
        batch = [
            rec(b"x", (2, 0)),
            rec(b"y", (2, 1)),
            rec(b"z", (2, 0)),
            rec(b"w", (2, 1)),
            rec(b"v", (2, 1)),
        ]
        result = await store.append(batch)
        assert result.refused == ((0, 2, 0), (2, 2, 0), (4, 2, 1))
        assert await bodies(store, 2, 1) == [b"y", b"w"]

        # Deleted and declared again: another queue, open.
        await store.delete_queue(1)
        await store.create_queue(1, 2)
        assert (await store.append([rec(b"new", (1, 0))])).refused == ()
        assert await bodies(store, 1, 0) == [b"new"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_routed_store_maps_each_groups_refusals_to_the_batch(tmp_path: Path) -> None:
    async with brokers(tmp_path, "a", "b") as procs, AsyncExitStack() as stack:
        remotes = {
            name: await stack.enter_async_context(connect_remote_store(p.address))
            for name, p in procs.items()
        }
        placement = {3: ["a", "b", "a", "b"]}
        store = RoutedStore(dict(remotes), placement.get, home="a")
        await store.create_queue(3, 4)
        assert (await store.append([closing((3, 0)), closing((3, 3))])).refused == ()
        batch = [
            rec(b"r0", (3, 1)),  # b
            rec(b"r1", (3, 0)),  # a: closed
            rec(b"r2", (3, 2), (3, 3)),  # a, and b: closed
            rec(b"r3", (3, 3)),  # b: closed
            rec(b"r4", (3, 2)),  # a
        ]
        result = await store.append(batch)
        assert sorted(result.refused) == [(1, 3, 0), (2, 3, 3), (3, 3, 3)]
        assert await bodies(store, 3, 0) == [b"close"]
        assert await bodies(store, 3, 1) == [b"r0"]
        assert await bodies(store, 3, 2) == [b"r2", b"r4"]
        assert await bodies(store, 3, 3) == [b"close"]
        # One group alone: its refusals come through as they are.
        alone = await store.append([rec(b"s0", (3, 2)), rec(b"s1", (3, 0))])
        assert alone.refused == ((1, 3, 0),)
