"""A read of one partition over RocketMQ pulls (see store.py): statuses as mqgw's store
gives them, the purge floor applied, pulled again until the read is full; a read below
what the store itself sent (``sent_end``) waits for RocketMQ's dispatch to index it."""

from __future__ import annotations

from storage.record import StoredMessage
from storage.results import ReadResult, ReadStatus
from storage.rocketmq.client import (
    PULL_OFFSET_MOVED,
    PULL_RETRY_IMMEDIATELY,
    SUCCESS,
    RocketMQClient,
    Route,
)
from storage.rocketmq.messages import decode_pulled

MAX_PULLS = 64  # per read: a broker answering 32 at a time still fills a read of 2,048
# A read that finds nothing below what this store sent holds its pull this long at most:
# the broker answers as soon as its dispatch has indexed the messages (milliseconds).
DISPATCH_WAIT_MS = 1000


async def read_partition(
    client: RocketMQClient,
    route: Route,
    group: str,
    topic: str,
    partition: int,
    offset: int,
    floor: int,
    max_count: int,
    max_bytes: int,
    wait_ms: int,
    sent_end: int = 0,
) -> ReadResult:
    moved = offset < floor
    at = max(offset, floor)
    messages: list[StoredMessage] = []
    size = 0
    low = high = 0
    for pull in range(MAX_PULLS):
        wait = wait_ms if pull == 0 and not moved else 0
        if not messages and at < sent_end:  # sent and confirmed here, not indexed yet
            wait = max(wait, DISPATCH_WAIT_MS)
        got = await client.pull(
            route.broker,
            group,
            topic,
            partition,
            at,
            max(1, max_count - len(messages)),
            max(1, max_bytes - size),
            wait,
        )
        low, high = max(got.min_offset, floor), got.max_offset
        if got.code == SUCCESS:
            for message in decode_pulled(got.body):
                if message.queue_offset < at:
                    continue  # a broker may answer from a batch's start
                if messages and (len(messages) >= max_count or size >= max_bytes):
                    break
                messages.append(message)
                size += len(message.body) + len(message.properties)
            at = max(at, got.next_offset) if not messages else messages[-1].queue_offset + 1
        elif got.code == PULL_OFFSET_MOVED and at < low:  # retention took it: go to the minimum
            moved, at = True, low
            continue
        elif got.code != PULL_RETRY_IMMEDIATELY:
            break
        if len(messages) >= max_count or size >= max_bytes or at >= high:
            break
    if messages:
        status = ReadStatus.MOVED if moved else ReadStatus.FOUND
        return ReadResult(status, messages, messages[-1].queue_offset + 1, low, high)
    if at > high:
        return ReadResult(ReadStatus.OFFSET_OVERFLOW, [], high, low, high)
    status = ReadStatus.MOVED if moved else ReadStatus.NO_NEW_MESSAGE
    return ReadResult(status, [], at, low, high)
