"""`mqgw controller`: the loop around the decision step.

Every ``tick_ms``: read one snapshot of Redis, feed its events to ``decide.step``, carry out
the actions in order (lease first, then each group's write), log what changed. Decisions
are made only on a fresh snapshot and one write per group per tick, so a write refused
(the record moved on) is simply decided again on the next read. Redis unreachable: nothing
is decided (nothing could be written), the lease lapses by itself, and the loop keeps trying.

On stop (SIGTERM, SIGINT) the lease is given up, so another controller leads at its next
tick instead of after the lease time.

With Sentinel, decisions are written only on a Redis that a majority of the sentinels name
as the master and hold up (``Replicated.sentinels_follow``): an old master cut off and healed
takes writes until the sentinels demote it, and brokers that still reach it would follow an
election written there while the promoted replica's controller elects another broker at the
same epoch (nemesis seed 140).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from controller.actions import (
    Action,
    Demote,
    Elect,
    HoldLease,
    MarkDown,
    ResumeConfirming,
    SetInSync,
    StopConfirming,
    Stuck,
    Write,
    WriteResult,
)
from controller.apply import RedisApply
from controller.decide import ControllerState, step
from controller.events import GroupRead
from controller.snapshot import Observer
from meta.groups.keys import ControllerKeys
from meta.groups.timing import ControllerConfig
from meta.redis_replicated import Replicated
from meta.redis_url import async_client, parse_sentinel_url

log = logging.getLogger("mqgw.controller")
UNREACHABLE = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


def _ids(ids: frozenset[str]) -> str:
    return "{" + ", ".join(sorted(ids)) + "}"


def describe(action: Write, result: WriteResult) -> str:
    """One log line per write that landed."""
    record = result.record
    assert record is not None
    group = f"group {action.group}"
    match action:
        case Elect():
            return (
                f"{group}: {action.master} elected master at epoch {record.epoch} "
                f"({action.reason}); in sync {_ids(record.in_sync)}"
            )
        case SetInSync():
            return f"{group}: in sync {_ids(record.in_sync)} ({action.reason})"
        case StopConfirming():
            return f"{group}: switchover to {action.target}: {record.master} stops confirming"
        case ResumeConfirming():
            return f"{group}: switchover called off ({action.reason}): {record.master} confirms"
        case MarkDown():
            return f"{group}: down {_ids(record.down)}"
    raise AssertionError(action)


# Whether the sentinels follow the Redis with this run id as their master (None: no Sentinel).
SentinelsFollow = Callable[[str], Awaitable[bool]]


class ControllerService:
    def __init__(
        self,
        client: Redis,
        name: str,
        config: ControllerConfig,
        keys: ControllerKeys,
        sentinels_follow: SentinelsFollow | None = None,
    ) -> None:
        self.name, self.config = name, config
        self.apply = RedisApply(client, keys, name, config)
        self.state = ControllerState(config)
        self.observer = Observer(self.apply.holder)
        self.leading = False
        self._unreachable = False
        self._sentinels_follow = sentinels_follow
        self._run_id = ""  # of the Redis the last snapshot came from
        self._unfollowed = False  # said once: writes held while the sentinels follow another

    async def run(self, stop: asyncio.Event) -> None:
        log.info("controller %s started (holder %s)", self.name, self.apply.holder)
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                started = loop.time()
                await self.turn()
                delay = self.config.tick_ms / 1000 - (loop.time() - started)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(delay, 0.001))
        finally:
            await self._give_up()

    async def turn(self) -> None:
        """One tick: read, decide, act."""
        try:
            snapshot = await self.apply.read()
            self._run_id = snapshot.run_id
            if self._unreachable:
                log.info("controller %s: Redis answers again", self.name)
                self._unreachable = False
            for action in self.observer.decide(snapshot, self.state):
                await self._carry_out(action)
        except UNREACHABLE as error:
            if not self._unreachable:
                log.warning("controller %s: Redis unreachable (%s): not deciding", self.name, error)
                self._unreachable = True
        except redis_errors.RedisError:
            # A reply it cannot use: say so and go on (the next tick reads afresh) rather
            # than leave the cluster without a controller.
            log.exception("controller %s: Redis call failed", self.name)
        self._log_leadership()

    async def _carry_out(self, action: Action) -> None:
        leader = self.state.leader
        match action:
            case HoldLease():
                step(self.state, await self.apply.hold())
            case Stuck(group, reason):
                log.warning("group %s: %s", group, reason)
            case Demote() if leader is not None:
                if await self.apply.demote(action, leader.token):
                    log.warning(
                        "group %s: %s acts as master at epoch %d, the group is at %d: demoted",
                        action.group, action.broker_id, action.stale_epoch, action.epoch,
                    )  # fmt: skip
            case Elect() | SetInSync() | StopConfirming() | ResumeConfirming() | MarkDown():
                if leader is None or not await self._followed(action):
                    return
                result = await self.apply.write(action, leader.token)
                if result.record is not None:  # decide on it from now, not from the next read
                    step(self.state, GroupRead(result.record))
                    log.info("%s", describe(action, result))
                else:
                    log.info("group %s: %s not written: %s", action.group,
                             type(action).__name__, result.reason)  # fmt: skip

    async def _followed(self, action: Write) -> bool:
        """Whether this Redis is the master the sentinels follow (always, without Sentinel)."""
        if self._sentinels_follow is None:
            return True
        followed = await self._sentinels_follow(self._run_id)
        if not followed and not self._unfollowed:
            log.warning(
                "group %s: %s not written: the sentinels do not follow this Redis (run id %s) "
                "as an up master; holding decisions until they do",
                action.group, type(action).__name__, self._run_id,
            )  # fmt: skip
        elif followed and self._unfollowed:
            log.info("controller %s: the sentinels follow this Redis again", self.name)
        self._unfollowed = not followed
        return followed

    def _log_leadership(self) -> None:
        leading = self.state.leader is not None
        if leading and not self.leading:
            assert self.state.leader is not None
            log.info("controller %s leads (token %d)", self.name, self.state.leader.token)
        elif self.leading and not leading:
            log.warning("controller %s no longer leads", self.name)
        self.leading = leading

    async def _give_up(self) -> None:
        if self.state.leader is None:
            return
        try:
            await self.apply.release()
            log.info("controller %s gave up the lease", self.name)
        except UNREACHABLE as error:
            log.warning("controller %s: could not give up the lease: %s", self.name, error)
        self.state.leader = None


async def serve(url: str, name: str, config: ControllerConfig, stop: asyncio.Event) -> None:
    client: Redis = async_client(url, connect_timeout_s=1.0, socket_timeout_s=2.0)
    target = parse_sentinel_url(url)
    replicated = Replicated.for_target(client, target, 1.0) if target is not None else None
    follow = replicated.sentinels_follow if replicated is not None else None
    try:
        await ControllerService(client, name, config, ControllerKeys(), follow).run(stop)
    finally:
        if replicated is not None:
            await replicated.close()
        await client.aclose()
