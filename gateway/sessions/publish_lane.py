"""The common publish routed without the general path: to the default exchange, a queue of
one partition, no headers, user-id, reply-to or expiration, outside tx mode.

``route_run`` takes a batch's publishes from ``start`` while each is that common case, and
does for each what ``route_publish`` (publishing.py) and ``publish_batch``'s loop
(batch_publish.py) would: hands a transient one without a confirm to a no-ack consumer at
once when its queue can (``deliver_now``), or counts it into its queue, makes its store
record and books its publisher confirm. It stops at the first publish it leaves to them (an
unknown channel, another exchange, properties to decode, a queue that may refuse, anything
unusual) and returns that index, so the caller routes that one the general way and comes
back. The caller opens the lane once per batch (``_lane_open``): no tap, the default
exchange usable and writable for this user.

The hot path of every publish, kept apart so that it has a compiled twin:
``speedups/mqgw_speedups/publish_lane.pyx`` does the same in C, and ``storage.twins`` picks
it when it is built (``MQGW_PURE_PYTHON=1`` forces this module). This module is the
reference: tests/gateway/sessions/test_publish_lane.py holds the twins and route_publish
equal on random batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.amqp.property_bytes import (
    CONTENT_ENCODING,
    CONTENT_TYPE,
    DELIVERY_MODE,
    EXPIRATION,
    HEADERS,
    REPLY_TO,
    USER_ID,
)
from gateway.features.direct_reply import REPLY_PREFIX
from gateway.sessions.publishing import _delivery_mode
from storage import Record
from storage.record import PERSISTENT

if TYPE_CHECKING:
    from gateway.amqp import Publish
    from gateway.queues.runtime import QueueRuntime
    from gateway.sessions.channel_state import ChannelState
    from gateway.sessions.confirms import ConfirmTag

# tuple.__new__ skips a NamedTuple's Python-level __new__ (a frame per message saved).
_make_tuple = tuple.__new__

# Property flags that send a publish to the general path (decoded there), and those that
# lie before delivery-mode in the property bytes.
_GENERAL = HEADERS | REPLY_TO | EXPIRATION | USER_ID
_BEFORE_DELIVERY_MODE = CONTENT_TYPE | CONTENT_ENCODING


def route_run(
    batch: Sequence[Publish],
    start: int,
    channels: Mapping[int, ChannelState],
    queues: Mapping[str, QueueRuntime],
    now_ms: int,
    records: list[Record],
    woken: set[QueueRuntime],
    confirms: list[ConfirmTag],
    confirm_records: list[int],
) -> int:
    """Route ``batch[start:]`` while each publish is the common case; the index of the first
    one left to the general path (``len(batch)``: none)."""
    index = start
    end = len(batch)
    while index < end:
        publish = batch[index]
        channel = channels.get(publish.channel)
        if channel is None or channel.closing or channel.tx_mode:
            return index
        if publish.exchange or publish.immediate:
            return index
        properties = publish.properties_bytes
        size = len(properties)
        flags = properties[0] << 8 | properties[1] if size >= 2 else 0
        if flags & _GENERAL:
            return index
        delivery_mode = 0
        if flags & DELIVERY_MODE:
            # As route_publish reads it: the first property present, or past the others.
            if not flags & _BEFORE_DELIVERY_MODE and size > 2:
                delivery_mode = properties[2]
            else:
                delivery_mode = _delivery_mode(properties, flags)  # -1: cut short
            if delivery_mode not in (1, 2):
                return index  # the general path's 406 (or its decoder's error)
        key = publish.routing_key
        if key.startswith(REPLY_PREFIX):
            return index
        queue = queues.get(key)
        if queue is None or queue.rejects_publish or queue.partitions != 1:
            return index
        body = publish.body
        if (
            queue.plain
            and delivery_mode != 2
            and not channel.confirm_mode
            and queue.deliver_now("", key, properties, body, now_ms)
        ):
            index += 1  # handed to a no-ack consumer at once: nothing to store
            continue
        record_flags = PERSISTENT if delivery_mode == 2 else 0
        queue.ready_count += 1  # queue.count_in, without its call (no expiration here)
        queue.ready_bytes += len(body)
        queue.enqueued += 1
        fields: tuple[Any, ...] = (
            b"",
            key.encode(),
            properties,
            body,
            ((queue.queue_id, 0),),
            now_ms,
            record_flags,
        )
        records.append(_make_tuple(Record, fields))
        woken.add(queue)
        if channel.confirm_mode:
            confirms.append((channel, channel.next_publish_tag, True))
            confirm_records.append(len(records) - 1)
            channel.next_publish_tag += 1
        index += 1
    return index
