"""The StorePort contract, continued: fencing tokens on offsets (delivery leases), over every
implementation (embedded, remote, routed, rocketmq; asyncio and trio), as in
test_store_contract.py."""

from __future__ import annotations

import pytest

from storage import QUEUE_GROUP, StoreConfig, UnknownQueue
from storage.errors import StaleFence
from tests.storage.test_store_contract import (
    _rocketmq_when_needed,
    config,
    fill,
    kind,
    member_configs,
    open_store,
)

__all__ = ["_rocketmq_when_needed", "config", "kind"]  # the contract suite's fixtures

pytestmark = [
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.anyio,
]


async def test_a_higher_fence_shuts_out_a_lower_one(kind: str, config: StoreConfig) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 2)
        await fill(store, 1, 10)
        await store.commit_offset(QUEUE_GROUP, 1, 0, 2, fence=5)  # holder with token 5
        # A new holder (token 6) takes over: its read of the committed offset registers it.
        assert await store.committed_offset(QUEUE_GROUP, 1, 0, fence=6) == 2
        with pytest.raises(StaleFence) as refused:  # the old holder's late commit
            await store.commit_offset(QUEUE_GROUP, 1, 0, 9, fence=5)
        assert "token 6" in str(refused.value)
        with pytest.raises(StaleFence):  # nor may it read as a holder
            await store.committed_offset(QUEUE_GROUP, 1, 0, fence=5)
        assert await store.committed_offset(QUEUE_GROUP, 1, 0) == 2  # nothing moved
        await store.commit_offset(QUEUE_GROUP, 1, 0, 4, fence=6)  # the holder's own: fine
        await store.commit_offset(QUEUE_GROUP, 1, 0, 5, fence=7)  # a higher one: registered
        with pytest.raises(StaleFence):
            await store.commit_offset(QUEUE_GROUP, 1, 0, 6, fence=6)
        await store.commit_offset(QUEUE_GROUP, 1, 0, 6)  # unfenced (embedded use): admitted
        assert await store.committed_offset(QUEUE_GROUP, 1, 0) == 6
        # Per (group, queue, partition): another partition or group has its own tokens.
        await store.commit_offset(QUEUE_GROUP, 1, 1, 0, fence=1)
        await store.commit_offset("other", 1, 0, 1, fence=1)
        with pytest.raises(UnknownQueue):
            await store.commit_offset(QUEUE_GROUP, 9, 0, 1, fence=1)


async def test_a_replaced_holder_reads_nothing_more(kind: str, config: StoreConfig) -> None:
    """A read carrying a fencing token is refused once a higher one holds the partition in
    the queue's own group: a gateway whose lease was taken over reads nothing more to
    deliver (and so cannot deliver, unflagged, what the new holder delivers too)."""
    async with open_store(kind, config) as store:
        await store.create_queue(1, 2)
        await fill(store, 1, 10)
        assert await store.committed_offset(QUEUE_GROUP, 1, 0, fence=5) == 0
        held = await store.read(1, 0, 0, 100, fence=5)
        assert held.messages  # the holder reads
        assert await store.committed_offset(QUEUE_GROUP, 1, 0, fence=6) == 0  # taken over
        with pytest.raises(StaleFence) as refused:
            await store.read(1, 0, 0, 100, fence=5)
        assert "6" in str(refused.value)  # names the token that holds it
        assert (await store.read(1, 0, 0, 100, fence=6)).messages == held.messages
        assert (await store.read(1, 0, 0, 100)).messages == held.messages  # unfenced reader
        # The token is the queue's own group's, per partition: another partition is free.
        assert (await store.read(1, 1, 0, 100, fence=1)).status is not None
        await store.commit_offset("other", 1, 0, 0, fence=9)
        assert (await store.read(1, 0, 0, 100, fence=6)).messages == held.messages


async def test_fences_survive_a_restart_and_go_with_the_queue(
    kind: str, config: StoreConfig
) -> None:
    async with open_store(kind, config) as store:
        await store.create_queue(1, 1)
        await store.create_queue(2, 1)
        await fill(store, 1, 3)
        await store.committed_offset(QUEUE_GROUP, 1, 0, fence=8)
        await store.committed_offset(QUEUE_GROUP, 2, 0, fence=8)
    for member in member_configs(kind, config) if kind != "rocketmq" else []:  # (its broker's)
        offsets = (member.data_dir / "offsets.json").read_text()
        assert '"fences"' in offsets or kind == "routed"
    async with open_store(kind, config) as store:
        with pytest.raises(StaleFence):
            await store.commit_offset(QUEUE_GROUP, 1, 0, 3, fence=7)
        await store.commit_offset(QUEUE_GROUP, 1, 0, 3, fence=8)
        await store.delete_queue(2)  # its tokens go with it
        await store.create_queue(2, 1)
        await store.commit_offset(QUEUE_GROUP, 2, 0, 0, fence=1)
