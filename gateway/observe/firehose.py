"""RabbitMQ's firehose: while tracing is on for a vhost (``PUT /api/vhosts/{name}``
``{"tracing": true}``, ``mqgw ctl trace on``), every publish and every delivery (consumer or
basic.get) in it is copied to the vhost's ``amq.rabbitmq.trace`` topic exchange.

The copies are what RabbitMQ 3.10's rabbit_trace publishes, field for field and type for type
(tests/observability/test_firehose_diff.py compares them with a real node): routing key
``publish.<exchange>`` (``publish.`` for the default exchange) or ``deliver.<queue>``, the
original body, and only a headers property holding ``exchange_name``, ``routing_keys``,
``properties`` (the message's properties as a table, integers as 32-bit signedint),
``node``, then ``redelivered`` for deliveries, ``vhost``, ``connection``, ``channel``,
``user``, and ``routed_queues`` for publishes. Messages of the trace exchange itself are not
traced (a firehose consumer would trace itself forever).

Like RabbitMQ's, the copies are fire-and-forget: routed when made, appended by the node's
outbox task (node.dead_letter_loop), never confirmed. Off, a vhost has no Firehose at all.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gateway.amqp import property_bytes as pb
from gateway.routing import UnknownExchange
from storage import Record, StoredMessage, StoreError

if TYPE_CHECKING:
    from gateway.ports import VhostPort

log = logging.getLogger("mqgw.trace")

TRACE_EXCHANGE = "amq.rabbitmq.trace"
_TRACE_EXCHANGE_BYTES = TRACE_EXCHANGE.encode()
_SIGNED_32 = struct.Struct(">i")
_UNSIGNED_32 = struct.Struct(">I")
MAX_PENDING = 100_000  # trace copies waiting for the outbox task; beyond this they are dropped

# The basic properties in the order rabbit_trace:msg_to_table/1 lists them (the reverse of
# the P_basic record, as its fold prepends): (flag bit, name, how the value is written).
_TABLE_ORDER = (
    (pb.CLUSTER_ID, "cluster_id", "S"),
    (pb.APP_ID, "app_id", "S"),
    (pb.USER_ID, "user_id", "S"),
    (pb.TYPE, "type", "S"),
    (pb.TIMESTAMP, "timestamp", "I"),
    (pb.MESSAGE_ID, "message_id", "S"),
    (pb.EXPIRATION, "expiration", "S"),
    (pb.REPLY_TO, "reply_to", "S"),
    (pb.CORRELATION_ID, "correlation_id", "S"),
    (pb.PRIORITY, "priority", "I"),
    (pb.DELIVERY_MODE, "delivery_mode", "I"),
    (pb.HEADERS, "headers", "F"),
    (pb.CONTENT_ENCODING, "content_encoding", "S"),
    (pb.CONTENT_TYPE, "content_type", "S"),
)


class Firehose:
    """One vhost's firehose: builds the trace copies and hands them to the outbox."""

    def __init__(self, vhost: VhostPort, node_name: str) -> None:
        self.vhost = vhost
        self.node_name = node_name
        self.pending: list[Record] = []
        self.dropped = 0

    def published(
        self,
        connection: str,
        user: str,
        channel: int,
        exchange: str,
        routing_key: str,
        properties: bytes | memoryview,
        body: bytes | bytearray | memoryview,
        routed_queues: Iterable[str],
    ) -> None:
        """rabbit_trace:tap_in: a publish, whether or not it reached a queue."""
        key = "publish." + exchange
        destinations = self._destinations(key)
        if not destinations:
            return
        properties_table, keys = _describe(properties, routing_key)
        extra = [
            ("vhost", "S", pb.longstr(self.vhost.name)),
            ("connection", "S", pb.longstr(connection)),
            ("channel", "I", _SIGNED_32.pack(channel)),
            ("user", "S", pb.longstr(user)),
            ("routed_queues", "A", _string_array(routed_queues)),
        ]
        self._emit(key, destinations, exchange, keys, properties_table, extra, body)

    def delivered(
        self,
        connection: str,
        user: str,
        channel: int,
        queue: str,
        message: StoredMessage,
        redelivered: bool,
    ) -> None:
        """rabbit_trace:tap_out: a delivery to a consumer or a basic.get."""
        if message.exchange == _TRACE_EXCHANGE_BYTES:
            return
        key = "deliver." + queue
        destinations = self._destinations(key)
        if not destinations:
            return
        properties_table, keys = _describe(message.properties, message.routing_key.decode())
        extra = [
            ("redelivered", "I", _SIGNED_32.pack(1 if redelivered else 0)),
            ("vhost", "S", pb.longstr(self.vhost.name)),
            ("connection", "S", pb.longstr(connection)),
            ("channel", "I", _SIGNED_32.pack(channel)),
            ("user", "S", pb.longstr(user)),
        ]
        exchange = message.exchange.decode()
        self._emit(key, destinations, exchange, keys, properties_table, extra, message.body)

    def _destinations(self, key: str) -> tuple[tuple[int, int], ...]:
        """Where a copy with routing key ``key`` goes (nowhere: it is not even built)."""
        vhost = self.vhost
        try:
            routed = vhost.router.route(TRACE_EXCHANGE, key)
        except UnknownExchange:  # the trace exchange deleted (RabbitMQ then traces nowhere)
            return ()
        queues = vhost.queues
        return tuple((queues[name].queue_id, 0) for name in sorted(routed.queues) if name in queues)

    def _emit(
        self,
        key: str,
        destinations: tuple[tuple[int, int], ...],
        exchange: str,
        routing_keys: list[str],
        properties_table: bytes,
        extra: list[tuple[str, str, bytes]],
        body: bytes | bytearray | memoryview,
    ) -> None:
        if len(self.pending) >= MAX_PENDING:
            self.dropped += 1
            return
        headers = [
            ("exchange_name", "S", pb.longstr(exchange)),
            ("routing_keys", "A", _string_array(routing_keys)),
            ("properties", "F", properties_table),
            ("node", "S", pb.longstr(self.node_name)),
            *extra,
        ]
        properties = pb.join_properties({pb.HEADERS: pb.join_table(headers)})
        self.pending.append(
            Record(
                _TRACE_EXCHANGE_BYTES,
                key.encode(),
                properties,
                bytes(body),  # the frame or read buffer it came in is reused
                destinations,
                time.time_ns() // 1_000_000,
                0,  # transient, as rabbit_trace publishes
            )
        )
        if len(self.pending) == 1:
            self.vhost.on_dead_letter()  # wakes the node's outbox task, which calls flush()

    async def flush(self) -> None:
        """Append what is pending (the node's outbox task)."""
        pending, self.pending = self.pending, []
        if self.dropped:
            log.warning("vhost %r: %d firehose message(s) dropped: more than %d waiting",
                        self.vhost.name, self.dropped, MAX_PENDING)  # fmt: skip
            self.dropped = 0
        live = self.vhost.queues_by_id  # a trace queue may have gone since the copy was made
        records = []
        for record in pending:
            destinations = tuple(d for d in record.destinations if d[0] in live)
            if destinations:
                records.append(record._replace(destinations=destinations))
        if not records:
            return
        try:
            await self.vhost.append(records)
        except StoreError as error:
            log.error("vhost %r: %d firehose message(s) lost: %s", self.vhost.name,
                      len(records), error)  # fmt: skip


