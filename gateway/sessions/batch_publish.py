"""A batch of publishes: routed one by one, stored as one append, confirmed in order.

Publishes that arrive together (``Session.handle_events``) come here. Each is routed
(publishing.py) on the channel it came on; what is routed is appended to the store in one
call, whatever the fan-out; the batch's confirms go to the session's confirm pipeline
(confirms.py), and then flow control (flow_control.py) may hold the connection. The loop over
the publishes is the hot path: it makes no call per message beyond routing and the tap.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gateway.amqp import AMQPError, Publish, frame_writer
from gateway.sessions.channel_state import ChannelState
from gateway.sessions.confirms import ConfirmTag
from gateway.sessions.flow_control import hold_for_publish_rate, hold_for_queues
from gateway.sessions.publish_lane import route_run as pure_route_run
from gateway.sessions.publishing import route_publish
from storage import AppendResult, Record, StoreError, twins
from storage.record import any_persistent

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime
    from gateway.sessions.session import Session

log = logging.getLogger("mqgw.connection")

route_run = twins.pick(pure_route_run)  # compiled when built (storage/twins.py)


async def publish_batch(session: Session, batch: list[Publish]) -> None:
    assert session.vhost is not None
    session.published = True
    records: list[Record] = []
    confirms: list[ConfirmTag] = []
    confirm_records: list[int] = []  # per confirm, its record's index (-1: none)
    woken: set[QueueRuntime] = set()
    now_ms = time.time_ns() // 1_000_000
    route_epoch = session.vhost.route_epoch
    channels, by_name = session.channels, session.vhost.queues
    lane = _lane_open(session)
    index, end = 0, len(batch)
    while index < end:
        if lane:  # the common publishes, up to the first that needs the general path
            index = route_run(
                batch, index, channels, by_name, now_ms, records, woken, confirms, confirm_records
            )
            if index == end:
                break
        publish = batch[index]
        index += 1
        channel = channels.get(publish.channel)
        if channel is None or channel.closing:
            continue
        try:
            record, queues, routed, rejected, held = route_publish(
                session, channel, publish, now_ms
            )
        except AMQPError as error:
            await session.fail(channel, error)
            lane = _lane_open(session)  # a tap or permissions may have changed meanwhile
            continue
        if session.tap is not None:
            record = session.tap.published(channel, publish, record, queues, now_ms)
        if not routed and publish.mandatory:
            _send_return(session, channel, publish)
        elif not routed:
            session.node.stats.drop_unroutable += 1
        if channel.tx_mode:
            if record is not None:
                channel.tx_publishes.append(record)
            channel.tx_publishes.extend(held)
            continue
        if record is not None:
            records.append(record)
            woken.update(queues)
        records.extend(held)  # copies held by delayed exchanges bound to this one
        if channel.confirm_mode:
            confirms.append((channel, channel.next_publish_tag, not rejected))
            confirm_records.append(len(records) - 1 - len(held) if record is not None else -1)
            channel.next_publish_tag += 1
    end_offset, ok = 0, True
    counts = session.node.stats
    counts.publish += len(batch)
    counts.publish_confirm += len(confirms)
    if records:
        records, result, ok = await _append(session, records, woken, route_epoch)
        end_offset = result.end_offset if result is not None else 0
        if end_offset >= session.node.next_resource_look:
            await session.node.look_at_resources(end_offset)
        if result is not None and result.refused:  # the broker's length limit: nack
            refused = {index for index, _, _ in result.refused}
            confirms = [
                (channel, tag, accepted and index not in refused)
                for (channel, tag, accepted), index in zip(confirms, confirm_records, strict=True)
            ]
    if session.tap is not None:
        session.tap.stored(ok)
    if confirms:
        if end_offset and _transient_only(session, records):
            end_offset = 0  # nothing to make durable: confirmed once stored, as RabbitMQ
        await session.confirm_send.send((confirms, end_offset, ok))
    if session.publish_limits is not None:
        await hold_for_publish_rate(session, batch)
    await hold_for_queues(session, woken)


def _lane_open(session: Session) -> bool:
    """Whether a batch may take the common-publish lane (publish_lane.py): nothing traced,
    and the default exchange usable and writable for this user (route_publish's checks)."""
    assert session.vhost is not None
    if session.tap is not None or session.grants.write.get("") is not True:
        return False
    exchange = session.vhost.router.get_exchange("")
    return exchange is not None and not exchange.internal


async def _append(
    session: Session, records: list[Record], woken: set[QueueRuntime], route_epoch: int
) -> tuple[list[Record], AppendResult | None, bool]:
    """The batch's one append (once per batch): the records as appended, the store's
    result (None if it failed), and whether the store took them."""
    vhost = session.vhost
    assert vhost is not None
    counts = session.node.stats
    result, ok = None, True
    for queue in woken:
        queue.appending += 1
    try:
        try:
            started = time.perf_counter()
            records = vhost.for_append(records, route_epoch)
            result = await vhost.append_routed(records, wait_durable=False)
            counts.append_latency.observe(time.perf_counter() - started)
            counts.appended_records += len(records)
        except StoreError as error:
            ok = False
            log.error(
                "connection %s: %d message(s) not stored: %s",
                session.id,
                len(records),
                error,
                extra={"connection": session.name},
            )
            vhost.count_out(records)
        await vhost.stored(woken, records, result)
    finally:
        for queue in woken:
            queue.appending -= 1
    return records, result, ok


def _transient_only(session: Session, records: list[Record]) -> bool:
    """A batch of transient messages only, on the embedded node: RabbitMQ confirms such
    messages without an fsync, and they do not outlive a restart there either. In a
    cluster every confirm waits for the broker (and its replicas): a failover must not
    take back what was confirmed."""
    if session.node.cluster is not None:
        return False
    return not any_persistent(records)


def _send_return(session: Session, channel: ChannelState, publish: Publish) -> None:
    session.node.stats.return_unroutable += 1
    frames = frame_writer.return_(
        channel.number,
        312,
        "NO_ROUTE",
        publish.exchange,
        publish.routing_key,
        publish.properties_bytes,
        publish.body,
        session.conn.frame_max,
    )
    session.conn.send_frames(channel.number, frames)
