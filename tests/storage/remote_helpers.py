"""Serve a store over the broker protocol inside the test's own event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio

from storage import StoreConfig, StorePort, serve_broker
from storage.broker.server import Ready, serve_store


@asynccontextmanager
async def _serving(
    serve: Callable[[Ready, anyio.Event], Awaitable[None]], stop: anyio.Event | None
) -> AsyncIterator[str]:
    stop = stop or anyio.Event()
    ready = anyio.Event()
    ports: list[int] = []

    def on_ready(host: str, bound: int) -> None:
        ports.append(bound)
        ready.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, on_ready, stop)
        with anyio.fail_after(10):
            await ready.wait()
        try:
            yield f"127.0.0.1:{ports[0]}"
        finally:
            stop.set()


def served(
    store: StorePort, port: int = 0, stop: anyio.Event | None = None
) -> AbstractAsyncContextManager[str]:
    """serve_store (an open store) on 127.0.0.1 (port 0: a free one) until the block ends
    or ``stop`` is set; its address."""

    async def serve(ready: Ready, stop: anyio.Event) -> None:
        await serve_store(store, "127.0.0.1", port, ready, name="test/0", stop=stop)

    return _serving(serve, stop)


def served_broker(config: StoreConfig) -> AbstractAsyncContextManager[str]:
    """serve_broker (opens the store in ``config``) on a free 127.0.0.1 port; its address."""

    async def serve(ready: Ready, stop: anyio.Event) -> None:
        await serve_broker(config, "127.0.0.1", 0, ready, name="test/0", stop=stop)

    return _serving(serve, None)
