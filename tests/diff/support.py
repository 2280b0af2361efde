"""Run one scenario against RabbitMQ and the gateway and return both outcomes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
from pamqp import commands

from tests.diff.raw import Message, RawClient, describe_close


@dataclass(frozen=True)
class Server:
    name: str
    port: int

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def pika(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.url))

    def raw(self, **options: Any) -> RawClient:
        return RawClient(self.port, **options)


Scenario = Callable[[Server, str], Any]


def run_both(servers: list[Server], scenario: Scenario, prefix: str) -> tuple[Any, Any]:
    """(RabbitMQ's outcome, the gateway's outcome) of ``scenario``; compare them in the test."""
    rabbit, gateway = (scenario(server, prefix) for server in servers)
    return rabbit, gateway


def declare_outcomes(
    server: Server,
    prefix: str,
    argument_tables: list[dict[str, Any]],
    durable: Callable[[dict[str, Any]], bool],
) -> list[Any]:
    """Declare ``<prefix>-<i>`` with each argument table, each on a fresh connection: the
    queue's name, or the channel close it led to (``describe_close``). What was declared is
    deleted again."""
    outcomes = []
    for i, arguments in enumerate(argument_tables):
        with server.raw() as client:
            client.open_channel(1)
            queue = f"{prefix}-{i}"
            declare = commands.Queue.Declare(
                queue=queue, durable=durable(arguments), arguments=arguments
            )
            reply = client.rpc(1, declare)
            if isinstance(reply, commands.Channel.Close):
                outcomes.append(describe_close(reply))
                continue
            outcomes.append(reply.name)
            client.rpc(1, commands.Queue.Delete(queue=queue))
    return outcomes


def channel_error(call: Callable[[], object]) -> tuple[Any, ...]:
    """What a pika call led to: ('ok', result) or ('channel', code, text) for a close."""
    try:
        return ("ok", call())
    except pika.exceptions.ChannelClosedByBroker as error:
        return ("channel", error.reply_code, error.reply_text)
    except pika.exceptions.ConnectionClosedByBroker as error:
        return ("connection", error.reply_code, error.reply_text)


def drain_get(channel: Any, queue: str, auto_ack: bool = True) -> list[tuple[Any, ...]]:
    """basic.get until empty: (body, redelivered, exchange, routing key, message count)."""
    got = []
    while True:
        method, _props, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is None:
            return got
        got.append(
            (body, method.redelivered, method.exchange, method.routing_key, method.message_count)
        )


def normalize_name(value: Any) -> Any:
    """Server-generated names differ by design; keep only their prefix."""
    if isinstance(value, str):
        for prefix in ("amq.gen-", "amq.ctag-"):
            if value.startswith(prefix):
                return prefix + "*"
    return value


def describe(item: Any) -> Any:
    """A raw-client method or message as comparable data (closes with their ids)."""
    if isinstance(item, commands.Channel.Close | commands.Connection.Close):
        return describe_close(item)
    if isinstance(item, str):
        return item  # e.g. "socket closed"
    if isinstance(item, Message):
        fields = {k: normalize_name(v) for k, v in item.method}
        props = {k: v for k, v in item.properties if v is not None}
        return (item.method.name, fields, props, item.raw_properties.hex(), item.body)
    return (item.name, {k: normalize_name(v) for k, v in item})
