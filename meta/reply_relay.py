"""The Redis side of direct reply-to across gateways (gateway/cluster/replies.py packs,
relays and delivers the replies).

Each gateway, named by its reply tag (the part of a reply key before the dot), reads one
list, ``<prefix>replies:<tag>``, while it keeps ``<prefix>replies-live:<tag>`` (a key with
a TTL, renewed by its reader and deleted at a clean stop). A sender pushes whole batches
of replies, one list element per batch, every destination in one pipeline; the push is a
Lua script that checks the destination's live key first, so the sender learns in the same
round trip which destinations are gone (their mandatory replies come back 312). A list
expires ``INBOX_KEEP_MS`` after its last push: nothing of a gateway gone lingers.

Batches are binary; they travel as base64 text because the metadata client decodes every
reply as UTF-8.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from redis.exceptions import ResponseError

from meta.errors import MetadataUnavailable
from meta.redis_conn import text
from meta.redis_store import RedisMetadataStore

# KEYS: the destination's live key, its inbox; ARGV: inbox keep ms, batch, batch, ...
# Answers 1 (pushed) or 0 (that gateway does not read its inbox: nothing pushed).
_PUSH = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 2, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
"""
T = TypeVar("T")
INBOX_KEEP_MS = 30_000
TAKE_AT_ONCE = 100  # list elements (batches) read at once after the first


class ReplyInboxes:
    """The relayed-reply inboxes of one cluster's gateways, over the metadata store's Redis."""

    def __init__(self, store: RedisMetadataStore) -> None:
        self._conn = store._conn
        self._keys = store._keys
        self._push = self._conn.client.register_script(_PUSH)

    async def push(self, batches: Mapping[str, Sequence[bytes]]) -> set[str]:
        """Push each destination tag's batches in one pipeline; the tags that were not
        pushed to because that gateway does not read its inbox. Raises
        MetadataUnavailable when Redis cannot be reached."""
        tags = list(batches)

        async def push() -> list[int]:
            async with self._conn.client.pipeline(transaction=False) as pipe:
                for tag in tags:
                    keys = [self._keys.reply_live(tag), self._keys.reply_inbox(tag)]
                    args: list[str | int] = [INBOX_KEEP_MS]
                    args += [base64.b64encode(batch).decode() for batch in batches[tag]]
                    await self._push(keys=keys, args=args, client=pipe)
                return [int(answer) for answer in await pipe.execute()]

        answers = await self._run(push)
        return {tag for tag, pushed in zip(tags, answers, strict=True) if not pushed}

    async def take(self, tag: str, wait_s: float, live_ms: int) -> list[bytes]:
        """Renew this gateway's live key for ``live_ms`` (0: not now), then the batches in
        its inbox, waiting up to ``wait_s`` for the first. Raises MetadataUnavailable when
        Redis cannot be reached."""
        live, inbox = self._keys.reply_live(tag), self._keys.reply_inbox(tag)

        async def take() -> list[str]:
            if live_ms:
                await self._conn.client.set(live, "1", px=live_ms)
            first = await self._conn.client.blpop([inbox], timeout=wait_s)
            if first is None:
                return []
            rest = await self._conn.client.lpop(inbox, TAKE_AT_ONCE)  # None: no more
            more = rest if isinstance(rest, list) else []
            return [text(first[1]), *(text(r) for r in more)]

        return [base64.b64decode(item) for item in await self._run(take)]

    async def leave(self, tag: str) -> None:
        """A clean stop: replies to this gateway are refused at once from now on."""
        await self._run(lambda: self._conn.client.delete(self._keys.reply_live(tag)))

    async def _run(self, operation: Callable[[], Awaitable[T]]) -> T:
        """The store's retry policy; an error answer (Redis out of memory, a key of the
        wrong type) counts as Redis unavailable too: the relay drops, it does not crash."""
        try:
            return await self._conn.run(operation)
        except ResponseError as error:
            raise MetadataUnavailable(f"metadata store at {self._conn.where}: {error}") from None
