"""The StorePort contract, continued: the delivering gateway's progress reports (carried by
offset commits) and the ready counts built from them, over every implementation (embedded,
remote, routed; asyncio and trio), as in test_store_contract.py."""

from __future__ import annotations

import pytest

from storage import QUEUE_GROUP, DeliveryProgress, StoreConfig
from storage.errors import StaleFence
from tests.storage.test_store_contract import (
    _rocketmq_when_needed,
    config,
    fill,
    kind,
    open_store,
)

__all__ = ["_rocketmq_when_needed", "config", "kind"]  # the contract suite's fixtures

pytestmark = [
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.anyio,
]


async def test_ready_counts_from_the_delivering_gateways_report(
    kind: str, config: StoreConfig
) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 2)
        await fill(store, 1, 10, partition=0)
        await fill(store, 1, 4, partition=1)
        # No report yet: everything after the committed offset is ready (unacked included).
        await store.commit_offset(QUEUE_GROUP, 1, 0, 2, fence=3)
        assert (await store.queue_stats(1)).ready == 8 + 4
        # Handed out up to 7 (2..6 unacked), one of them requeued, 3 consumers with credit.
        await store.commit_offset(QUEUE_GROUP, 1, 0, 2, 3, DeliveryProgress(7, 1, 3))
        stats = await store.queue_stats(1)
        part = stats.partitions[0]
        assert (part.committed, part.next_offset, part.ready_behind, part.takers) == (2, 7, 1, 3)
        assert part.ready == 3 + 1
        assert stats.ready == 4 + 4  # partition 1 has no report: after its committed offset
        # Another group's stats know nothing of the queue group's report.
        assert (await store.queue_stats(1, "other")).partitions[0].next_offset == -1
        # A commit without a report keeps the last one.
        await store.commit_offset(QUEUE_GROUP, 1, 0, 3, 3)
        assert (await store.queue_stats(1)).partitions[0].next_offset == 7


async def test_a_report_goes_with_its_holder_and_with_purge(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        await fill(store, 1, 10)
        await store.commit_offset(QUEUE_GROUP, 1, 0, 2, 5, DeliveryProgress(8, 0, 1))
        assert (await store.queue_stats(1)).ready == 2
        # A new holder takes over (higher token): the old report no longer says anything.
        assert await store.committed_offset(QUEUE_GROUP, 1, 0, fence=6) == 2
        assert (await store.queue_stats(1)).partitions[0].next_offset == -1
        assert (await store.queue_stats(1)).ready == 8
        with pytest.raises(StaleFence):  # nor can the replaced holder report again
            await store.commit_offset(QUEUE_GROUP, 1, 0, 2, 5, DeliveryProgress(9, 0, 1))
        assert (await store.queue_stats(1)).partitions[0].next_offset == -1
        await store.commit_offset(QUEUE_GROUP, 1, 0, 2, 6, DeliveryProgress(4, 2, 0))
        assert (await store.queue_stats(1)).ready == 6 + 2
        assert await store.purge(1) == 8  # the ready ones, not the delivered ones
        after = (await store.queue_stats(1)).partitions[0]
        assert (after.next_offset, after.ready) == (-1, 0)
        await fill(store, 1, 3)
        assert (await store.queue_stats(1)).ready == 3
