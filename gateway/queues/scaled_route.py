"""A scaled queue's route (meta/channel_route.py, gateway/vhost/rescale.py) as its runtime
follows it: which partitions publishers write to and readers read, partitions added by a
grow (every per-partition list reaches the new count), and removed ones, whose command
record closes them: counted ready until read, and passed by the read positions once a removed
partition drained before anyone read that record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from gateway.queues.queue_state import QueueState
from meta.queue_route import QueueRoute


class ScaledRoute(QueueState):
    """The route of a scaled queue, and the partition count growing under it."""

    if TYPE_CHECKING:
        # Provided by the other parts of QueueRuntime (runtime.py, held_messages.py).
        def _is_plain(self) -> bool: ...
        def _holds_of(self, partition: int) -> bool: ...

    def set_route(self: Self, route: QueueRoute) -> None:
        """A new version, or a partition's state changed: publishers write to the open
        partitions, readers read every partition not removed (a new one from its start)."""
        self.route = route
        self.grow_partitions(len(route.partitions))
        self.write_parts = tuple(route.open_partitions())
        self.read_parts = route.read_partitions()
        self.plain = self._is_plain()
        if self.started:
            self.pass_removed_records()
            self.exhausted = False
            if self.wake is not None:
                self.wake(self)

    def grow_partitions(self, partitions: int) -> None:
        """The store queue gained partitions: every per-partition list reaches the count."""
        more = partitions - self.partitions
        if more <= 0:
            return
        self.partitions = partitions
        self.read_parts = range(partitions)  # (a route sets its own after)
        for values in (self.cursors, self.maybe_delivered, self.delivered_below,
                       self.restart_below, self.fences):  # fmt: skip
            values.extend([0] * more)
        self.inflight.extend(set() for _ in range(more))
        self.handed.extend([None] * more)
        if self.leases is not None:
            self.leases.extend([False] * more)

    def is_removed(self, partition: int) -> bool:
        route = self.route
        return (
            route is not None
            and partition < len(route.partitions)
            and route.partitions[partition].state == "removed"
        )

    def count_commands(self, records: int) -> None:
        """Command records about to be appended (less: not appended after all): counted
        ready until read, as a start counts them from the store's ends."""
        self.ready_count += records

    def command_appended(self: Self, partition: int) -> None:
        """A change appended its command record to ``partition`` (counted already): read up
        to it."""
        self.exhausted = False
        if self.started and self.wake is not None:
            self.wake(self)

    def pass_removed_records(self) -> None:
        """A removed partition drained before anyone read its command record (nobody needs
        to): read positions move past it, and it leaves the ready count."""
        if self.route is None:
            return
        for part in self.route.partitions:
            if part.state != "removed" or part.closed_at is None:
                continue
            p = part.partition
            if self.cursors[p] <= part.closed_at and not self._holds_of(p):
                self.ready_count -= part.closed_at + 1 - self.cursors[p]
                self.cursors[p] = part.closed_at + 1
                self.commit_dirty = True
