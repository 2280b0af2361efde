"""A vhost's dead-letter outbox: what its queues dead-lettered (rejected, expired, over a
limit, past a backoff ladder) is routed again through the vhost's router and appended as one
batch by the node's outbox task. At-least-once letters are settled in their queue only once
their record is durable; a letter that could not be stored is kept and tried again."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.amqp.errors import AMQPError
from gateway.amqp.events import decode_properties
from gateway.amqp.property_bytes import PropertyError
from gateway.queues.dead_letter import DeadLetter, is_cycle, republish
from gateway.routing import UnknownExchange
from meta.models import QueueDef
from storage import Record, StoreError
from storage.record import PERSISTENT

if TYPE_CHECKING:
    from gateway.vhost.host import VirtualHost

log = logging.getLogger("mqgw.vhost")


async def flush(vhost: VirtualHost) -> int:
    """Republish what the vhost's queues dead-lettered since the last call; records stored."""
    letters, vhost.dead_letters = vhost.dead_letters, []
    for letter in letters:
        if letter.to_dlq and letter.dlrk is not None and letter.dlrk not in vhost.queues:
            await _declare_dlq(vhost, letter.queue, letter.dlrk)
    now_ms = vhost.scheduler.clock.wall_ms()
    records = []
    confirmed: list[DeadLetter] = []  # at-least-once: settled once their record is durable
    for letter in letters:
        record = _record(vhost, letter, now_ms)
        if record is not None:
            records.append(record)
            confirmed += [letter] if letter.settled is not None else []
        elif letter.settled is not None:
            vhost.dead_letters.append(letter)  # kept and retried (the node's housekeeping)
    try:
        await vhost.append(records, wait_durable=bool(confirmed))
    except StoreError as error:
        log.error("vhost %r: %d dead letter(s) not stored: %s", vhost.name, len(records), error)
        vhost.dead_letters += confirmed
        return 0
    for letter in confirmed:
        letter.settled()  # type: ignore[misc]  # not None: only such letters are here
    return len(records)


async def _declare_dlq(vhost: VirtualHost, source: str, name: str) -> None:
    """A backoff queue's dead-letter queue, made on first use, durable like its source."""
    origin = vhost.queues.get(source)
    durable = origin.definition.durable if origin is not None else True
    definition = QueueDef(vhost=vhost.name, name=name, durable=durable)
    try:
        await vhost.declare_queue(definition, passive=False, connection_id="")
        log.info("vhost %r: declared dead-letter queue %r for %r", vhost.name, name, source)
    except AMQPError as error:
        log.error("vhost %r: cannot declare %r: %s", vhost.name, name, error.reply_text)


def _record(vhost: VirtualHost, letter: DeadLetter, now_ms: int) -> Record | None:
    """The letter as a record routed from its dead-letter exchange, or None when it goes
    nowhere (its exchange gone, no queue bound, or a cycle RabbitMQ would cut)."""
    try:
        message = republish(letter, now_ms // 1000)
        headers = decode_properties(message.properties).headers
    except (PropertyError, IndexError, AMQPError) as error:
        log.warning("queue %r: a dead letter with unreadable properties dropped: %s",
                    letter.queue, error)  # fmt: skip
        return None
    try:
        routed = vhost.router.route(
            message.exchange, message.routing_key, headers, message.properties
        )
    except UnknownExchange:
        return None  # RabbitMQ drops a dead letter whose exchange is gone
    except AMQPError:
        return None
    targets = sorted(
        name
        for name in routed.queues
        if name in vhost.queues and not is_cycle(name, letter.reason, message.deaths)
    )
    if not targets:
        return None
    return Record(
        message.exchange.encode(),
        message.routing_key.encode(),
        message.properties,
        letter.body,
        tuple((vhost.queues[name].queue_id, 0) for name in targets),
        now_ms,
        PERSISTENT if letter.persistent else 0,
    )
