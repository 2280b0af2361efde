"""The ``x-delayed-message`` exchange, as rabbitmq-delayed-message-exchange behaves.

Checked against the plugin's source and README (rabbit_exchange_type_delayed_message.erl,
rabbit_delayed_message.erl, rabbit_delayed_message_utils.erl); Debian's rabbitmq-server has no
such plugin, so there is no differential test:
- Declaring needs ``x-delayed-type`` naming an existing type (406 otherwise; an unknown type
  name is 503 "unknown exchange type"). Only a new exchange is validated, as in the plugin
  (meta/checks.py: check_delayed_exchange).
- A publish whose ``x-delay`` header is an integer (or a float, truncated; or a numeric
  string) with 0 < x-delay <= 2^32-1 ms is held, then routed through the exchange's
  bindings as they are at delivery time, by the ``x-delayed-type`` rules. Anything else
  routes at once. A delivered message carries ``x-delay`` negated (the plugin's "was delayed"
  marker).
- The plugin routes a delayed message to no queue at publish, so ``mandatory`` publishes get
  basic.return 312 NO_ROUTE at once, and are still delivered later. Confirms come once the
  timer record is durable (the plugin confirms at once).
- An exchange deleted before delivery drops its delayed messages (counted, logged).
Not copied: the plugin also hands every delayed message to the exchange's alternate exchange
at publish time (its issue #36), which delivers it twice.

Held messages live in the log timer (gateway/features/log_timer.py), on disk: a million of them cost
disk, not memory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.amqp import Publish, decode_properties, frame_writer
from gateway.amqp.property_bytes import keep_timestamp
from gateway.features.gray import marked_gray
from gateway.features.log_timer import LogTimer, TimerItem, TimerMessage
from gateway.routing import strip_bcc
from meta.errors import MetaError
from meta.models import BUILTIN_EXCHANGE_TYPES, DELAYED_MESSAGE_EXCHANGE_TYPE
from storage import Record

if TYPE_CHECKING:
    from gateway.ports import VhostPort

log = logging.getLogger("mqgw.delayed")

DELAYED_KIND = 1  # this exchange's kind in the log timer
DELAY_HEADER = "x-delay"
TYPE_ARGUMENT = "x-delayed-type"
MAX_DELAY_MS = (1 << 32) - 1  # the plugin's ?ERL_MAX_T; longer delays route at once
EXCHANGE_TYPES = BUILTIN_EXCHANGE_TYPES | {DELAYED_MESSAGE_EXCHANGE_TYPE}


def delay_of(headers: Mapping[str, Any]) -> int | None:
    """The delay to hold a message for, or None to route it at once (get_delay/1)."""
    value = headers.get(DELAY_HEADER)
    delay: int | None = None
    if isinstance(value, bool):
        return None  # an AMQP boolean, not one of the plugin's integer types
    if isinstance(value, int):
        delay = value
    elif isinstance(value, float) and math.isfinite(value):
        delay = math.trunc(value)
    elif isinstance(value, str | bytes):
        try:
            delay = int(value)
        except ValueError:
            return None  # the plugin's conversion crashes here; routing at once is kinder
    if delay is None or not 0 < delay <= MAX_DELAY_MS:
        return None
    return delay


def hold(
    timer: LogTimer,
    vhost: str,
    publish: Publish,
    headers: Mapping[str, Any],
    flags: int,
    now_ms: int,
    target: str | None = None,
) -> Record:
    """The timer record for a publish held by a delayed exchange: the one published to, or
    ``target`` when routing reached it through an exchange-to-exchange binding (delivered
    messages keep the exchange they were published to, as with the plugin). Only for
    headers whose delay_of() is not None.

    ``headers`` are the publish's own (BCC included: routing at delivery needs it);
    ``publish.properties`` are as routing left them (reply-to rewritten).
    """
    delay = delay_of(headers)
    assert delay is not None, "hold() of a message that routes at once"
    properties = publish.properties
    original = properties.headers
    properties.headers = {**headers, DELAY_HEADER: -delay}
    try:
        encoded = frame_writer.encode_properties(properties)
        properties_bytes = keep_timestamp(publish.properties_bytes, encoded)
    finally:
        properties.headers = original
    message = TimerMessage(
        vhost,
        publish.exchange if target is None else target,
        publish.exchange.encode(),
        publish.routing_key.encode(),
        properties_bytes,
        publish.body,
        flags,
        now_ms,
    )
    return timer.schedule(DELAYED_KIND, now_ms + delay, message, now_ms=now_ms)


class DelayedDelivery:
    """The timer's fire handler for this exchange: route at delivery time, append normally."""

    def __init__(self, vhosts: Mapping[str, VhostPort]) -> None:
        self.vhosts = vhosts
        self.delivered = 0
        self.unroutable = 0
        self.dropped = 0  # exchange (or vhost) deleted while the message waited

    async def fire(self, items: list[TimerItem]) -> None:
        """Route each item now and append it, one batch per vhost, durably."""
        batches: dict[str, list[Record]] = {}
        dropped = 0
        for item in items:
            m = item.message
            vhost = self.vhosts.get(m.vhost)
            if vhost is None or vhost.router.get_exchange(m.target) is None:
                dropped += 1
                continue
            record = _deliverable(vhost, m)
            if record is None:
                self.unroutable += 1  # as in the plugin: nothing to return it to
            else:
                batches.setdefault(m.vhost, []).append(record)
        for name, records in batches.items():
            await self.vhosts[name].append(records, wait_durable=True)
            self.delivered += len(records)
        self.dropped += dropped
        if dropped:
            log.warning("%d delayed message(s) dropped: their exchange was deleted", dropped)


def _deliverable(vhost: VhostPort, m: TimerMessage) -> Record | None:
    """The message as a normal record for the queues it reaches now (None: unroutable)."""
    properties = decode_properties(m.properties)
    headers = properties.headers
    try:
        result = vhost.router.route(m.target, m.routing_key.decode(), headers, m.properties)
    except MetaError:  # CC/BCC of a type routing refuses
        return None
    queues = [vhost.queues[name] for name in sorted(result.queues) if name in vhost.queues]
    if not queues:
        return None
    properties_bytes = m.properties
    if headers and "BCC" in headers:
        properties.headers = strip_bcc(dict(headers))
        properties_bytes = keep_timestamp(m.properties, frame_writer.encode_properties(properties))
    gray = marked_gray(headers)  # a held gray message keeps its color when it fires
    destinations = tuple((q.queue_id, q.pick_partition(gray)) for q in queues)
    return Record(
        m.exchange, m.routing_key, properties_bytes, m.body, destinations, m.born_ts_ms, m.flags
    )
