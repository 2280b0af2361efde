"""A slave told to follow a master whose log lacks entries it knows were confirmed does not
cut them: it reports itself "diverged" and waits for the controller to elect a broker that
holds them (found by the nemesis run, seed 4: a Sentinel failover lost the in-sync set's last
shrink, an out-of-date replica was elected, and two brokers cut 296 KB of confirmed entries
to follow it; the controller's side is in tests/controller/test_decide.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from storage import Record
from storage.replication.member import ReplicationMember
from storage.wire.replication import Replicated
from tests.replication.replicated import replicated_store

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


class MasterAnswering:
    """A master that answers the epochs request: its term 2 began at ``began``."""

    def __init__(self, began: int) -> None:
        self.began = began

    async def replicate(self, _request: Any) -> Replicated:
        return Replicated({"epochs": [[1, 0], [2, self.began]], "end": self.began + 10}, b"")


async def test_a_slave_will_not_cut_confirmed_entries_to_follow(tmp_path: Path) -> None:
    async with replicated_store(tmp_path, "1") as store:
        inner = store.inner
        await inner.create_queue(1, 1)
        first = await inner.append(
            [Record(b"", b"q", b"", b"m%d" % n, ((1, 0),)) for n in range(5)]
        )
        store.state.epochs = [(1, 0)]
        end = inner.log.commit_log.write_offset
        store.confirmed = end  # all five confirmed at epoch 1
        began = end // 2  # the new master's term began in the middle of them

        @asynccontextmanager
        async def connect(_address: str) -> AsyncIterator[MasterAnswering]:
            yield MasterAnswering(began)

        member = ReplicationMember(store, None, "", connect)  # type: ignore[arg-type]

        async def address(_master: str) -> str:
            return "master:1"

        member._master_address = address  # type: ignore[method-assign]
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(member._follow, "2", 2)
            with anyio.fail_after(5):
                while store.role != "diverged":
                    await anyio.sleep(0.01)
            member._follow_changed.set()  # the controller elects another: it moves on
        assert inner.log.commit_log.write_offset == end  # nothing cut
        assert store.confirmed == end
        assert first.end_offset <= end
        assert len((await inner.read(1, 0, 0)).messages) == 5
