"""The broker groups a cluster gateway stores messages on, including groups registered after
it started (docs/cluster.md, "Adding a broker group").

Broker registrations are heartbeats, not metadata changes: they never reach the change feed.
So a gateway looks at the registry every ``LOOK_EVERY_S`` (the broker leases in the metadata
store; the controller's group set for replicated groups): a group it has no store for and
that has a live broker gets one, opened the way the groups found at start were (a RemoteStore
to an unreplicated group's first live broker, a GroupStore following a replicated group's
master), and is added to the RoutedStore and the placement. From then on the spreading rule
(fewest partitions first) sends new queues there; queues placed elsewhere stay where they are.

- A group is never taken out of routing: its store reconnects by itself, and its queues work
  again when its brokers return. New queues avoid a group that is not live now (``live``): its
  store has lost its broker or master, or (unreplicated) no broker of it heartbeats.
- A route naming a group this gateway has no store for yet (another gateway saw the group
  first) makes the placement wait for it (``ensure``), a bounded time, when the registry
  shows it live; otherwise the queue's calls fail with BrokerUnavailable until it comes.
- Each added group's store lives in a task of its own (the stores of the start groups live
  in the caller's exit stack), closed when the gateway stops.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
from anyio.abc import TaskGroup

from gateway.cluster.placement import QueuePlacement
from meta.errors import MetadataUnavailable
from meta.groups.link import GroupLink, open_group_link
from meta.redis_store import RedisMetadataStore
from storage import connect_remote_store
from storage.clients.group import connect_group_store
from storage.clients.routed import RoutedStore
from storage.port import StorePort

log = logging.getLogger("mqgw.cluster")

LOOK_EVERY_S = 0.5  # a new group is in use within about this (plus its connection)
ENSURE_WAIT_S = 5.0  # a route naming a live group not connected here yet: wait this long
WARN_EVERY_S = 5.0  # a start that waits says so this often
BROKER_WAIT_S = 30.0  # at start, for a first group; for a replicated group's master
REMOTE_WAIT_S = 10.0  # a RemoteStore's wait for its broker (connect, calls while away)
LOOK_ERRORS = (MetadataUnavailable, OSError)


async def look_up_groups(
    meta: RedisMetadataStore, registry: GroupLink
) -> tuple[dict[str, str | None], set[str]]:
    """One look at the registry: every live group (a replicated one, whose brokers heartbeat
    for the controller, maps to None; the others to the address of their first live broker,
    by id), and the unreplicated groups registered with no live broker."""
    found: dict[str, str | None] = dict.fromkeys(await registry.replicated_groups())
    registered: set[str] = set()
    for broker in sorted(await meta.list_brokers(), key=lambda b: (b.group, b.broker_id)):
        registered.add(broker.group)
        if broker.alive:
            found.setdefault(broker.group, broker.address)
    return dict(sorted(found.items())), registered - set(found)


async def find_start_groups(meta: RedisMetadataStore, url: str) -> dict[str, str | None]:
    """The live groups at start, waiting up to BROKER_WAIT_S for one to appear."""
    registry = open_group_link(url)
    unreachable: Exception | None = None  # the last failure to reach Redis, if the last try
    warned = float("-inf")
    try:
        with anyio.move_on_after(BROKER_WAIT_S):
            while True:
                try:
                    found, _dead = await look_up_groups(meta, registry)
                    unreachable = None
                except LOOK_ERRORS as error:
                    unreachable, found = error, {}
                    if anyio.current_time() - warned >= WARN_EVERY_S:  # not one per try
                        warned = anyio.current_time()
                        log.warning("cluster: %s (retrying for up to %.0f s)", error,
                                    BROKER_WAIT_S)  # fmt: skip
                if found:
                    return found
                await anyio.sleep(0.2)
    finally:
        await registry.close()
    if unreachable is not None:
        raise SystemExit(f"mqgw serve: metadata store {url} unreachable for "
                         f"{BROKER_WAIT_S:.0f} s: {unreachable}")  # fmt: skip
    raise SystemExit(f"mqgw serve: no live broker registered in {url} within {BROKER_WAIT_S:.0f} s")


def open_group(
    url: str, group: str, address: str | None, name: str
) -> AbstractAsyncContextManager[StorePort]:
    """A store for one group: to its broker, or following its master (``address`` None;
    TimeoutError when it has none within BROKER_WAIT_S)."""
    if address is not None:
        log.info("cluster: metadata in %s, group %s on broker %s", url, group, address)
        return connect_remote_store(address, unavailable_wait_s=REMOTE_WAIT_S)
    log.info("cluster: metadata in %s, messages on replicated group %s", url, group)
    return connect_group_store(url, group, name=name, ready_wait_s=BROKER_WAIT_S)


class BrokerGroups:
    """Finds groups registered after start and adds them (see the module doc)."""

    def __init__(self, meta: RedisMetadataStore, url: str, name: str,
                 routed: RoutedStore, placement: QueuePlacement) -> None:  # fmt: skip
        self.meta = meta
        self.url = url
        self.name = name  # the gateway's: a GroupStore's batch ids and logs carry it
        self.routed = routed
        self.placement = placement
        self._dead: set[str] = set()  # registered unreplicated groups with no live broker
        self._opening: set[str] = set()
        self._changed = anyio.Event()  # set (and replaced) when a group is added or fails
        self._closing = anyio.Event()
        self._tasks: TaskGroup | None = None
        self._registry = open_group_link(url)
        self._last_error = ""

    def live(self) -> list[str]:
        """Groups new queues may go to: connected now, and not known to be without brokers."""
        return [g for g in self.routed.live_groups() if g not in self._dead]

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Look for new groups while the block runs; close the added stores after it."""
        try:
            async with anyio.create_task_group() as tg:
                self._tasks = tg
                looking = anyio.CancelScope()
                tg.start_soon(self._keep_looking, looking)
                try:
                    yield
                finally:
                    looking.cancel()
                    self._closing.set()  # the added stores close in their own tasks
        finally:
            self._tasks = None
            with anyio.CancelScope(shield=True):
                await self._registry.close()

    async def _keep_looking(self, scope: anyio.CancelScope) -> None:
        with scope:
            while True:
                try:
                    await self.look()
                except Exception:  # a registry entry it cannot read: log, keep serving
                    log.exception("cluster: looking for new broker groups failed")
                await anyio.sleep(LOOK_EVERY_S)

    async def look(self) -> None:
        """Read the registry once; open a store for each live group not connected yet."""
        try:
            found, dead = await look_up_groups(self.meta, self._registry)
        except LOOK_ERRORS as error:
            if str(error) != self._last_error:  # once per reason, not every half second
                log.warning("cluster: cannot look for new broker groups: %s", error)
                self._last_error = str(error)
            return
        self._last_error = ""
        self._dead = dead
        for group, address in found.items():
            if group in self.routed.stores or group in self._opening or self._tasks is None:
                continue
            self._opening.add(group)
            self._tasks.start_soon(self._hold, group, address)

    async def ensure(self, groups: Collection[str]) -> None:
        """Wait (up to ENSURE_WAIT_S) until this gateway has a store for each of ``groups``
        that the registry shows live; return at once for the others."""
        missing = [g for g in groups if g not in self.routed.stores]
        if not missing:
            return
        await self.look()
        with anyio.move_on_after(ENSURE_WAIT_S):
            while any(g in self._opening for g in missing if g not in self.routed.stores):
                changed = self._changed
                with anyio.move_on_after(LOOK_EVERY_S):
                    await changed.wait()

    async def _hold(self, group: str, address: str | None) -> None:
        """Open ``group``'s store, add it, and keep it open until the gateway stops."""
        try:
            async with open_group(self.url, group, address, self.name) as store:
                self.routed.add_group(group, store)
                self.placement.add_group(group)
                self._opening.discard(group)
                self._changed.set()
                self._changed = anyio.Event()
                groups = ", ".join(sorted(self.routed.stores))
                log.info("cluster: broker group %s added (%s); new queues are placed over %s",
                         group, address or "replicated", groups)  # fmt: skip
                await self._closing.wait()
        except Exception as error:  # never the gateway's end: the next look tries again
            if group not in self.routed.stores:
                log.warning("cluster: broker group %s not added yet: %s", group, error)
            else:
                log.exception("cluster: the store of broker group %s closed", group)
        finally:
            self._opening.discard(group)
            if group not in self.routed.stores:  # ensure() stops waiting for it
                self._changed.set()
                self._changed = anyio.Event()
