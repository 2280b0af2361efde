"""The node's resource check: a store that falls behind blocks publishers, then unblocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from gateway.config.settings import GatewaySettings
from gateway.node import Node
from tests.harness.stub_session import StubSession


class StubStore:
    def __init__(self) -> None:
        self.backlog = 0

    async def backlog_bytes(self) -> int:
        return self.backlog


def test_store_backlog_blocks_and_unblocks_every_connection(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[bool, str]]:
        settings = GatewaySettings(
            data_dir=tmp_path, min_free_disk_bytes=0, store_backlog_limit_bytes=1000
        )
        store: Any = StubStore()
        node = Node(settings, store, meta=None)  # type: ignore[arg-type]
        session: Any = StubSession()
        node.sessions.add(session)
        for backlog in (10, 5000, 600, 200, 0):
            store.backlog = backlog
            await node.check_resources()
        return session.notices

    # Blocked past 1000 bytes; 600 is still above the clear mark (250); 200 clears it.
    assert anyio.run(scenario) == [(True, "store is behind"), (False, "store is behind")]


def test_low_disk_is_the_reason_when_both_alarms_are_on(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[bool, str]]:
        settings = GatewaySettings(data_dir=tmp_path, min_free_disk_bytes=2**62)
        store: Any = StubStore()
        store.backlog = 2**40
        node = Node(settings, store, meta=None)  # type: ignore[arg-type]
        session: Any = StubSession()
        node.sessions.add(session)
        await node.check_resources()
        return session.notices

    assert anyio.run(scenario) == [(True, "low on disk")]
