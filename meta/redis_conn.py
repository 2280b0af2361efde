"""The Redis client of the metadata store and its one retry policy.

Every store call goes through ``RedisConnection.run``: an attempt that cannot reach Redis
(refused, reset, timed out, or Redis still loading its data after a restart) is tried again
with a short, growing backoff until ``unavailable_timeout_s`` has passed since the call
began; then ``MetadataUnavailable`` says where Redis was expected. redis-py's own retries
are switched off so that this bound is the only one. A transaction that lost a WATCH race
is tried again at once (with a little jitter once it keeps losing), within the same bound.
Nothing here is per store instance state beyond the pool, so when Redis comes back the
next call simply reconnects.

redis.asyncio runs on asyncio only: ``require_asyncio`` turns a call from trio into a
clear error instead of a confusing one deep inside the client (docs/metadata.md).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import sniffio
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from meta.errors import MetadataUnavailable
from meta.redis_replicated import NotReplicated, Replicated
from meta.redis_url import async_client, describe, parse_sentinel_url

log = logging.getLogger("mqgw.meta")
T = TypeVar("T")
DEFAULT_UNAVAILABLE_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64
_BACKOFF_FIRST_S = 0.02
_BACKOFF_MAX_S = 0.5
# BusyLoadingError (Redis replaying its AOF after a restart) is a ConnectionError.
UNREACHABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    TimeoutError,
    OSError,
)


def closed_transport(error: RuntimeError) -> bool:
    """uvloop's answer to a write on a socket that Redis closed meanwhile: in effect a
    ConnectionError (redis-py lets it through when the server goes away mid-connect)."""
    return "handler is closed" in str(error)


def text(value: str | bytes) -> str:
    """A reply as str (the client decodes replies; its types do not know that)."""
    return value if isinstance(value, str) else value.decode()


class AsyncioRequired(RuntimeError):
    """The Redis metadata store was used from an event loop other than asyncio."""


def require_asyncio() -> None:
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return  # not in an event loop yet (construction): checked again on each call
    if library != "asyncio":
        raise AsyncioRequired(
            f"the Redis metadata store runs on asyncio only (redis.asyncio), not {library}: "
            "run a gateway with --meta redis://... on the asyncio backend (docs/metadata.md)"
        )


class RedisConnection:
    def __init__(self, url: str, unavailable_timeout_s: float = DEFAULT_UNAVAILABLE_TIMEOUT_S):
        if unavailable_timeout_s <= 0:
            raise ValueError("unavailable_timeout_s must be positive")
        self.unavailable_timeout_s = unavailable_timeout_s
        # A blocking pool: a burst of calls (a gateway's clients all declaring at start)
        # queues for a connection, inside the call's bound, instead of failing with "too
        # many connections" or opening thousands of sockets.
        # A single Redis or the master Sentinel names (meta/redis_url.py).
        self.client: Redis = async_client(
            url,
            max_connections=MAX_CONNECTIONS,
            connect_timeout_s=min(1.0, unavailable_timeout_s),
            # Above the change feed's blocking read (meta.redis_feed.BLOCK_MS).
            socket_timeout_s=max(3.0, unavailable_timeout_s),
            retry=Retry(NoBackoff(), 0),
        )
        self.where = describe(url)
        target = parse_sentinel_url(url)
        # With Sentinel, metadata changes wait until a failover cannot lose them.
        self.replicated: Replicated | None = None
        if target is not None:
            timeout_s = min(1.0, unavailable_timeout_s)
            self.replicated = Replicated.for_target(self.client, target, timeout_s)
        self.conflicts = 0  # WATCH races lost, in total (a contention figure for metrics)

    async def run(self, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation`` retried within the bound; a MetaError from it passes through."""
        require_asyncio()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.unavailable_timeout_s
        backoff_s = _BACKOFF_FIRST_S
        conflicts = 0
        last_error: BaseException | None = None
        while True:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise self._unavailable(last_error, conflicts)
            try:
                async with asyncio.timeout(remaining_s):
                    return await operation()
            except redis_errors.WatchError as error:
                if isinstance(error.__context__, UNREACHABLE):  # the link died mid-transaction
                    last_error = error.__context__
                else:  # another writer changed what this attempt read: its decision is stale
                    conflicts += 1
                    self.conflicts += 1
                    last_error = error
                    if conflicts > 3:  # desynchronise writers that keep colliding
                        await asyncio.sleep(random.uniform(0, 0.002 * min(conflicts, 20)))
                    continue
            except (*UNREACHABLE, NotReplicated) as error:
                # The bound cutting a replication wait short says no more than its answer.
                if not (isinstance(last_error, NotReplicated) and isinstance(error, TimeoutError)):
                    last_error = error
            except RuntimeError as error:
                if not closed_transport(error):
                    raise
                last_error = error
            await asyncio.sleep(max(0.0, min(backoff_s, deadline - loop.time())))
            backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)

    def _unavailable(self, error: BaseException | None, conflicts: int) -> MetadataUnavailable:
        bound = f"{self.unavailable_timeout_s:g} s"
        if isinstance(error, redis_errors.WatchError):
            return MetadataUnavailable(
                f"metadata store at {self.where}: the change conflicted with other writers "
                f"{conflicts} times in {bound}"
            )
        if isinstance(error, NotReplicated):
            return MetadataUnavailable(
                f"metadata store at {self.where}: {error} (waited {bound}); try again"
            )
        reason = type(error).__name__ if error is not None else "no answer"
        if error is not None and str(error):
            reason += f": {error}"
        return MetadataUnavailable(
            f"metadata store unavailable: Redis is unreachable at {self.where} "
            f"(gave up after {bound}; {reason})"
        )

    async def close(self) -> None:
        await self.client.aclose()
        if self.replicated is not None:
            await self.replicated.close()
