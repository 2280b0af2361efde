"""The other side of the contract on Redis: what a broker and a gateway call.

- A broker calls ``heartbeat`` every ``heartbeat_interval_ms`` with its ``ReplicaReport``
  (and, as master, its ``LagReport``); the answer is the group record, which is the only
  source of its role (meta/groups/contract.py says what it must do with it).
- A gateway reads ``record`` and follows ``changes`` (the ``group-changes`` stream) to find
  each group's master; after a gap (the stream trimmed, Redis restarted) it reads the
  records again.
- ``request_switchover`` asks the leading controller for a planned switchover (`mqgw ctl
  switchover` is meant to call it).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from meta.errors import MetadataUnavailable
from meta.groups import scripts
from meta.groups.keys import ControllerKeys
from meta.groups.records import (
    GroupRecord,
    LagReport,
    ReplicaReport,
    heartbeat_fields,
    parse_record,
)
from meta.redis_url import async_client

SWITCHOVER_REQUEST_TTL_MS = 30_000


def _flat(flat: list[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


class GroupLink:
    """Over a ``redis.asyncio.Redis`` made with ``decode_responses=True``."""

    def __init__(self, client: Redis, keys: ControllerKeys | None = None) -> None:
        self.client = client
        self.keys = keys or ControllerKeys()
        self._heartbeat = client.register_script(scripts.HEARTBEAT)

    async def heartbeat(
        self, report: ReplicaReport, lag: LagReport | None
    ) -> tuple[int, GroupRecord]:
        """Store the heartbeat (unless a newer one is stored) and answer (Redis time in ms,
        the group record). Standing counts from when the call was *sent*, not answered."""
        keys, group = self.keys, report.group
        fields = heartbeat_fields(report, lag)
        seq = fields.pop("seq")
        pairs = [item for pair in fields.items() for item in pair]
        now_ms, flat = await self._heartbeat(
            keys=[keys.replica(group, report.broker_id), keys.record(group),
                  keys.members(group), keys.groups],
            args=[group, report.broker_id, seq, *pairs],
        )  # fmt: skip
        return int(now_ms), parse_record(group, _flat(flat))

    async def replicated_groups(self) -> list[str]:
        """Every broker group run by a controller (its brokers heartbeat here), by name;
        groups without replication only register, and are not listed. MetadataUnavailable
        when Redis cannot be reached."""
        try:
            found = []
            for group in sorted(str(g) for g in await self.client.smembers(self.keys.groups)):
                if await self.client.scard(self.keys.members(group)):  # brokers heartbeat
                    found.append(group)
        except (RedisError, OSError) as error:
            raise MetadataUnavailable(f"Redis unreachable: {error}") from error
        return found

    async def close(self) -> None:
        await self.client.aclose()

    async def record(self, group: str) -> GroupRecord:
        found: dict[Any, Any] = await self.client.hgetall(self.keys.record(group))
        return parse_record(group, {str(k): str(v) for k, v in found.items()})

    async def request_switchover(self, group: str, target: str = "") -> str:
        request_id = uuid.uuid4().hex
        value = json.dumps({"id": request_id, "target": target})
        await self.client.set(self.keys.switchover(group), value, px=SWITCHOVER_REQUEST_TTL_MS)
        await self.client.sadd(self.keys.groups, group)
        return request_id

    async def changes(
        self, after_id: str = "0-0", block_ms: int | None = None, count: int = 512
    ) -> list[tuple[str, dict[str, str]]]:
        """Entries of the ``group-changes`` stream after ``after_id``."""
        read: Any = await self.client.xread(
            {self.keys.changes: after_id}, count=count, block=block_ms
        )
        if not read:
            return []
        return [(str(entry_id), dict(fields)) for entry_id, fields in read[0][1]]


def open_group_link(url: str) -> GroupLink:
    """A GroupLink over its own connection to ``url``, with short timeouts (a look at the
    registry must not hang); ``close()`` it when done."""
    return GroupLink(async_client(url, connect_timeout_s=1.0, socket_timeout_s=2.0))
