"""Read a firehose queue byte-exactly and turn each trace message into comparable data.

pika would decode a 32-bit ``I`` and a 64-bit ``l`` to the same int; the raw client
(tests/diff/raw.py) gives the property bytes as the server sent them, so the comparison
includes every field-table type tag. What differs between two servers by nature (the node
name, the connection's ports) is replaced by a placeholder of the same type.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands

from bench.servers import check_for
from gateway.amqp import property_bytes as pb
from tests.diff.raw import Message, RawClient

TRACE_EXCHANGE = "amq.rabbitmq.trace"
VARYING = {"node", "connection"}  # per server and per connection by nature


def typed(tag: str, raw: bytes) -> Any:
    """A field value with its wire type: tables and arrays as nested lists."""
    if tag == "F":
        return [(key, t, typed(t, value)) for key, t, value in pb.split_table(raw)]
    if tag == "A":
        return [(t, typed(t, value)) for t, value in pb.split_array(raw)]
    if tag == "S":
        return raw[4:].decode()
    return raw.hex()


def normalise(message: Message) -> dict[str, Any]:
    """One trace message as data: its key, exchange, body, typed headers and other
    properties (raw), with node and connection names blanked."""
    method = message.method
    fields = pb.split_properties(message.raw_properties)
    table = fields.pop(pb.HEADERS, None)
    headers = [] if table is None else typed("F", table)
    headers = [(k, t, "<varies>" if k in VARYING else v) for k, t, v in headers]
    return {
        "routing_key": method.routing_key,
        "exchange": method.exchange,
        "body": message.body,
        "headers": headers,
        "other_properties": {bit: raw.hex() for bit, raw in sorted(fields.items())},
    }


class FirehoseReader:
    """A queue bound to amq.rabbitmq.trace with "#", drained with basic.get."""

    def __init__(self, port: int, queue: str = "firehose", vhost: str = "/") -> None:
        self.client = RawClient(port, vhost=vhost)
        self.client.connect()
        self.client.open_channel(1)
        self.queue = queue
        ok = self.client.rpc(1, commands.Queue.Declare(queue=queue, exclusive=True))
        assert isinstance(ok, commands.Queue.DeclareOk), ok
        bind = commands.Queue.Bind(queue=queue, exchange=TRACE_EXCHANGE, routing_key="#")
        assert isinstance(self.client.rpc(1, bind), commands.Queue.BindOk)
        self.seen: list[Message] = []

    def _get_one(self) -> bool:
        item = self.client.rpc(1, commands.Basic.Get(queue=self.queue, no_ack=True))
        if isinstance(item, Message):
            self.seen.append(item)
            return True
        assert isinstance(item, commands.Basic.GetEmpty), item
        return False

    def wait_for(self, count: int, timeout_s: float = 10) -> list[Message]:
        """Read until ``count`` trace messages in all have arrived; returns them all."""

        def enough() -> bool:
            while len(self.seen) < count and self._get_one():
                pass
            return len(self.seen) >= count

        check_for(timeout_s, enough, interval_s=0.02)
        return self.seen

    def close(self) -> None:
        self.client.close()