def _describe(properties: bytes | memoryview, routing_key: str) -> tuple[bytes, list[str]]:
    """The ``properties`` table of a trace message and its ``routing_keys``: the key, then
    the CC and BCC headers' strings (rabbit_basic:header_routes/1); BCC leaves the table."""
    try:
        fields = pb.split_properties(properties)
    except pb.PropertyError:
        fields = {}
    entries: list[tuple[str, str, bytes]] = []
    keys = [routing_key]
    for bit, name, tag in _TABLE_ORDER:
        raw = fields.get(bit)
        if raw is None:
            continue
        if tag == "F":
            raw, copies = _without_bcc(raw)
            keys.extend(copies)
        elif tag == "I":  # delivery_mode, priority (one octet), timestamp (8): 32-bit, wrapped
            value = int.from_bytes(raw, "big") & 0xFFFFFFFF
            raw = _UNSIGNED_32.pack(value)
        else:  # shortstr -> longstr
            raw = _UNSIGNED_32.pack(len(raw) - 1) + raw[1:]
        entries.append((name, tag, raw))
    return pb.join_table(entries), keys


def _without_bcc(table: bytes) -> tuple[bytes, list[str]]:
    """The headers table as stored (BCC removed) and the CC then BCC routing keys."""
    try:
        entries = pb.split_table(table)
    except (pb.PropertyError, IndexError, struct.error):
        return table, []
    routes: dict[str, list[str]] = {"CC": [], "BCC": []}
    for key, tag, raw in entries:
        if key in routes and tag == "A":
            items = pb.split_array(raw)
            routes[key] = [pb.decode_scalar("S", value) for t, value in items if t == "S"]
    if not routes["BCC"] and not any(key == "BCC" for key, _, _ in entries):
        return table, routes["CC"]
    kept = [entry for entry in entries if entry[0] != "BCC"]
    return pb.join_table(kept), routes["CC"] + routes["BCC"]


def _string_array(items: Iterable[str]) -> bytes:
    return pb.join_array(("S", pb.longstr(item)) for item in items)
