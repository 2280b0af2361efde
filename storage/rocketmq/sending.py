"""Batch sends of the RocketMQ store: a batch split by partition, one partition's sends in
order (see store.py), each part in chunks the broker takes in one request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TypeVar

import anyio

from storage.clients.link import BrokerUnavailable
from storage.errors import StoreError
from storage.record import Record
from storage.rocketmq.client import (
    FLUSH_DISK_TIMEOUT,
    FLUSH_SLAVE_TIMEOUT,
    NO_PERMISSION,
    SERVICE_NOT_AVAILABLE,
    SLAVE_NOT_AVAILABLE,
    SYSTEM_BUSY,
    TOPIC_NOT_EXIST,
    RocketMQClient,
    RocketMQError,
    Route,
)
from storage.rocketmq.messages import batch_body, message_of, properties_size
from storage.rocketmq.naming import Names

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
CHUNK_BYTES = 4 << 20  # one send request's body at most (a larger record goes alone)
CHUNK_MESSAGES = 1024
# A send that failed because its master went away is sent again to the next master for this
# long (RocketMQ's controller elects one in seconds), then the append fails.
FAILOVER_WAIT_S = 20.0
RETRY_S = 0.2
# Answers of a broker that is not (or no longer) the master, or busy: worth sending again.
TRANSIENT = frozenset({SYSTEM_BUSY, FLUSH_DISK_TIMEOUT, SLAVE_NOT_AVAILABLE,
                       FLUSH_SLAVE_TIMEOUT, SERVICE_NOT_AVAILABLE, NO_PERMISSION})  # fmt: skip
Destination = tuple[int, int]


async def each(keys: Sequence[K], call: Callable[[K], Awaitable[T]]) -> dict[K, T]:
    """``call(key)`` for every key concurrently; after all finished, the first typed error
    is raised (an ExceptionGroup would hide it from the gateway's handlers)."""
    answers: dict[K, T] = {}
    errors: list[Exception] = []

    async def one(key: K) -> None:
        try:
            answers[key] = await call(key)
        except (StoreError, ValueError) as error:
            errors.append(error)

    if len(keys) == 1:
        await one(keys[0])
    else:
        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(one, key)
    if errors:
        raise errors[0]
    return answers


def _chunks(records: Sequence[Record], indexes: list[int]) -> list[list[int]]:
    chunks: list[list[int]] = [[]]
    size = 0
    for i in indexes:
        cost = properties_size(records[i])
        if chunks[-1] and (size + cost > CHUNK_BYTES or len(chunks[-1]) >= CHUNK_MESSAGES):
            chunks.append([])
            size = 0
        chunks[-1].append(i)
        size += cost
    return chunks


class Sender:
    def __init__(self, client: RocketMQClient, names: Names,
                 monotonic: Callable[[], float]) -> None:  # fmt: skip
        self.client = client
        self.names = names
        self.monotonic = monotonic
        self._locks: dict[Destination, anyio.Lock] = {}
        # Per partition, the end of what this store has sent there. RocketMQ acknowledges a
        # send once its commitlog has it and indexes it a moment later (its dispatch runs
        # behind), so a read right after a confirm waits for up to here (reading.py).
        self.sent_end: dict[Destination, int] = {}

    @staticmethod
    def size_of(record: Record) -> int:
        return properties_size(record)

    def forget(self, queue_id: int) -> None:
        for key in [k for k in self.sent_end if k[0] == queue_id]:
            del self.sent_end[key]
        for key in [k for k, lock in self._locks.items() if k[0] == queue_id and not lock.locked()]:
            del self._locks[key]

    async def send(
        self,
        records: Sequence[Record],
        routes: dict[int, Route],
        lost: Callable[[int], None],
        reroute: Callable[[int], Awaitable[Route | None]],
    ) -> tuple[dict[Destination, int], list[int | None]]:
        """Send each record to its destinations on ``routes`` (others are dropped); the
        first queue offset per destination, and each record's first commitlog offset (None
        for a record sent nowhere). ``lost(queue id)``: the broker no longer has its topic;
        ``reroute(queue id)``: where it is now, asked after a failed send (None: unknown)."""
        by_destination: dict[Destination, list[int]] = {}
        for i, record in enumerate(records):
            for queue_id, partition in record.destinations:
                route = routes.get(queue_id)
                if route is not None and partition < route.queues:
                    by_destination.setdefault((queue_id, partition), []).append(i)
        offsets: list[int | None] = [None] * len(records)
        starts: dict[Destination, int] = {}

        async def to(destination: Destination) -> None:
            queue_id, partition = destination
            route = routes[queue_id]
            lock = self._locks.setdefault(destination, anyio.Lock())
            async with lock:
                for chunk in _chunks(records, by_destination[destination]):
                    born = records[chunk[0]].born_ts_ms
                    body = batch_body(message_of(records[i], born) for i in chunk)
                    deadline = self.monotonic() + FAILOVER_WAIT_S
                    while True:
                        try:
                            first, commits = await self.client.send_batch(
                                route.broker, route.topic, partition, body, born
                            )
                            break
                        except RocketMQError as error:
                            if error.code == TOPIC_NOT_EXIST:
                                lost(queue_id)  # deleted meanwhile: stored nowhere
                                return
                            if error.code not in TRANSIENT or self.monotonic() > deadline:
                                raise
                        except BrokerUnavailable:
                            if self.monotonic() > deadline:
                                raise
                        # The master is away (a failover): send again to the one the name
                        # servers name next. What the lost send stored is kept: the message
                        # may then be in the partition twice (docs/rocketmq.md).
                        await anyio.sleep(RETRY_S)
                        route = await reroute(queue_id) or route
                    starts.setdefault(destination, first)
                    end = first + len(chunk)
                    if end > self.sent_end.get(destination, 0):
                        self.sent_end[destination] = end
                    for i, commit in zip(chunk, commits, strict=False):
                        if offsets[i] is None:
                            offsets[i] = commit

        await each(list(by_destination), to)
        return starts, offsets
