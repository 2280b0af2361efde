"""The StorePort contract: one suite, run over every implementation.

``embedded``: open_embedded_store in a temporary directory. ``remote``: serve_broker in this
event loop on a free 127.0.0.1 port, and a RemoteStore connected to it. ``routed``: a
RoutedStore over two embedded stores (groups "a" and "b") with a fixed placement that puts
partition p of queue q on group (q + p) % 2, so a queue's partitions and a batch's records
spread over both. ``rocketmq``: a RocketMQStore over the session's real RocketMQ (one name
server, one broker), in a namespace of the test's own. Each test runs on asyncio and trio.
Tests of the log's own files (write errors of a file system, segments, crash marks) run over
the three kinds that have them; what RocketMQ answers there instead is tested at the end.
Whatever the gateway may rely on is asserted here, so an implementation
that passes can replace the other without the gateway noticing (BrokerUnavailable aside).
"""

from __future__ import annotations

import errno
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from storage import (
    QUEUE_GROUP,
    DiskFull,
    FlushPolicy,
    LogStore,
    ReadStatus,
    Record,
    RecordTooLarge,
    RetentionReport,
    StoreConfig,
    StorePort,
    StoreWriteError,
    UnknownQueue,
    connect_remote_store,
    open_embedded_store,
)
from storage.clients.routed import RoutedStore
from storage.log.file_system import FileSystem
from storage.rocketmq import connect_rocketmq_store
from tests.storage.conftest import FaultyFileSystem
from tests.storage.helpers import bodies
from tests.storage.remote_helpers import served, served_broker

pytestmark = [
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.anyio,
]


LOG_KINDS = ["embedded", "remote", "routed"]  # over mqgw's log store and its files


