"""Which consumer holds each readable partition of a keyed-order queue (RocketMQ's orderly
consumption; gateway/queues/ordered.py delivers a partition to its holder alone).

- A partition whose holder went away stays with it, an **orphan**, until every message it
  held unacked is settled or has come back: only then does another consumer get it, so the
  next holder starts where the last one ended.
- Free partitions go to the consumer holding the fewest.
- A new consumer takes partitions over from busier ones the same way: only a partition with
  nothing in flight moves, until no two consumers hold more than one apart.

The holders are worked out again lazily, at the next delivery turn, once something that
matters changed (``stale``): a consumer came or went, the readable partitions changed, an
orphan's last message came back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer as Consumer


class PartitionHolders:
    def __init__(self) -> None:
        self.owners: dict[int, Consumer] = {}  # partition -> the consumer holding it
        self.orphans: set[int] = set()  # its holder is gone, its messages still in flight
        self.stale = True

    def holder(self, partition: int, consumers: Sequence[Consumer]) -> Consumer | None:
        """The consumer holding ``partition`` now (not one gone since the last turn)."""
        owner = self.owners.get(partition)
        return owner if owner is not None and any(c is owner for c in consumers) else None

    def held(self, partition: int) -> bool:
        """Whether a consumer holds it, or held it and still has its messages."""
        return partition in self.owners or partition in self.orphans

    def settled(self, partition: int, inflight: Sequence[set[int]]) -> None:
        """A message of ``partition`` was settled or came back: an orphan may move on."""
        if partition in self.orphans and not inflight[partition]:
            self.stale = True

    def consuming(self, inflight: Sequence[set[int]]) -> bool:
        """A holder is taking messages, or will ack some (its credit comes back)."""
        return any(c.has_credit() or inflight[p] for p, c in self.owners.items())

    def assign(
        self, consumers: Sequence[Consumer], readable: Sequence[int], inflight: Sequence[set[int]]
    ) -> None:
        """Work the holders out again (see the module doc)."""
        self.stale = False
        live = {id(c) for c in consumers}
        readable_set = set(readable)
        for p, c in list(self.owners.items()):
            if id(c) in live and p in readable_set:
                continue
            del self.owners[p]
            if id(c) not in live and inflight[p]:
                self.orphans.add(p)
        for p in list(self.orphans):
            if not inflight[p] or p not in readable_set:
                self.orphans.discard(p)
        if not consumers:
            return
        load = {id(c): 0 for c in consumers}
        for c in self.owners.values():
            load[id(c)] += 1
        for p in readable:
            if p not in self.owners and p not in self.orphans:
                least = min(consumers, key=lambda c: load[id(c)])
                self.owners[p] = least
                load[id(least)] += 1
        while True:  # balance: at most one apart, moving only idle partitions
            busiest = max(consumers, key=lambda c: load[id(c)])
            idlest = min(consumers, key=lambda c: load[id(c)])
            if load[id(busiest)] - load[id(idlest)] <= 1:
                return
            movable = [p for p, c in self.owners.items() if c is busiest and not inflight[p]]
            if not movable:
                return
            self.owners[movable[-1]] = idlest
            load[id(busiest)] -= 1
            load[id(idlest)] += 1
