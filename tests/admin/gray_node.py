"""A real embedded node in this process with its admin API on a free loopback port, for tests
that check the node's own state (``node.gray``) after HTTP calls: the same Node, stores and
FastAPI app as `mqgw serve`, served by uvicorn on the test's event loop (asyncio)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import uvicorn

from gateway.admin.app import create_app
from gateway.config.settings import GatewaySettings
from gateway.node import Node
from meta.local_store import LocalMetadataStore
from meta.models import User
from meta.password import hash_password
from mqgw_cli.admin_client import admin_call
from storage import FlushPolicy, StoreConfig, open_embedded_store

GUEST = ("guest", "guest")  # the fresh node's administrator
WATCHER = ("watcher", "w")  # tag monitoring only


class AdminNode:
    def __init__(self, node: Node, base: str) -> None:
        self.node = node
        self.base = base

    async def call(
        self, method: str, path: str, body: Any = None, auth: tuple[str, str] | None = GUEST
    ) -> tuple[int, Any]:
        """(status, decoded JSON or None); ``auth`` None sends no credentials; bytes are
        sent as they are."""
        user, password = auth or (None, "")
        return await anyio.to_thread.run_sync(
            lambda: admin_call(self.base, method, path, body, user, password, timeout_s=10)
        )


@asynccontextmanager
async def admin_node(data: Path) -> AsyncIterator[AdminNode]:
    """Started on ``data`` (again: a restart), stopped on leaving."""
    async with open_embedded_store(StoreConfig(data / "store", flush=FlushPolicy.ASYNC)) as store:
        meta = LocalMetadataStore(data / "meta")
        if await meta.get_user(WATCHER[0]) is None:
            password_hash = hash_password(WATCHER[1])
            await meta.put_user(
                User(name=WATCHER[0], password_hash=password_hash, tags=("monitoring",))
            )
        node = Node(GatewaySettings.model_validate({"data_dir": data}), store, meta)
        await node.start()
        config = uvicorn.Config(
            create_app(node), host="127.0.0.1", port=0, log_config=None, lifespan="off"
        )
        server = uvicorn.Server(config)
        sock = config.bind_socket()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.serve, [sock])
                with anyio.fail_after(10):
                    while not server.started:
                        await anyio.sleep(0.01)
                try:
                    yield AdminNode(node, f"http://127.0.0.1:{sock.getsockname()[1]}")
                finally:
                    server.should_exit = True
        finally:
            sock.close()
            await node.shutdown()
            await meta.close()


def recent(set_at: str) -> bool:
    """An ISO 8601 time with its zone, within a minute of now (a server-set ``set_at``)."""
    when = datetime.fromisoformat(set_at.replace("Z", "+00:00"))
    return when.tzinfo is not None and abs((datetime.now(UTC) - when).total_seconds()) < 60
