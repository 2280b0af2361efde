"""A queue's run of messages to one consumer, framed and booked in one call
(``Session.deliver_run``, the sink's method the queue layer calls: gateway/queues/consumer.py).

Each message is booked (its delivery tag, and unacked unless no-ack), tapped, counted and
framed as ``Session.deliver`` does it alone; the run's frames go to the connection in one
``send_frames``. Before each run the queue asks ``Session.byte_room``: the bytes of output the
session takes before it is too far behind. This pure module is the reference; its compiled
twin (speedups/mqgw_speedups/deliver_run.pyx, picked by storage/twins.py) does the same for a
session without a tap or rate limits, and hands any other to this one.
tests/gateway/sessions/test_deliver_run_twins.py holds the two equal on real sessions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.amqp import frame_writer
from gateway.queues.consumer import DELIVERY_OVERHEAD_BYTES, Taken
from gateway.sessions.channel_state import Consumer, Delivery
from storage import twins

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime
    from gateway.sessions.session import Session

HIGH_WATER_BYTES = 4 << 20  # stop delivering to a connection whose output is this far behind
LOW_WATER_BYTES = 1 << 20  # and resume once it is back below this


def deliver_run(
    session: Session, consumer: Consumer, queue: QueueRuntime, run: list[Taken]
) -> None:
    """``session.deliver`` for each of ``run``, in one call."""
    channel = consumer.channel
    number, consumer_tag, no_ack = channel.number, consumer.tag, consumer.no_ack
    tap, limits = session.tap, session.limits
    at = session.now()  # one moment for the run (the consumer timeout reads it)
    one_write, frame_max = frame_writer.deliver_one_write, session.conn.frame_max
    unacked = channel.unacked
    pending = session.pending_bytes
    redeliveries = 0
    frames: list[frame_writer.Buffer] = []  # the run's, queued with one send_frames
    for partition, message, redelivered in run:
        tag = channel.next_delivery_tag  # ChannelState.record_delivery, inline
        channel.next_delivery_tag = tag + 1
        if no_ack:
            queue.settle(partition, message)
        else:
            unacked[tag] = Delivery(queue, partition, message, consumer, at)
            consumer.unacked += 1
        sent = message
        if tap is not None:
            sent = tap.delivered(channel, queue, message, redelivered, tag)
        redeliveries += redelivered
        _, _, exchange, key, properties, body, _, _, _ = sent
        frame = one_write(
            number, consumer_tag, tag, redelivered, exchange, key, properties, body, frame_max
        )  # frame_writer.deliver's common case, without its call
        if frame is not None:
            frames.append(frame)
        else:
            frames += frame_writer.deliver(
                number, consumer_tag, tag, redelivered, exchange, key, properties, body,
                frame_max,
            )  # fmt: skip
        if limits is not None:
            limits.take(len(body))
        pending += len(body) + DELIVERY_OVERHEAD_BYTES
    session.conn.send_frames(number, frames)  # dropped, as each would be, if channel closed
    counts = session.node.stats
    if no_ack:
        counts.deliver_no_ack += len(run)
    else:
        counts.deliver += len(run)
    counts.redeliver += redeliveries
    session.pending_bytes = pending
    if pending + session.sending_bytes > HIGH_WATER_BYTES:
        session.writable = False
    if not session.dirty_marked:
        session.mark_dirty()


def byte_room(session: Session) -> int:
    """Bytes of output the session takes before it is too far behind (``Session.byte_room``,
    asked before each run)."""
    return HIGH_WATER_BYTES - session.pending_bytes - session.sending_bytes


picked = twins.pick(deliver_run)  # what Session.deliver_run is
picked_byte_room = twins.pick(byte_room)  # what Session.byte_room is