@pytest.fixture(params=[*LOG_KINDS, "rocketmq"])
def kind(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


_rocketmq_namesrv: list[str] = []  # the session RocketMQ's, once a rocketmq test asked


@pytest.fixture(autouse=True)
def _rocketmq_when_needed(kind: str, request: pytest.FixtureRequest) -> None:
    if kind == "rocketmq" and not _rocketmq_namesrv:
        _rocketmq_namesrv.append(request.getfixturevalue("rocketmq").namesrv)


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(
        tmp_path / "store",
        segment_size_bytes=64 << 20,  # room for a 16 MiB record
        cq_entries_per_segment=1024,
    )


ROUTED_GROUPS = ("a", "b")


def routed_placement(queue_id: int) -> list[str]:
    return [ROUTED_GROUPS[(queue_id + p) % 2] for p in range(8)]


def member_configs(kind: str, config: StoreConfig) -> list[StoreConfig]:
    """The configurations of the log stores behind an implementation."""
    if kind != "routed":
        return [config]
    return [replace(config, data_dir=config.data_dir / group) for group in ROUTED_GROUPS]


def commitlog_offsets(kind: str) -> bool:
    """Whether an AppendResult's offsets are commitlog offsets (a routed store numbers its
    batches instead, and a batch spread over groups has no record offsets or queue starts;
    RocketMQ's store numbers its batches too)."""
    return kind in ("embedded", "remote")


def starts_kept(kind: str) -> bool:
    """Whether an append says where it began in each partition, however it was split."""
    return kind != "routed"


@asynccontextmanager
async def open_store(
    kind: str, config: StoreConfig, fs: FileSystem | None = None
) -> AsyncIterator[StorePort]:
    if kind == "rocketmq":
        namespace = "t" + hashlib.sha1(str(config.data_dir).encode()).hexdigest()[:12]
        url = f"rocketmq://{_rocketmq_namesrv[0]}/{namespace}"
        async with connect_rocketmq_store(url, config.max_record_bytes) as rocketmq:
            yield rocketmq
    elif kind == "routed":
        a, b = member_configs(kind, config)
        async with open_embedded_store(a, fs) as store_a, open_embedded_store(b, fs) as store_b:
            yield RoutedStore({"a": store_a, "b": store_b}, routed_placement)
    elif kind == "embedded":
        async with open_embedded_store(config, fs) as embedded:
            yield embedded
    elif fs is None:  # the broker as `mqgw broker` runs it: serve_broker opens the store
        async with served_broker(config) as address, connect_remote_store(address) as remote:
            yield remote
    else:  # a store on a faulty file system, served as serve_broker would serve it
        async with (
            open_embedded_store(config, fs) as embedded,
            served(embedded) as address,
            connect_remote_store(address) as remote,
        ):
            yield remote


def rec(body: bytes, *dests: tuple[int, int], props: bytes = b"\x90\x00\x02") -> Record:
    return Record(b"amq.topic", b"a.b.c", props, body, tuple(dests), born_ts_ms=1234, flags=1)


async def fill(store: StorePort, queue_id: int, count: int, partition: int = 0) -> None:
    await store.append([rec(b"m%d" % i, (queue_id, partition)) for i in range(count)])


# -- append and read -----------------------------------------------------------------------


async def test_append_and_read_round_trip_every_field(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        await store.create_queue(2, 2)
        batch = [
            rec(b"to both", (1, 0), (2, 1), props=b"\x80\x00\x0atext/plain"),
            rec(b"", (2, 0), props=b""),  # empty body and properties
            Record(b"", b"", b"\x00\x10", b"\x00\xff" * 100, ((1, 0),), born_ts_ms=0, flags=0),
            rec(b"nowhere"),  # no destination: stored, indexed nowhere
        ]
        result = await store.append(batch)
        assert (result.start_offset, result.record_count) == (0, 4)
        if commitlog_offsets(kind):
            assert result.record_offsets[0] == 0 and len(result.record_offsets) == 4
            assert list(result.record_offsets) == sorted(result.record_offsets)
            assert result.end_offset > result.record_offsets[-1]
            assert result.queue_starts == {(1, 0): 0, (2, 1): 0, (2, 0): 0}
        else:  # spread over groups or topics: read back, not taken from the batch in hand
            starts = {(1, 0): 0, (2, 1): 0, (2, 0): 0} if starts_kept(kind) else None
            assert (result.end_offset, result.record_offsets, result.queue_starts) == (
                1,
                (),
                starts,
            )
        assert result.store_ts_ms > 0

        read = await store.read(1, 0, 0)
        assert (read.status, read.next_offset, read.min_offset, read.max_offset) == (
            ReadStatus.FOUND,
            2,
            0,
            2,
        )
        first, third = read.messages
        assert first.queue_offset == 0 and third.queue_offset == 1
        if commitlog_offsets(kind):
            assert first.commit_offset == result.record_offsets[0]
            assert third.commit_offset == result.record_offsets[2]
        assert (first.exchange, first.routing_key) == (b"amq.topic", b"a.b.c")
        assert bytes(first.properties) == b"\x80\x00\x0atext/plain"
        assert bytes(first.body) == b"to both"
        assert (first.born_ts_ms, first.flags) == (1234, 1)
        if commitlog_offsets(kind):
            assert first.store_ts_ms == result.store_ts_ms
        else:  # each group stamps its part; the batch has the latest stamp
            assert 0 <= result.store_ts_ms - first.store_ts_ms < 1000
        assert (third.exchange, third.routing_key, third.born_ts_ms, third.flags) == (
            b"",
            b"",
            0,
            0,
        )
        assert (bytes(third.properties), bytes(third.body)) == (b"\x00\x10", b"\x00\xff" * 100)
        assert isinstance(first.body, memoryview) and isinstance(first.properties, memoryview)

        fanned = (await store.read(2, 1, 0)).messages
        assert [bytes(m.body) for m in fanned] == [b"to both"]
        if kind != "rocketmq":  # one write shared by the destinations (RocketMQ: one each)
            assert fanned[0].commit_offset == 0
        empty = (await store.read(2, 0, 0)).messages
        assert [(bytes(m.properties), bytes(m.body)) for m in empty] == [(b"", b"")]

        again = await store.append([rec(b"next", (1, 0)), rec(b"next2", (2, 0))])
        assert again.start_offset == result.end_offset
        expected_starts = {(1, 0): 2, (2, 0): 1} if starts_kept(kind) else None
        assert again.queue_starts == expected_starts
        together = await store.append([rec(b"one group", (1, 0), (2, 1))])
        assert together.queue_starts == {(1, 0): 3, (2, 1): 1}  # one group: starts kept
        assert together.start_offset == again.end_offset
        again = together
        assert await store.append([]) == (again.end_offset, again.end_offset, 0, (), None, 0, ())


async def test_read_statuses_and_limits(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        await fill(store, 1, 10)
        page = await store.read(1, 0, 2, max_count=3)
        assert (bodies(page.messages), page.next_offset) == ([b"m2", b"m3", b"m4"], 5)
        one = await store.read(1, 0, 0, max_bytes=1)  # at least one message, whatever the size
        assert (bodies(one.messages), one.next_offset) == ([b"m0"], 1)
        at_end = await store.read(1, 0, 10)
        assert (at_end.status, at_end.messages, at_end.next_offset) == (
            ReadStatus.NO_NEW_MESSAGE,
            [],
            10,
        )
        past = await store.read(1, 0, 11)
        assert (past.status, past.next_offset) == (ReadStatus.OFFSET_OVERFLOW, 10)
        assert await store.purge(1) == 10
        moved = await store.read(1, 0, 0)
        assert (moved.status, moved.messages, moved.next_offset, moved.min_offset) == (
            ReadStatus.MOVED,
            [],
            10,
            10,
        )


async def test_big_batch_in_one_append(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(5, 1)
        batch = [rec(b"%06d" % i + b"x" * (i % 300), (5, 0)) for i in range(5000)]
        result = await store.append(batch)
        assert result.record_count == 5000 and len(result.record_offsets) == 5000
        got: list[bytes] = []
        offset = 0
        while offset < 5000:
            page = await store.read(5, 0, offset, max_count=1000, max_bytes=64 << 20)
            got += bodies(page.messages)
            offset = page.next_offset
        assert got == [record.body for record in batch]


async def test_sixteen_mib_record(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        body = bytes(range(256)) * (1 << 16)  # 16 MiB
        props = b"\xff" * 1000
        await store.append([rec(body, (1, 0), props=props), rec(b"after", (1, 0))])
        (big,) = (await store.read(1, 0, 0, max_count=1)).messages
        assert (len(big.body), bytes(big.body) == body, bytes(big.properties)) == (
            16 << 20,
            True,
            props,
        )
        too_big = rec(b"x" * (config.max_record_bytes + 1), (1, 0))
        with pytest.raises(RecordTooLarge) as raised:
            await store.append([rec(b"fine", (1, 0)), too_big])
        assert raised.value.max_bytes == config.max_record_bytes
        assert raised.value.size_bytes > config.max_record_bytes
        assert (await store.queue_stats(1)).partitions[0].max_offset == 2  # nothing appended


# -- durability ----------------------------------------------------------------------------


async def test_wait_durable_semantics_under_sync_flush(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        await store.wait_durable(0)  # nothing written: done at once
        written = await store.append([rec(b"a", (1, 0)), rec(b"b", (1, 0))], wait_durable=False)
        # Written and readable, not yet durable: sync flush fsyncs only for a waiter.
        assert bodies((await store.read(1, 0, 0)).messages) == [b"a", b"b"]
        backlog = await store.backlog_bytes()
        if kind == "rocketmq":  # a send is acknowledged after the broker's flush
            assert backlog == 0
        else:
            assert backlog == written.end_offset if commitlog_offsets(kind) else backlog > 0
        await store.wait_durable(written.end_offset)
        assert await store.backlog_bytes() == 0
        durable = await store.append([rec(b"c", (1, 0))])  # wait_durable=True by default
        assert durable.start_offset == written.end_offset
        assert await store.backlog_bytes() == 0


async def test_async_flush_confirms_after_write_and_syncs_on_interval(
    kind: str, config: StoreConfig
) -> None:
    config = replace(config, flush=FlushPolicy.ASYNC, async_flush_interval_ms=20)
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        result = await store.append([rec(b"a", (1, 0))])
        await store.wait_durable(result.end_offset)  # async: no wait, as in-process
        with anyio.fail_after(5):
            while await store.backlog_bytes():
                await anyio.sleep(0.01)


@pytest.mark.parametrize("kind", LOG_KINDS)
async def test_write_errors_are_typed(kind: str, config: StoreConfig) -> None:
    fs = FaultyFileSystem()
    async with open_store(kind, config, fs) as store:
        await store.create_queue(1, 1)
        await store.append([rec(b"ok", (1, 0))])
        fs.space_bytes = 0
        with pytest.raises(DiskFull) as full:
            await store.append([rec(b"no room", (1, 0))])
        assert full.value.errno == errno.ENOSPC
        fs.space_bytes = None
        await store.append([rec(b"room again", (1, 0))])
        fs.fail_fsync = True
        with pytest.raises(StoreWriteError) as failed:
            await store.append([rec(b"unsure", (1, 0))])
        assert failed.value.errno == errno.EIO
        fs.fail_fsync = False
        with pytest.raises(StoreWriteError, match="failed an fsync"):
            await store.append([rec(b"later", (1, 0))], wait_durable=False)


# -- queues, offsets, counts ---------------------------------------------------------------


async def test_queue_lifecycle_and_typed_errors(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        assert await store.queues() == {}
        await store.create_queue(7, 3)
        await store.create_queue(7, 3)  # idempotent
        await store.create_queue(7, 2)  # fewer: left as it is
        await store.create_queue(8, 1)
        assert await store.queues() == {7: 3, 8: 1}
        for bad in (0, 65536):
            with pytest.raises(ValueError, match="partitions"):
                await store.create_queue(9, bad)
            with pytest.raises(ValueError, match="partitions"):
                await store.create_queue(7, bad)  # an existing queue: still checked
        assert await store.queues() == {7: 3, 8: 1}
        await store.delete_queue(7)
        assert await store.queues() == {8: 1}
        with pytest.raises(UnknownQueue) as gone:
            await store.delete_queue(7)
        assert (gone.value.queue_id, gone.value.partition) == (7, None)
        with pytest.raises(UnknownQueue) as bad_partition:
            await store.read(8, 4, 0)
        assert (bad_partition.value.queue_id, bad_partition.value.partition) == (8, 4)
        for call in (
            store.queue_stats(7),
            store.purge(7),
            store.committed_offset("g", 7, 0),
            store.commit_offset("g", 7, 0, 1),
            store.offset_for_time(7, 0, 0),
        ):
            with pytest.raises(UnknownQueue):
                await call
        # A record routed to a queue deleted meanwhile is stored, indexed nowhere.
        result = await store.append([rec(b"late", (7, 0), (8, 0))])
        assert result.queue_starts == ({(8, 0): 0} if starts_kept(kind) else None)
        assert bodies((await store.read(8, 0, 0)).messages) == [b"late"]


async def test_create_queue_grows_a_queue(kind: str, config: StoreConfig) -> None:
    """create_queue with more partitions adds empty ones after the existing ones (keyed-order
    queues rescale so); never fewer. The partitions and their messages survive a clean
    restart, and a crash after a later growth."""

    async def check(store: StorePort, partitions: int, held: dict[int, list[bytes]]) -> None:
        assert await store.queues() == {1: partitions, 2: 1}
        stats = await store.queue_stats(1)
        assert [(s.partition, s.min_offset, s.max_offset) for s in stats.partitions] == [
            (p, 0, len(held.get(p, []))) for p in range(partitions)
        ]
        for p in range(partitions):
            assert bodies((await store.read(1, p, 0)).messages) == held.get(p, [])
        with pytest.raises(UnknownQueue):
            await store.read(1, partitions, 0)

    async with open_store(kind, config) as store:
        await store.create_queue(1, 2)
        await store.create_queue(2, 1)
        await fill(store, 1, 3, partition=0)
        await fill(store, 1, 2, partition=1)
        await store.commit_offset(QUEUE_GROUP, 1, 0, 2)
        await store.create_queue(1, 4)
        for p in (2, 3):
            empty = await store.read(1, p, 0)
            assert (empty.status, empty.messages) == (ReadStatus.NO_NEW_MESSAGE, [])
            assert (empty.next_offset, empty.min_offset, empty.max_offset) == (0, 0, 0)
            assert await store.committed_offset(QUEUE_GROUP, 1, p) == 0
        result = await store.append([rec(b"new", (1, 3)), rec(b"both", (1, 3), (1, 0))])
        if starts_kept(kind):
            assert result.queue_starts == {(1, 3): 0, (1, 0): 3}
        await store.create_queue(1, 3)  # fewer: nothing removed
        await store.create_queue(1, 4)  # as many: nothing changes
        held = {0: [b"m0", b"m1", b"m2", b"both"], 1: [b"m0", b"m1"], 3: [b"new", b"both"]}
        await check(store, 4, held)
        await store.commit_offset(QUEUE_GROUP, 1, 3, 1)
        assert await store.committed_offset(QUEUE_GROUP, 1, 3) == 1
        stats = await store.queue_stats(1)
        assert [s.committed for s in stats.partitions] == [2, 0, 0, 1]
        assert stats.ready == 2 + 2 + 0 + 1
    async with open_store(kind, config) as store:
        await check(store, 4, held)
        assert [s.committed for s in (await store.queue_stats(1)).partitions] == [2, 0, 0, 1]
        assert await store.unclean_marks(1) == {}
    if kind == "rocketmq":
        return  # what follows crashes mqgw's log store
    # A crash (no close) after growing once more and appending to the new partitions.
    for member in member_configs(kind, config):
        crashed = LogStore.open(member)
        crashed.create_queue(1, 6)
        crashed.append([rec(b"five", (1, 5)), rec(b"two", (1, 2))])
        crashed.flush()
        crashed._release()
    held |= {2: [b"two"], 5: [b"five"]}
    async with open_store(kind, config) as store:
        await check(store, 6, held)
        assert await store.unclean_marks(1) == {0: 4, 1: 2, 2: 1, 3: 2, 4: 0, 5: 1}
        await store.create_queue(1, 5)
        await check(store, 6, held)


async def test_offsets_stats_and_purge(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 2)
        await fill(store, 1, 10, partition=0)
        await fill(store, 1, 3, partition=1)
        assert await store.committed_offset("g", 1, 0) == 0  # a group never seen: the minimum
        await store.commit_offset("g", 1, 0, 4)
        await store.commit_offset(QUEUE_GROUP, 1, 0, 6)
        assert await store.committed_offset("g", 1, 0) == 4
        stats = await store.queue_stats(1)
        assert (stats.queue_id, stats.ready, stats.dropped_by_retention) == (1, 4 + 3, 0)
        assert [
            (p.partition, p.min_offset, p.max_offset, p.committed) for p in stats.partitions
        ] == [
            (0, 0, 10, 6),
            (1, 0, 3, 0),
        ]
        assert (await store.queue_stats(1, "g")).ready == 6 + 3
        assert await store.purge(1) == 7
        after = await store.queue_stats(1)
        assert after.ready == 0
        assert [(p.min_offset, p.max_offset) for p in after.partitions] == [(10, 10), (3, 3)]
        assert await store.committed_offset("g", 1, 0) == 10  # never below the minimum
        await fill(store, 1, 2)
        assert bodies((await store.read(1, 0, 0)).messages) == [b"m0", b"m1"]
        assert (await store.queue_stats(1)).ready == 2


async def test_offset_for_time(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        for i in range(4):
            await store.append([rec(b"%d" % i, (1, 0))] * 2)
            await anyio.sleep(0.002)  # a store time of its own (milliseconds)
        stamps = [m.store_ts_ms for m in (await store.read(1, 0, 0)).messages]
        assert len(stamps) == 8 and stamps == sorted(stamps)
        for ts in (0, *stamps, stamps[-1] + 1):
            expected = next((i for i, stamp in enumerate(stamps) if stamp >= ts), len(stamps))
            assert await store.offset_for_time(1, 0, ts) == expected


@pytest.mark.parametrize("kind", LOG_KINDS)
async def test_disk_bytes_held_back_and_retention(kind: str, config: StoreConfig) -> None:
    config = replace(
        config, segment_size_bytes=4096, max_record_bytes=2048, checkpoint_interval_ms=10
    )
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        assert await store.disk_bytes() == 0
        for _ in range(6):
            await store.append([rec(b"x" * 500, (1, 0)) for _ in range(6)])
        written = await store.disk_bytes()
        assert written > 3 * 4096
        held = await store.held_back_bytes()
        assert set(held) == {1} and held[1] >= written - 4096
        report = await store.apply_retention()
        assert isinstance(report, RetentionReport) and report.deleted_segments == 0  # unread
        await store.commit_offset(QUEUE_GROUP, 1, 0, 36)
        assert await store.held_back_bytes() == {}
        # Consumed segments go once a checkpoint (every 10 ms here) lies past them.
        with anyio.fail_after(5):
            while (report := await store.apply_retention()).deleted_segments == 0:
                await anyio.sleep(0.01)
        assert report.freed_bytes > 0 and report.dropped_unread == {}
        assert await store.disk_bytes() < written


@pytest.mark.parametrize("kind", LOG_KINDS)
async def test_oldest_segment_time_and_crash_marks(kind: str, config: StoreConfig) -> None:
    config = replace(config, segment_size_bytes=4096, max_record_bytes=2048)
    async with open_store(kind, config) as store:
        await store.create_queue(1, 2)
        assert await store.oldest_segment_ts() is None  # one segment, still being written
        for _ in range(3):
            await store.append([rec(b"x" * 500, (1, 0)) for _ in range(6)])
        oldest = await store.oldest_segment_ts()
        assert oldest is not None and oldest > 0
        assert await store.unclean_marks(1) == {}  # a new store: nothing was delivered
        assert await store.restart_marks(1) == {}  # and nothing from an earlier run
    # A crash (no close): what each partition held may have been delivered.
    for member in member_configs(kind, config):
        crashed = LogStore.open(member)
        crashed.append([rec(b"y", (1, 1))])
        crashed.flush()
        crashed._release()
    async with open_store(kind, config) as store:
        assert await store.unclean_marks(1) == {0: 18, 1: 1}
        assert await store.restart_marks(1) == {0: 18, 1: 1}
    async with open_store(kind, config) as store:  # after a clean stop: no crash marks
        assert await store.unclean_marks(1) == {}
        assert await store.restart_marks(1) == {0: 18, 1: 1}


# -- concurrency ---------------------------------------------------------------------------


async def test_many_appends_and_reads_in_flight(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        publishers, batches, per_batch = 20, 15, 8
        total = publishers * batches * per_batch
        seen: list[bytes] = []

        async def publish(n: int) -> None:
            for b in range(batches):
                batch = [rec(b"%d/%d/%d" % (n, b, i), (1, 0)) for i in range(per_batch)]
                durable = b % 2 == 0
                result = await store.append(batch, wait_durable=durable)
                if not durable:
                    await store.wait_durable(result.end_offset)

        async def consume() -> None:
            offset = 0
            while offset < total:
                page = await store.read(1, 0, offset, max_count=50)
                seen.extend(bodies(page.messages))
                offset = page.next_offset
                await store.commit_offset(QUEUE_GROUP, 1, 0, offset)
                if not page.messages:
                    await anyio.sleep(0.001)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(3):  # three readers: reads in flight alongside the appends
                    tg.start_soon(consume)
                for n in range(publishers):
                    tg.start_soon(publish, n)
        assert len(seen) == 3 * total and len(set(seen)) == total  # each reader saw all
        stored = bodies((await store.read(1, 0, 0, max_count=total, max_bytes=1 << 30)).messages)
        for n in range(publishers):  # each publisher's messages in its order
            mine = [body for body in stored if body.startswith(b"%d/" % n)]
            assert mine == [
                b"%d/%d/%d" % (n, b, i) for b in range(batches) for i in range(per_batch)
            ]
        assert await store.backlog_bytes() == 0
        assert (await store.queue_stats(1)).ready == 0


# -- what RocketMQ manages itself ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["rocketmq"])
async def test_rocketmq_leaves_disk_and_crash_figures_to_its_brokers(
    kind: str, config: StoreConfig
) -> None:
    """Retention, disk use and crash marks are the broker's: the store says so by answering
    nothing, never by failing, and a length limit is left to the gateway."""
    async with open_store(kind, config) as store:
        await store.create_queue(1, 2)
        await fill(store, 1, 5)
        store.set_append_limit(1, 2)
        await fill(store, 1, 1)  # not refused: the gateway checks limits over RocketMQ
        assert (await store.queue_stats(1)).partitions[0].max_offset == 6
        assert (await store.disk_bytes(), await store.held_back_bytes()) == (0, {})
        assert await store.apply_retention() == RetentionReport(0, 0, {})
        assert await store.oldest_segment_ts() is None
        assert (await store.restart_marks(1), await store.unclean_marks(1)) == ({}, {})
        with pytest.raises(UnknownQueue):
            await store.unclean_marks(2)


@pytest.mark.parametrize("kind", ["rocketmq"])
async def test_rocketmq_refuses_above_the_brokers_max_message_size_without_sending(
    kind: str, config: StoreConfig
) -> None:
    """A gateway configured for larger messages than the brokers take refuses them itself:
    the broker would take the whole request into its direct memory before refusing it."""
    broker_max = 32 << 20  # `mqgw rocketmq up`'s maxMessageSize
    async with open_store(kind, replace(config, max_record_bytes=128 << 20)) as store:
        assert store.max_record_bytes == broker_max
        await store.create_queue(1, 1)
        with pytest.raises(RecordTooLarge) as raised:
            await store.append([rec(b"fine", (1, 0)), rec(b"x" * broker_max, (1, 0))])
        assert raised.value.max_bytes == broker_max
        assert (await store.queue_stats(1)).partitions[0].max_offset == 0  # nothing sent
