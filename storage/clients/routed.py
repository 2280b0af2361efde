"""RoutedStore: one StorePort over several broker groups, routed per queue partition.

A cluster with several broker groups places each queue partition on one group (the route
table in the metadata store, meta.cluster.ClusterRegistry.place_queue). This store is given
a store per group (a RemoteStore for an unreplicated group, a GroupStore for a replicated
one) and a placement lookup (queue id -> the group of each partition; None for a queue it
does not know, which then lives on the ``home`` group, as the gateway's own timer queue does).

- **Queues.** Every group holding a partition of a queue has the whole queue (all its
  partitions): offsets stay per partition, and a group's unused partitions stay empty.
  Reads, commits, offset_for_time and crash marks go to the partition's group; stats are
  merged partition by partition from their groups; purge and delete go to every owner
  (every group when the placement is unknown: a queue being deleted may have lost it), and
  an owner without the queue is no error unless none has it.
- **Appends.** A batch is split by group; a record whose destinations span groups becomes
  one record per group with its share of them. The parts go out concurrently. Offsets in
  the ``AppendResult`` are this store's own: ``end_offset`` is the batch's sequence number,
  which ``wait_durable`` understands (it waits for every part's group). A batch that went to
  one group keeps that group's ``record_offsets`` and ``queue_starts`` (the gateway hands the
  messages to caught-up consumers from the batch in hand); a split one has none (consumers
  read them back). A split batch is not atomic: when one part fails the others may be
  stored, so the error says what an error of a remote append says: outcome unknown.
- **Everything else** (disk and backlog bytes, retention, queues) is summed over the groups
  connected at the time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import anyio

from storage.clients.link import BrokerUnavailable
from storage.errors import StoreError, UnknownQueue
from storage.port import StorePort
from storage.record import Record
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
    DeliveryProgress,
    PartitionStats,
    QueueStats,
    ReadResult,
    RetentionReport,
)

T = TypeVar("T")
Placement = Callable[[int], Sequence[str] | None]  # queue id -> group per partition
MAX_UNWAITED = 1024  # appends nobody waited for yet, remembered one by one (then folded)


class RoutedStore:
    def __init__(self, stores: Mapping[str, StorePort], placement: Placement,
                 home: str | None = None) -> None:  # fmt: skip
        if not stores:
            raise ValueError("a routed store needs at least one broker group")
        self.stores = dict(stores)
        self.placement = placement
        self.home = home if home is not None else min(self.stores)
        self._seq = 0
        self._positions: dict[str, list[int]] = {}  # the last split's (see _split)
        self._unwaited: dict[int, dict[str, int]] = {}  # seq -> group -> the part's end offset
        self._folded: dict[str, int] = {}  # older unwaited parts: the highest end per group
        # queue id -> (max length, max length bytes), for added groups
        self._limits: dict[int, tuple[int | None, int | None]] = {}

    def add_group(self, group: str, store: StorePort) -> None:
        """A broker group registered while the gateway runs (gateway/cluster/groups.py). Only
        placements made from now on use it; ``home`` stays where it was."""
        for queue_id, (max_length, max_length_bytes) in self._limits.items():
            store.set_append_limit(queue_id, max_length, max_length_bytes)
        self.stores[group] = store

    # -- where things live ----------------------------------------------------------------

    def group_of(self, queue_id: int, partition: int) -> str:
        groups = self.placement(queue_id)
        group = groups[partition] if groups and partition < len(groups) else self.home
        if group not in self.stores:
            raise BrokerUnavailable(
                f"queue {queue_id}/{partition} is placed on broker group {group!r}, which this "
                f"gateway is not connected to (it has {', '.join(sorted(self.stores))})"
            )
        return group

    def _owners(self, queue_id: int) -> list[str]:
        groups = self.placement(queue_id)
        if not groups:
            return sorted(self.stores)
        return sorted({self.group_of(queue_id, p) for p in range(len(groups))})

    def live_groups(self) -> list[str]:
        """Groups whose store is connected now (a store that cannot tell counts as live)."""
        return [g for g, s in sorted(self.stores.items()) if getattr(s, "connected", True)]

    async def _on(
        self, groups: Sequence[str], call: Callable[[str], Awaitable[T]]
    ) -> dict[str, T | Exception]:
        """``call(group)`` for each group concurrently; each answer or its typed error."""
        answers: dict[str, T | Exception] = {}

        async def one(group: str) -> None:
            try:
                answers[group] = await call(group)
            except (StoreError, ValueError) as error:
                answers[group] = error

        if len(groups) == 1:
            await one(groups[0])
        else:
            async with anyio.create_task_group() as tg:
                for group in groups:
                    tg.start_soon(one, group)
        return answers

    async def _on_all(self, call: Callable[[StorePort], Awaitable[T]]) -> list[T]:
        """Every group connected now: a group that is down holds no backlog of ours, and a
        gateway's housekeeping must not wait out its reconnection (all when none is up)."""
        groups = self.live_groups() or sorted(self.stores)
        answers = await self._on(groups, lambda g: call(self.stores[g]))
        return [_unless_error(answer) for answer in answers.values()]

    async def _on_owners(
        self, queue_id: int, call: Callable[[StorePort], Awaitable[T]]
    ) -> dict[str, T]:
        """Answers of the queue's owners that have it; UnknownQueue only if none has it."""
        answers = await self._on(self._owners(queue_id), lambda g: call(self.stores[g]))
        found: dict[str, T] = {}
        for group, answer in answers.items():
            if isinstance(answer, UnknownQueue) and answer.partition is None:
                continue
            found[group] = _unless_error(answer)
        if not found:
            raise UnknownQueue(queue_id)
        return found

    # -- appends and durability -----------------------------------------------------------

    def _split(self, records: Sequence[Record]) -> dict[str, Sequence[Record]]:
        """Records per group, in their order; the batch itself when it goes to one group
        (``_positions`` says where each group's records came from in the batch)."""
        groups: dict[tuple[int, int], str] = {}
        touched: set[str] = set()
        for record in records:  # the common case first: one group, nothing built
            for destination in record.destinations:
                group = groups.get(destination)
                if group is None:
                    group = groups[destination] = self.group_of(*destination)
                    touched.add(group)
        if len(touched) <= 1:
            return {next(iter(touched), self.home): records}
        first = min(touched)  # records routed nowhere: stored there, indexed nowhere
        parts: dict[str, list[Record]] = {group: [] for group in sorted(touched)}
        positions: dict[str, list[int]] = {group: [] for group in parts}
        for index, record in enumerate(records):
            mine = sorted({groups[d] for d in record.destinations})
            if len(mine) <= 1:
                group = mine[0] if mine else first
                parts[group].append(record)
                positions[group].append(index)
                continue
            for group in mine:
                share = tuple(d for d in record.destinations if groups[d] == group)
                parts[group].append(record._replace(destinations=share))
                positions[group].append(index)
        self._positions = positions
        return dict(parts)

    async def append(self, records: Sequence[Record], wait_durable: bool = True) -> AppendResult:
        if not records:
            return AppendResult(self._seq, self._seq, 0)
        parts = self._split(records)
        positions = self._positions if len(parts) > 1 else {}  # taken before any await
        self._seq += 1
        seq = self._seq
        answers = await self._on(
            list(parts), lambda g: self.stores[g].append(parts[g], wait_durable)
        )
        results = {group: _unless_error(answer) for group, answer in answers.items()}
        if not wait_durable:
            self._remember(seq, {group: r.end_offset for group, r in results.items()})
        if len(results) == 1:
            (result,) = results.values()
            return result._replace(start_offset=seq - 1, end_offset=seq)
        store_ts = max(r.store_ts_ms for r in results.values())
        refused = tuple(
            (positions[group][index], queue_id, partition)
            for group, result in results.items()
            for index, queue_id, partition in result.refused
        )
        return AppendResult(seq - 1, seq, len(records), (), None, store_ts, refused)

    def set_append_limit(
        self, queue_id: int, max_length: int | None, max_length_bytes: int | None = None
    ) -> None:
        """Every group holding a part of the queue counts its own part against the limits."""
        if max_length is None and max_length_bytes is None:
            self._limits.pop(queue_id, None)
        else:
            self._limits[queue_id] = (max_length, max_length_bytes)
        for store in self.stores.values():
            store.set_append_limit(queue_id, max_length, max_length_bytes)

    def _remember(self, seq: int, ends: dict[str, int]) -> None:
        self._unwaited[seq] = ends
        if len(self._unwaited) > MAX_UNWAITED:  # publishers without confirms: fold the oldest
            for old in sorted(self._unwaited)[: MAX_UNWAITED // 2]:
                for group, end in self._unwaited.pop(old).items():
                    self._folded[group] = max(self._folded.get(group, 0), end)

    async def wait_durable(self, end_offset: int) -> None:
        """Every append up to sequence number ``end_offset`` that had returned is durable in
        every group it went to. Appends still in flight are not waited for: a confirm for one
        group must not wait out another group's outage (each caller waits for its own)."""
        covered = [s for s in self._unwaited if s <= end_offset]
        folded = dict(self._folded)
        need = dict(folded)  # folded parts are older: waiting for them too is only early
        for seq in covered:
            for group, end in self._unwaited[seq].items():
                need[group] = max(need.get(group, 0), end)
        if not need:
            return
        answers = await self._on(list(need), lambda g: self.stores[g].wait_durable(need[g]))
        for answer in answers.values():
            _unless_error(answer)
        for seq in covered:
            self._unwaited.pop(seq, None)
        for group, end in folded.items():
            if self._folded.get(group) == end:
                del self._folded[group]

    async def backlog_bytes(self) -> int:
        return sum(await self._on_all(lambda s: s.backlog_bytes()))

    # -- one partition: its group ---------------------------------------------------------

    async def read(
        self, queue_id: int, partition: int, offset: int, max_count: int = 256,
        max_bytes: int = 4 << 20, wait_ms: int = 0, fence: int = 0,
    ) -> ReadResult:  # fmt: skip
        store = self.stores[self.group_of(queue_id, partition)]
        return await store.read(queue_id, partition, offset, max_count, max_bytes, wait_ms, fence)

    async def commit_offset(
        self,
        group: str,
        queue_id: int,
        partition: int,
        offset: int,
        fence: int = 0,
        progress: DeliveryProgress | None = None,
    ) -> None:
        store = self.stores[self.group_of(queue_id, partition)]
        await store.commit_offset(group, queue_id, partition, offset, fence, progress)

    async def committed_offset(
        self, group: str, queue_id: int, partition: int, fence: int = 0
    ) -> int:
        store = self.stores[self.group_of(queue_id, partition)]
        return await store.committed_offset(group, queue_id, partition, fence)

    async def offset_for_time(self, queue_id: int, partition: int, ts_ms: int) -> int:
        store = self.stores[self.group_of(queue_id, partition)]
        return await store.offset_for_time(queue_id, partition, ts_ms)

    # -- whole queues: their owners -------------------------------------------------------

    async def create_queue(self, queue_id: int, partitions: int) -> None:
        """Every group owning one of the ``partitions`` creates or grows the whole queue: a
        group keeps every partition of a queue it holds any of (see the module doc)."""
        known = self.placement(queue_id)
        owners = {self.group_of(queue_id, p) for p in range(partitions)} if known else set()
        answers = await self._on(
            sorted(owners or {self.home}),
            lambda g: self.stores[g].create_queue(queue_id, partitions),
        )
        for answer in answers.values():
            _unless_error(answer)

    async def delete_queue(self, queue_id: int) -> None:
        await self._on_owners(queue_id, lambda s: s.delete_queue(queue_id))

    async def purge(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        # A group's copies of partitions placed elsewhere are empty: the counts add up.
        return sum((await self._on_owners(queue_id, lambda s: s.purge(queue_id, group))).values())

    async def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats:
        answers = await self._on_owners(queue_id, lambda s: s.queue_stats(queue_id, group))
        # While a queue grows, its groups may not all hold the new partitions yet (a scale
        # creates them group by group): a partition its owner does not hold yet comes from a
        # group that does (a copy there is empty), never an IndexError.
        count = max(len(answer.partitions) for answer in answers.values())
        parts: list[PartitionStats] = []
        for p in range(count):
            owner = answers.get(self.group_of(queue_id, p))
            if owner is None or p >= len(owner.partitions):
                owner = next(a for a in answers.values() if p < len(a.partitions))
            parts.append(owner.partitions[p])
        return QueueStats.of(queue_id, parts)

    async def restart_marks(self, queue_id: int) -> dict[int, int]:
        return self._own_marks(
            queue_id, await self._on_owners(queue_id, lambda s: s.restart_marks(queue_id))
        )

    async def unclean_marks(self, queue_id: int) -> dict[int, int]:
        return self._own_marks(
            queue_id, await self._on_owners(queue_id, lambda s: s.unclean_marks(queue_id))
        )

    def _own_marks(self, queue_id: int, answers: dict[str, dict[int, int]]) -> dict[int, int]:
        """Each partition's mark as its own group found it."""
        return {
            p: mark
            for group, marks in answers.items()
            for p, mark in marks.items()
            if self.group_of(queue_id, p) == group
        }

    # -- the whole store: every group -----------------------------------------------------

    async def queues(self) -> dict[int, int]:
        merged: dict[int, int] = {}
        for found in await self._on_all(lambda s: s.queues()):
            merged |= found
        return merged

    async def apply_retention(self) -> RetentionReport:
        reports = await self._on_all(lambda s: s.apply_retention())
        dropped: dict[int, int] = {}
        for report in reports:
            for queue_id, count in report.dropped_unread.items():
                dropped[queue_id] = dropped.get(queue_id, 0) + count
        return RetentionReport(
            sum(r.deleted_segments for r in reports), sum(r.freed_bytes for r in reports), dropped
        )

    async def disk_bytes(self) -> int:
        return sum(await self._on_all(lambda s: s.disk_bytes()))

    async def held_back_bytes(self) -> dict[int, int]:
        merged: dict[int, int] = {}
        for held in await self._on_all(lambda s: s.held_back_bytes()):
            for queue_id, size in held.items():
                merged[queue_id] = merged.get(queue_id, 0) + size
        return merged

    async def oldest_segment_ts(self) -> int | None:
        found = [ts for ts in await self._on_all(lambda s: s.oldest_segment_ts()) if ts is not None]
        return min(found, default=None)


def _unless_error(answer: T | Exception) -> T:
    if isinstance(answer, Exception):
        raise answer
    return answer
