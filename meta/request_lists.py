"""Requests from one gateway to another over Redis lists, and their answers.

The asker RPUSHes a request onto the target's list and waits (BLPOP) on a list named for
the request for its one answer; the target takes its requests with BLPOP (then the rest at
once) and answers with RPUSH. Every list expires ``KEEP_MS`` after its last write, so nothing
piles up for a gateway that is gone. Used by lease hand-overs (meta.redis_cluster) and by
the cluster views' actions (meta.cluster_views)."""

from __future__ import annotations

from meta.redis_conn import RedisConnection, text

KEEP_MS = 10_000
TAKE_AT_ONCE = 100


async def push(conn: RedisConnection, key: str, value: str) -> None:
    """Append ``value`` to list ``key`` and keep the list ``KEEP_MS`` from now."""

    async def send() -> None:
        async with conn.client.pipeline(transaction=True) as pipe:
            pipe.rpush(key, value)
            pipe.pexpire(key, KEEP_MS)
            await pipe.execute()

    await conn.run(send)


async def ask(
    conn: RedisConnection, requests_key: str, answer_key: str, request: str, wait_s: float
) -> str | None:
    """Send ``request``; its answer, or None if none came within ``wait_s``."""

    async def wait() -> str | None:
        reply = await conn.client.blpop([answer_key], timeout=wait_s)
        return None if reply is None else text(reply[1])

    await push(conn, requests_key, request)
    return await conn.run(wait)


async def take(conn: RedisConnection, key: str, wait_s: float) -> list[str]:
    """The requests on list ``key``, waiting up to ``wait_s`` for the first."""

    async def read() -> list[str]:
        first = await conn.client.blpop([key], timeout=wait_s)
        if first is None:
            return []
        rest = await conn.client.lpop(key, TAKE_AT_ONCE)  # None when there are no more
        more = rest if isinstance(rest, list) else []
        return [text(first[1]), *(text(r) for r in more)]

    return await conn.run(read)
