"""Following the Redis store's change feed (the ``<prefix>changes`` stream).

Each turn reads, in one MULTI/EXEC so the three agree, the server's run id (INFO server),
the stream's bounds (XINFO STREAM) and the entries after the last id seen (XREAD). From
that snapshot:
- a run id other than the previous turn's: Redis restarted. Its AOF may have lost the last
  second of writes, so followers reload (``Reload``) rather than trust their cache.
- a last id seen beyond the stream's last generated id: the stream lost entries (restart
  without persistence, FLUSHALL): reload.
- a last id seen before the first entry after entries were trimmed (XADD MAXLEN ~): the
  follower fell too far behind: reload. (When exactly the entries up to the last id seen
  were trimmed this reloads needlessly; it cannot tell, and a reload is always safe.)
- otherwise the entries are yielded; with none, a blocking XREAD waits for the next one
  (up to BLOCK_MS) and the turn starts again.
After a Reload, following goes on from the snapshot's last id. Redis unreachable does not
end the iteration: it retries (backoff up to 1 s) until Redis answers, and the run-id check
then decides whether a reload is needed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from redis import exceptions as redis_errors

from meta.change_feed import Change, ChangeEvent, Reload
from meta.redis_conn import UNREACHABLE, RedisConnection, closed_transport, require_asyncio

log = logging.getLogger("mqgw.meta")
BLOCK_MS = 1000  # below the client's socket timeout (meta.redis_conn)
BATCH = 512
NO_ENTRY = "0-0"


def parse_id(entry_id: str) -> tuple[int, int] | None:
    milliseconds, _, sequence = entry_id.partition("-")
    try:
        return int(milliseconds), int(sequence or 0)
    except ValueError:
        return None


@dataclass(frozen=True)
class Snapshot:
    run_id: str
    exists: bool
    last_id: str  # last generated id ("0-0": no stream)
    first_id: str | None  # first entry still in the stream
    trimmed: bool  # some entries were removed (entries-added > length)
    entries: list[tuple[str, dict[str, str]]]

    def gap(self, position: str) -> str | None:
        seen = parse_id(position)
        if seen is None:
            return f"unreadable change id {position!r}"
        if not self.exists:
            return None if seen == (0, 0) else "the change feed stream is gone"
        last = parse_id(self.last_id)
        if last is not None and seen > last:
            return "the change feed is behind the last id seen (Redis lost data)"
        first = parse_id(self.first_id) if self.first_id else None
        if self.trimmed and first is not None and seen < first:
            return "changes after the last id seen were trimmed from the feed"
        return None


async def read_snapshot(conn: RedisConnection, stream: str, position: str) -> Snapshot:
    async with conn.client.pipeline(transaction=True) as pipe:
        pipe.info("server")
        pipe.xinfo_stream(stream)
        pipe.xread({stream: position}, count=BATCH)
        info, stream_info, read = await pipe.execute(raise_on_error=False)
    for reply in (info, read):
        if isinstance(reply, Exception):
            raise reply
    run_id = str(info["run_id"])
    if isinstance(stream_info, redis_errors.ResponseError):
        return Snapshot(run_id, False, NO_ENTRY, None, False, [])
    if isinstance(stream_info, Exception):
        raise stream_info
    first = stream_info.get("first-entry")
    return Snapshot(
        run_id=run_id,
        exists=True,
        last_id=str(stream_info["last-generated-id"]),
        first_id=str(first[0]) if first else None,
        trimmed=int(stream_info["entries-added"]) > int(stream_info["length"]),
        entries=_entries(read),
    )


def _entries(read: Any) -> list[tuple[str, dict[str, str]]]:
    """XREAD's reply ([[stream, [(id, fields), ...]]] in RESP2; nil when nothing)."""
    if not read:
        return []
    return [(str(entry_id), fields) for entry_id, fields in read[0][1]]


async def current_position(conn: RedisConnection, stream: str) -> str:
    try:
        stream_info = await conn.client.xinfo_stream(stream)
    except redis_errors.ResponseError:  # no stream yet: everything is after 0-0
        return NO_ENTRY
    return str(stream_info["last-generated-id"])


async def follow_changes(
    conn: RedisConnection, stream: str, last_id: str | None
) -> AsyncGenerator[ChangeEvent, None]:
    require_asyncio()
    position = (
        last_id if last_id is not None else await conn.run(lambda: current_position(conn, stream))
    )
    if parse_id(position) is None:  # not from this feed: nothing to resume from
        position = await conn.run(lambda: current_position(conn, stream))
        yield Reload(f"unreadable change id {last_id!r}", position)
    run_id: str | None = None
    backoff_s = 0.02
    unreachable_since: float | None = None
    loop = asyncio.get_running_loop()
    while True:
        try:
            snapshot = await read_snapshot(conn, stream, position)
        except (*UNREACHABLE, RuntimeError) as error:
            if isinstance(error, RuntimeError) and not closed_transport(error):
                raise
            if unreachable_since is None:
                unreachable_since = loop.time()
                log.warning(
                    "change feed: Redis unreachable at %s (%s); retrying", conn.where, error
                )
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 1.0)
            continue
        if unreachable_since is not None:
            log.info("change feed: Redis at %s answers again", conn.where)
            unreachable_since, backoff_s = None, 0.02
        restarted = run_id is not None and snapshot.run_id != run_id
        run_id = snapshot.run_id
        reason = "Redis restarted (new run id)" if restarted else snapshot.gap(position)
        if reason is not None:
            position = snapshot.last_id
            yield Reload(reason, position)
            continue
        for entry_id, fields in snapshot.entries:
            position = entry_id
            yield Change.from_fields(entry_id, fields)
        if snapshot.entries:
            continue
        try:  # wait for the next entry; the next turn reads it with the checks above
            await conn.client.xread({stream: position}, count=1, block=BLOCK_MS)
        except UNREACHABLE:
            continue
        except RuntimeError as error:
            if not closed_transport(error):
                raise
