"""Waiting for a condition instead of sleeping (nats-server's checkFor): the one sync and
the one async poller every test uses. Both fail with what they waited for and the last
error the probe raised."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from bench.servers import check_for

T = TypeVar("T")

__all__ = ["check_for", "eventually"]


async def eventually(
    timeout_s: float,
    probe: Callable[[], T | Awaitable[T | None] | None],
    what: str = "condition",
    retry_on: tuple[type[Exception], ...] = (),
    interval_s: float = 0.02,
) -> tuple[T, float]:
    """Call ``probe`` (sync or async) until it returns something truthy; that value and the
    seconds it took. Exceptions of ``retry_on`` count as "not yet"."""
    started = time.monotonic()
    last: Exception | None = None
    while True:
        try:
            value = probe()
            if isinstance(value, Awaitable):
                value = await value
            if value:
                return value, time.monotonic() - started
        except retry_on as error:
            last = error
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s} s (last error: {last})")
        await anyio.sleep(interval_s)
