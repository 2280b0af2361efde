"""What only a cluster needs from metadata: gateway leases, the broker registry, placement.

``ClusterRegistry`` is a Protocol of its own, implemented by the Redis store only. An
embedded node has one gateway and an in-process log store: nothing to lease, register or
place, and a local implementation would be code only its tests ran. Cluster code takes a
``ClusterRegistry``; the embedded node never builds one.

Time is Redis's: leases are keys with a TTL and heartbeats are stamped with the server's
clock (TIME), so skewed machine clocks cannot make a live gateway look dead.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from meta.models import Deletions


@dataclass(frozen=True)
class BrokerInfo:
    group: str
    broker_id: str
    address: str  # host:port of its store protocol
    last_seen_ms: int  # Redis server time of the last heartbeat, ms since the epoch
    alive: bool  # the heartbeat's lease has not lapsed


# A delivery lease's fencing token is ``<counter> << TOKEN_TAG_BITS | <owner's tag>``: two
# owners never get one token, even when Redis hands one counter value out twice (a write lost
# at a Redis failover, or an old master that took writes before it learnt it was replaced).
# A broker admits a token equal to the highest it saw (its holder reads again), so two holders
# with one token would both be admitted and both deliver (nemesis seed 8).
TOKEN_TAG_BITS = 16


def owner_tag(owner: str) -> int:
    """The low bits of every token ``owner`` takes (a gateway's name: stable, and distinct
    between gateways but for a 1-in-65,536 hash collision)."""
    return zlib.crc32(owner.encode()) & ((1 << TOKEN_TAG_BITS) - 1)


def token_counter(token: int) -> int:
    """The counter value a fencing token was made from."""
    return token >> TOKEN_TAG_BITS


@dataclass(frozen=True)
class HandedNote:
    """What a delivery lease's last holder left in Redis when it was taken next: its token,
    and the offset it recorded when it gave the lease up (None: it never gave it up, so it
    lapsed or was taken from a holder that stopped answering)."""

    token: int
    mark: int | None


@dataclass(frozen=True)
class LeaseState:
    """``take_lease``'s answer: who holds the lease now and with which fencing token."""

    holder: str
    token: int
    mine: bool  # held by the caller (taken now, or renewed)
    taken: bool  # it changed hands to the caller with this call
    # Only when ``taken``: the note of the holder before (None: there was none, which
    # includes a lease nobody ever held).
    handed: HandedNote | None = None


@dataclass(frozen=True)
class HandOverRequest:
    """A gateway asks the holder of delivery leases ``names`` to give them up (basic.get)."""

    request_id: str  # where the answer goes
    names: tuple[str, ...]


class ClusterRegistry(Protocol):
    # --- gateway leases ---
    async def register_gateway(self, gateway_id: str, ttl_ms: int) -> None:
        """Take (or retake) the lease. A gateway id must be unique per process start:
        connection ids are "<gateway_id>/<n>" and exclusive queues are reaped by prefix."""

    async def renew_gateway(self, gateway_id: str, ttl_ms: int) -> bool:
        """False if the lease had lapsed: the gateway must treat itself as reaped (its
        exclusive queues may be gone) and close its connections before registering again."""

    async def live_gateways(self) -> list[str]: ...
    async def lapsed_gateways(self) -> list[str]:
        """Registered gateways whose lease lapsed and that nobody has reaped yet."""

    async def reap_gateway(self, gateway_id: str, *, force: bool = False) -> Deletions:
        """Delete the exclusive queues of every "<gateway_id>/<n>" connection and forget the
        gateway. Does nothing while its lease is live, unless ``force`` (a clean shutdown)."""

    async def raise_queue_ids(self, floor: int) -> int:
        """Queue ids handed out from now on are above ``floor`` (the highest id the brokers
        hold): an id Redis handed out and then lost at a failover, with the queue's record,
        is never given to a new queue, which would meet the lost one's messages. Returns
        the counter."""

    # --- broker registry ---
    async def register_broker(self, group: str, broker_id: str, address: str, ttl_ms: int) -> None:
        """Heartbeat: create or refresh the broker's entry and lease."""

    async def list_brokers(self) -> list[BrokerInfo]: ...

    # --- placement ---
    async def place_queue(
        self, vhost: str, name: str, partitions: int, groups: Iterable[str]
    ) -> list[str]:
        """The broker group of each partition of queue ``name``, chosen once (among
        ``groups``, fewest partitions first) and returned unchanged ever after, until the
        queue is deleted."""

    async def queue_placement(self, vhost: str, name: str) -> list[str] | None: ...

    async def extend_placement(self, vhost: str, name: str, groups: Sequence[str]) -> list[str]:
        """A queue that grew (a keyed-order queue's split or move): ``groups`` is the group of
        every partition; those past the placed ones are added, the placed ones never change.
        The placement after it (the first writer's, when two race)."""

    async def repoint_placement(
        self, vhost: str, name: str, partitions: Mapping[int, str]
    ) -> list[str]:
        """A group is retired: removed partitions placed there are re-pointed to another
        group holding the queue (every owner holds every partition; a removed one is never
        read again). The placement after it."""

    async def retire_group(self, group: str) -> None:
        """Forget the group's brokers: nothing is placed there any more (its processes are
        stopped by whoever retires it)."""


def spread_partitions(partitions: int, groups: Iterable[str], load: Mapping[str, int]) -> list[str]:
    """Give each partition to the group holding the fewest partitions so far (ties by name).

    ``load`` is the partitions each group already holds; groups missing from it hold none.
    """
    counts = {group: load.get(group, 0) for group in groups}
    if not counts:
        raise ValueError("no broker group to place partitions on")
    if partitions < 1:
        raise ValueError(f"a queue has at least one partition, not {partitions}")
    chosen = []
    for _ in range(partitions):
        group = min(counts, key=lambda g: (counts[g], g))
        counts[group] += 1
        chosen.append(group)
    return chosen
