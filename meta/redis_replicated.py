"""With Redis Sentinel: a metadata change is answered only once a failover cannot lose it.

Redis replicates asynchronously, so a write the master acknowledged may be missing from the
replica a failover promotes. For soft state that is harmless (rewritten within a second), but
a lost queue record, binding or placement strands the messages stored under it
(docs/metadata.md, "What an asynchronous replica can lose"). Every metadata transaction
(declarations, deletions, placements, routes, users, policies) therefore ends with
``Replicated.confirm``:

- the transaction also wrote a key of its own (``<prefix>written:<token>``, for a minute);
  a PEXPIRE of it on one connection, then ``WAIT 1``: the key still there says this master
  has our write (not a replica promoted without it meanwhile), and once a replica has the
  PEXPIRE it has everything written before it, ours included;
- when no replica answers, the write still stands if a majority of the sentinels name this
  very master (its run id), up, and hold every replica of it down or unlinked for longer
  than Sentinel would promote: then no failover can promote a copy without our write (a
  dead replica comes back by syncing from this master first);
- otherwise (the replica cut off from the master but not from the sentinels, or this master
  on the minority side of a split) ``NotReplicated``, which RedisConnection.run retries
  within its bound and then reports as MetadataUnavailable: the client's declaration fails
  and it declares again, rather than being answered for a record a failover would drop.

Reads and the lease, heartbeat and feed scripts do not come here: they carry their own
fencing (epochs, tokens) and are rewritten within a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from meta.errors import MetadataUnavailable
from meta.redis_url import SentinelTarget

WRITTEN_TTL_MS = 60_000  # far above RedisConnection.run's bound on confirming
WAIT_MS = 250  # per attempt; RedisConnection.run repeats attempts within its bound
ALONE_S = 1.0  # how long the sentinels' "no replica could be promoted" is taken as still true
SENTINEL_TIMEOUT_S = 0.5
_DOWN_FLAGS = frozenset({"s_down", "o_down", "disconnected"})


class NotReplicated(Exception):
    """No replica has the write yet and a failover could still promote one without it."""


def _flags(state: Mapping[str, Any]) -> set[str]:
    return set(str(state.get("flags", "")).split(","))


def no_replica_can_be_promoted(
    run_id: str, answers: Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]
) -> bool:
    """Whether every sentinel's answer (its view of the master, its view of the replicas)
    says the master is ``run_id``, up, and has no replica Sentinel would promote. Sentinel
    passes over a replica it holds down, or one whose link to the master has been down
    longer than ten times the master's down-after period (sentinel.c, sentinelSelectSlave);
    any other replica could be chosen, even one linked a moment ago."""
    for master, replicas in answers:
        if master.get("runid") != run_id or _flags(master) & _DOWN_FLAGS:
            return False
        unlinked_for_good_ms = 10 * int(master.get("down-after-milliseconds", 0))
        for replica in replicas:
            down = bool(_flags(replica) & _DOWN_FLAGS)
            link_down_ms = int(replica.get("master-link-down-time", 0))
            if not down and not link_down_ms > unlinked_for_good_ms:
                return False
    return True


def master_followed(
    run_id: str, answers: Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]
) -> bool:
    """Whether every sentinel's answer names ``run_id`` as the master and holds it up."""
    return all(
        master.get("runid") == run_id and not _flags(master) & _DOWN_FLAGS for master, _ in answers
    )


class Replicated:
    def __init__(self, master: Redis, target: SentinelTarget, **options: Any):
        self.master = master
        self.target = target
        self.sentinels = [
            Redis(host=host, port=port, decode_responses=True, protocol=2, **options)
            for host, port in target.sentinels
        ]
        self.unreplicated = 0  # writes that stood on the sentinels' word alone (a metric)
        self._alone_until = 0.0

    @classmethod
    def for_target(
        cls, master: Redis, target: SentinelTarget, connect_timeout_s: float
    ) -> Replicated:
        """One for ``master``, asking the sentinels of ``target`` with its sentinel password."""
        options: dict[str, Any] = {"socket_connect_timeout": connect_timeout_s}
        if target.sentinel_password is not None:
            options["password"] = target.sentinel_password
        return cls(master, target, **options)

    async def confirm(self, written_key: str) -> None:
        """Returns once the transaction that wrote ``written_key`` cannot be lost to a
        failover; NotReplicated while it could; MetadataUnavailable once it was."""
        # While the sentinels last said no replica could be promoted (it is dead), waiting
        # for one would only add WAIT_MS to every change: count the acks there are, at once.
        alone = time.monotonic() < self._alone_until
        async with self.master.pipeline(transaction=False) as pipe:
            pipe.pexpire(written_key, WRITTEN_TTL_MS)
            pipe.execute_command("WAIT", *((0, 0) if alone else (1, WAIT_MS)))
            pipe.info("server")
            present, replicas, server = await pipe.execute()
        if not present:
            raise MetadataUnavailable(
                "metadata store: a Redis failover lost the change just made; make it again"
            )
        if int(replicas) >= 1:
            return
        if await self._sentinels_hold_it_safe(str(server.get("run_id", ""))):
            self.unreplicated += 1
            self._alone_until = time.monotonic() + ALONE_S
            return
        raise NotReplicated(
            "a metadata change reached no Redis replica, and the sentinels do not rule out a "
            "failover to one without it"
        )

    async def sentinels_follow(self, run_id: str) -> bool:
        """Whether a majority of the sentinels answer, each naming ``run_id`` as the master
        and holding it up. A controller elects only on such a Redis: a master cut off and
        healed takes writes until the sentinels demote it, and an election written there
        is read by the brokers that still reach it, while the promoted replica's controller
        elects another master at the same epoch (nemesis seed 140)."""
        answered = await self._majority_views()
        return answered is not None and master_followed(run_id, answered)

    async def _sentinels_hold_it_safe(self, run_id: str) -> bool:
        answered = await self._majority_views()
        return answered is not None and no_replica_can_be_promoted(run_id, answered)

    async def _majority_views(
        self,
    ) -> list[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]] | None:
        """The sentinels' answers if a majority of them answered, else None."""
        views = await asyncio.gather(*(self._view(s) for s in self.sentinels))
        answered = [view for view in views if view is not None]
        # Sentinels the URL does not list still vote: count every one the answers know of.
        known = [int(master.get("num-other-sentinels", 0)) + 1 for master, _ in answered]
        majority = max([len(self.sentinels), *known]) // 2 + 1
        return answered if len(answered) >= majority else None

    async def _view(
        self, sentinel: Redis
    ) -> tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]] | None:
        try:
            async with asyncio.timeout(SENTINEL_TIMEOUT_S):
                master = await sentinel.sentinel_master(self.target.service)
                replicas = await sentinel.sentinel_slaves(self.target.service)
            if not isinstance(master, Mapping):
                return None
        except (RedisError, OSError, TimeoutError):  # not counted: it did not answer
            return None
        return master, replicas

    async def close(self) -> None:
        for sentinel in self.sentinels:
            await sentinel.aclose()
