"""A master confirms an append only in the term it was asked in (found by the nemesis run,
seed 7: a master cut off from Redis and its in-sync slave stepped down at the heal, cut its
log back to follow the new master and took that master's confirm offset; a gateway's wait
for two appends the new master never had then returned, and the two confirmed messages were
lost)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from meta.groups.records import GroupRecord
from storage import Record
from storage.errors import NotMaster
from tests.replication.replicated import replicated_store

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def test_a_wait_across_a_step_down_is_refused_not_answered(tmp_path: Path) -> None:
    async with replicated_store(tmp_path, "0") as store:
        inner = store.inner
        store.become_master(GroupRecord("g1", epoch=1, master="0", in_sync=frozenset("01")))
        await inner.create_queue(1, 1)
        result = await inner.append([Record(b"", b"q", b"", b"m", ((1, 0),))])
        outcome: list[object] = []

        async def wait() -> None:
            try:
                await store.wait_durable(result.end_offset)
                outcome.append("confirmed")
            except NotMaster as refusal:
                outcome.append(refusal)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait)
            await anyio.sleep(0.05)
            assert outcome == []  # the slave has not acknowledged: no confirm
            # The heal: another master at epoch 2; this one follows it and takes its confirm
            # offset, far past this append's end in a log that no longer holds it.
            store.become_slave(2)
            store.confirmed = result.end_offset + 1000
        assert len(outcome) == 1 and isinstance(outcome[0], NotMaster)
        with pytest.raises(NotMaster):  # a slave answers no wait, whatever its offsets
            await store.wait_durable(result.end_offset)
