"""RocketMQStore: the StorePort over an Apache RocketMQ 5 cluster (docs/rocketmq.md).

Each queue is a topic (``<namespace>_q<id>``) whose message queues are its partitions, on
one broker group (the master named by the name servers); offsets are RocketMQ's own queue
offsets, and every group's committed offsets are RocketMQ consumer offsets on that broker.

- **Appends.** A record goes to each of its destinations as one message (RocketMQ has no
  write shared by several topics' queues; docs/rocketmq.md measures the cost). A batch is
  split by partition and each part is one batch send; the parts go out concurrently, and
  the sends of one partition one at a time, in the order the appends were made, so that
  RocketMQ's send threads cannot reorder a partition. Sends are acknowledged once the
  broker has flushed (and replicated, in its sync modes): ``wait_durable`` has nothing to
  wait for. ``end_offset`` numbers the store's appends (as the routed store does); the
  queue offsets a batch got are exact (``queue_starts``).
- **Reads** are pulls by offset in a group that commits nothing; a long poll is RocketMQ's
  suspended pull. A pull returns what the broker allows (32 messages by default); a read
  pulls again until it has ``max_count`` or ``max_bytes``.
- **Purge** raises a per-partition floor, kept as the offset of a ``_floor`` group; reads
  and counts start at it (cached here for FLOOR_TTL_S: a purge made through another
  gateway is seen within that).
- **Fencing.** RocketMQ has no conditional offset update: the highest fencing token per
  (group, partition) is kept as the offset of a ``_fence`` group, read before each fenced
  commit and raised by a higher token. A stale holder is refused unless its commit races a
  take-over within that round trip (the delivery lease in Redis is the first fence).
- **Delivery progress** is kept in this process's memory only: a gateway that does not
  deliver a queue counts its ready messages from the committed offsets.
- Retention, disk use and crash marks are the broker's business: the disk figures are 0,
  the marks empty, and a length limit is left to the gateway.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

from storage.clients.link import BrokerUnavailable
from storage.errors import RecordTooLarge, StaleFence, StoreError, UnknownQueue
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
from storage.rocketmq.client import TOPIC_NOT_EXIST, RocketMQClient, RocketMQError, Route
from storage.rocketmq.naming import Names
from storage.rocketmq.reading import read_partition
from storage.rocketmq.sending import Sender, each

FLOOR_TTL_S = 0.5
SUBSCRIPTION_GROUP_NOT_EXIST = 26
_NO_REPORT = (-1, 0, 0, 0)


class RocketMQStore:
    def __init__(
        self,
        client: RocketMQClient,
        names: Names,
        max_record_bytes: int,
        wall_ms: Callable[[], int] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.names = names
        self.max_record_bytes = max_record_bytes
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        self._monotonic = monotonic
        self._routes: dict[int, Route] = {}
        self._groups: set[tuple[str, str]] = set()  # (broker, group) created
        self._floors: dict[tuple[int, int], tuple[int, float]] = {}  # -> (floor, read at)
        self._progress: dict[tuple[str, int, int], tuple[int, int, int, int]] = {}
        self._sender = Sender(client, names, monotonic)
        self._seq = 0

    # -- routes --------------------------------------------------------------------------

    async def _route(self, queue_id: int, partition: int | None = None) -> Route:
        route = self._routes.get(queue_id)
        if route is None:
            found = await self.client.route(self.names.topic(queue_id))
            if found is None:
                raise UnknownQueue(queue_id)
            route = self._routes[queue_id] = found
        if partition is not None and not 0 <= partition < route.queues:
            raise UnknownQueue(queue_id, partition)
        return route

    async def _reroute(self, queue_id: int) -> Route | None:
        """Where the queue's topic is now, by the name servers (after its broker failed)."""
        self._routes.pop(queue_id, None)
        try:
            return await self._route(queue_id)
        except (UnknownQueue, BrokerUnavailable):
            return None  # mid-failover: the old master unregistered, the new one not yet

    @contextlib.contextmanager
    def _rerouted_after(self, queue_id: int) -> Iterator[None]:
        """A call that found its broker away leaves the route to be asked again (the next
        call goes to the master the name servers name then)."""
        try:
            yield
        except BrokerUnavailable:
            self._routes.pop(queue_id, None)
            raise

    def _forget(self, queue_id: int) -> None:
        self._routes.pop(queue_id, None)
        self._sender.forget(queue_id)
        for key in [k for k in self._floors if k[0] == queue_id]:
            del self._floors[key]
        for pkey in [k for k in self._progress if k[1] == queue_id]:
            del self._progress[pkey]

    async def _group(self, route: Route, group: str) -> str:
        if (route.broker, group) not in self._groups:
            await self._on_group(route, lambda broker: self.client.create_group(broker, group))
            self._groups.add((route.broker, group))
        return group

    async def _on_group(self, route: Route, call: Callable[[str], Awaitable[None]]) -> None:
        """``call`` on the master, then on its slaves: a slave that becomes master must have
        every topic and group already (RocketMQ copies them over only every 10 s)."""
        await call(route.broker)
        members = (await self.client.groups()).get(route.broker_name, [])
        for other in members:
            if other != route.broker:
                with contextlib.suppress(StoreError):  # a slave that is down gets it later
                    await call(other)

    # -- appends -------------------------------------------------------------------------

    async def append(self, records: Sequence[Record], wait_durable: bool = True) -> AppendResult:
        if not records:
            return AppendResult(self._seq, self._seq, 0)
        for record in records:
            size = self._sender.size_of(record)
            if size > self.max_record_bytes:
                raise RecordTooLarge(size, self.max_record_bytes)
        routes: dict[int, Route] = {}
        for queue_id in {q for r in records for q, _ in r.destinations}:
            with contextlib.suppress(UnknownQueue):  # deleted: stored nowhere, as in mqgw's
                routes[queue_id] = await self._route(queue_id)
        starts, offsets = await self._sender.send(records, routes, self._forget, self._reroute)
        self._seq += 1
        complete = all(o is not None for o in offsets)
        return AppendResult(
            self._seq - 1,
            self._seq,
            len(records),
            tuple(o for o in offsets if o is not None) if complete else (),
            starts,
            self._wall_ms(),
        )

    async def wait_durable(self, end_offset: int) -> None:
        return None  # every send is acknowledged after the broker's flush

    async def backlog_bytes(self) -> int:
        return 0

    # -- reads ---------------------------------------------------------------------------

    async def read(
        self,
        queue_id: int,
        partition: int,
        offset: int,
        max_count: int = 256,
        max_bytes: int = 4 << 20,
        wait_ms: int = 0,
        fence: int = 0,
    ) -> ReadResult:
        with self._rerouted_after(queue_id):
            route = await self._route(queue_id, partition)
            if fence:  # one more round trip: the fence is a group offset on the broker
                await self._admit(route, queue_id, QUEUE_GROUP, partition, fence)
            floor = await self._floor(queue_id, partition, route)
            group = await self._group(route, self.names.reader_group)
            try:
                return await read_partition(
                    self.client,
                    route,
                    group,
                    self.names.topic(queue_id),
                    partition,
                    offset,
                    floor,
                    max_count,
                    max_bytes,
                    wait_ms,
                    self._sender.sent_end.get((queue_id, partition), 0),
                )
            except RocketMQError as error:
                raise self._lost(queue_id, error) from None

    def _lost(self, queue_id: int, error: RocketMQError) -> StoreError:
        if error.code == TOPIC_NOT_EXIST:
            self._forget(queue_id)
            return UnknownQueue(queue_id)
        return error

    async def _floor(self, queue_id: int, partition: int, route: Route) -> int:
        key = (queue_id, partition)
        cached = self._floors.get(key)
        now = self._monotonic()
        if cached is not None and now - cached[1] < FLOOR_TTL_S:
            return cached[0]
        group = await self._group(route, self.names.floor_group)
        floor = await self.client.group_offset(route.broker, group, route.topic, partition)
        self._floors[key] = (floor or 0, now)
        return floor or 0

    # -- queues --------------------------------------------------------------------------

    async def create_queue(self, queue_id: int, partitions: int) -> None:
        if not 1 <= partitions <= 65535:
            raise ValueError(f"partitions must be in 1..65535, not {partitions}")
        try:
            route = await self._route(queue_id)
        except UnknownQueue:
            masters = await self.client.masters()
            if not masters:
                raise StoreError("rocketmq: no broker group has a master") from None
            names = sorted(masters)
            name = names[queue_id % len(names)]
            route = Route(masters[name], name, 0, self.names.topic(queue_id))
        if route.queues >= partitions:
            return
        topic = route.topic
        await self._on_group(route, lambda b: self.client.create_topic(b, topic, partitions))
        self._routes[queue_id] = route._replace(queues=partitions)

    async def queues(self) -> dict[int, int]:
        """The namespace's topics, by name from the name servers (a RocketMQ estate holds
        many others: their configurations are never fetched), then each one's route."""
        topics = [t for t in await self.client.topic_names() if self.names.queue_of(t) is not None]
        routes = await each(topics, self.client.route)
        found: dict[int, int] = {}
        for topic, route in routes.items():
            queue_id = self.names.queue_of(topic)
            if route is not None and queue_id is not None:
                found[queue_id] = route.queues
                self._routes[queue_id] = route
        return dict(sorted(found.items()))

    async def delete_queue(self, queue_id: int) -> None:
        self._routes.pop(queue_id, None)  # another gateway may have deleted it: ask again
        route = await self._route(queue_id)
        try:
            await self.client.delete_topic(route.broker, route.topic)
        finally:
            self._forget(queue_id)

    async def purge(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        with self._rerouted_after(queue_id):
            stats = await self.queue_stats(queue_id, group)
            route = await self._route(queue_id)
            floor_group = await self._group(route, self.names.floor_group)
            now = self._monotonic()
            for part in stats.partitions:
                await self.client.commit_group_offset(
                    route.broker, floor_group, route.topic, part.partition, part.max_offset
                )
                self._floors[(queue_id, part.partition)] = (part.max_offset, now)
            for key in [k for k in self._progress if k[1] == queue_id]:
                del self._progress[key]
            return stats.ready

    async def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats:
        with self._rerouted_after(queue_id):
            route = await self._route(queue_id)

            async def one(partition: int) -> PartitionStats:
                return await self._partition_stats(route, queue_id, partition, group)

            try:
                parts = await each(list(range(route.queues)), one)
            except RocketMQError as error:
                raise self._lost(queue_id, error) from None
            return QueueStats.of(queue_id, [parts[p] for p in range(route.queues)])

    async def _partition_stats(
        self, route: Route, queue_id: int, partition: int, group: str
    ) -> PartitionStats:
        broker, topic = route.broker, route.topic
        low = await self.client.min_offset(broker, topic, partition)
        high = await self.client.max_offset(broker, topic, partition)
        # What this store sent is counted even before RocketMQ's dispatch indexed it.
        high = max(high, self._sender.sent_end.get((queue_id, partition), 0))
        floor = await self._floor(queue_id, partition, route)
        rgroup = await self._group(route, self.names.group(group))
        stored = await self.client.group_offset(broker, rgroup, topic, partition)
        start = max(low, floor)
        committed = max(stored or 0, start)
        dropped = max(0, low - max(stored or 0, floor))
        report = self._progress.get((group, queue_id, partition), _NO_REPORT)
        fence = await self._fence(route, group, partition)
        return PartitionStats(partition, start, high, committed, dropped, *report, fence)

    # -- offsets -------------------------------------------------------------------------

    async def _fence(self, route: Route, group: str, partition: int) -> int:
        fence_group = await self._group(route, self.names.fence_group(group))
        return (
            await self.client.group_offset(route.broker, fence_group, route.topic, partition) or 0
        )

    async def _admit(
        self, route: Route, queue_id: int, group: str, partition: int, fence: int
    ) -> None:
        highest = await self._fence(route, group, partition)
        if fence < highest:
            raise StaleFence(
                f"fencing token {fence} is below token {highest} for {group} on queue "
                f"{queue_id}/{partition}"
            )
        if fence > highest:
            await self.client.commit_group_offset(
                route.broker, self.names.fence_group(group), route.topic, partition, fence
            )
            self._progress.pop((group, queue_id, partition), None)

    async def commit_offset(
        self,
        group: str,
        queue_id: int,
        partition: int,
        offset: int,
        fence: int = 0,
        progress: DeliveryProgress | None = None,
    ) -> None:
        with self._rerouted_after(queue_id):
            route = await self._route(queue_id, partition)
            if fence:
                await self._admit(route, queue_id, group, partition, fence)
            rgroup = await self._group(route, self.names.group(group))
            try:
                await self.client.commit_group_offset(
                    route.broker, rgroup, route.topic, partition, offset
                )
            except RocketMQError as error:
                raise self._lost(queue_id, error) from None
            if progress is not None:
                high = await self.client.max_offset(route.broker, route.topic, partition)
                ready = max(0, high - progress[0]) + progress[1]
                self._progress[(group, queue_id, partition)] = (*progress, ready)

    async def committed_offset(
        self, group: str, queue_id: int, partition: int, fence: int = 0
    ) -> int:
        with self._rerouted_after(queue_id):
            route = await self._route(queue_id, partition)
            if fence:
                await self._admit(route, queue_id, group, partition, fence)
            rgroup = await self._group(route, self.names.group(group))
            stored = await self.client.group_offset(route.broker, rgroup, route.topic, partition)
            low = await self.client.min_offset(route.broker, route.topic, partition)
            floor = await self._floor(queue_id, partition, route)
            return max(stored or 0, low, floor)

    def set_append_limit(
        self, queue_id: int, max_length: int | None, max_length_bytes: int | None = None
    ) -> None:
        return None  # RocketMQ cannot refuse by depth: the gateway checks (docs/rocketmq.md)

    async def offset_for_time(self, queue_id: int, partition: int, ts_ms: int) -> int:
        with self._rerouted_after(queue_id):
            route = await self._route(queue_id, partition)
            found = await self.client.offset_for_time(route.broker, route.topic, partition, ts_ms)
            return max(found, await self._floor(queue_id, partition, route))

    # -- what the broker manages itself ---------------------------------------------------

    async def apply_retention(self) -> RetentionReport:
        return RetentionReport(0, 0, {})

    async def disk_bytes(self) -> int:
        return 0

    async def held_back_bytes(self) -> dict[int, int]:
        return {}

    async def oldest_segment_ts(self) -> int | None:
        return None

    async def restart_marks(self, queue_id: int) -> dict[int, int]:
        await self._route(queue_id)
        return {}

    async def unclean_marks(self, queue_id: int) -> dict[int, int]:
        await self._route(queue_id)
        return {}
