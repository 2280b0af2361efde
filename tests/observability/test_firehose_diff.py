"""The firehose against RabbitMQ 3.10's: the same scenario on both servers (publishes to the
default, a direct and a fanout exchange, with CC and BCC, unroutable and mandatory; basic.get
with and without ack; a consumer; reject and nack with requeue, so redeliveries) and the trace
messages a firehose queue receives, compared byte-exactly by wire type, in order, with only
node and connection names blanked.

One known difference: RabbitMQ keeps a message's BCC routing keys in its in-memory message and
lists them in ``routing_keys`` when it delivers; mqgw stores the message without BCC (as
consumers get it), so its deliver traces list the key and CC only. That single field is
aligned before comparing (``without_bcc_in_deliveries``); publish traces list BCC on both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from bench.rabbitmq_node import RabbitMQProcess
from bench.servers import GatewayServer
from tests.observability.firehose_reader import FirehoseReader, normalise

FULL_PROPERTIES = pika.BasicProperties(
    content_type="text/plain",
    content_encoding="utf-8",
    headers={
        "text": "x",
        "small": 7,
        "big": 2**40,
        "yes": True,
        "nested": {"list": [1, "a"], "n": None},
        "CC": ["qb"],
    },
    delivery_mode=2,
    priority=5,
    correlation_id="corr",
    reply_to="replies",
    expiration="600000",
    message_id="m-1",
    timestamp=5_000_000_000,  # wraps in the 32-bit signedint RabbitMQ writes
    type="kind",
    user_id="guest",
    app_id="app",
)


def run_scenario(port: int) -> list[dict[str, Any]]:
    """Drive the scenario, waiting after each step for its trace messages (so the order is
    the server's, not a race), and return every trace message, normalised."""
    reader = FirehoseReader(port)
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1)
    )
    expected = 0

    def step(traces: int, action: Callable[[BlockingChannel], object]) -> None:
        nonlocal expected
        action(channel)
        expected += traces
        reader.wait_for(expected)

    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for queue in ("qa", "qb"):
            channel.queue_declare(queue, auto_delete=True)
        channel.exchange_declare("dx", "direct", auto_delete=True)
        channel.exchange_declare("fx", "fanout", auto_delete=True)
        channel.queue_bind("qa", "dx", "k")
        channel.queue_bind("qb", "dx", "hidden")
        channel.queue_bind("qa", "fx")
        channel.queue_bind("qb", "fx")
        # Publishes: default exchange with every property (CC adds qb), direct with BCC,
        # fanout to both queues, and an unroutable mandatory one (returned, still traced).
        step(1, lambda ch: ch.basic_publish("", "qa", b"one", FULL_PROPERTIES))
        bcc = pika.BasicProperties(headers={"BCC": ["hidden"], "keep": "me"})
        step(1, lambda ch: ch.basic_publish("dx", "k", b"two", bcc))
        step(1, lambda ch: ch.basic_publish("fx", "ignored", b"three"))
        step(1, _unroutable)
        # basic.get without ack; with ack, rejected with requeue, got again (redelivered).
        step(1, lambda ch: ch.basic_get("qa", auto_ack=True))
        step(2, lambda ch: _get_reject_get(ch, "qa"))
        # A consumer: three deliveries, the first nacked with requeue comes back redelivered.
        step(4, lambda ch: _consume_nack_first(ch, "qb", 3))
        step(1, lambda ch: ch.basic_get("qa", auto_ack=True))
        return [normalise(message) for message in reader.seen]
    finally:
        connection.close()
        reader.close()


def _unroutable(channel: BlockingChannel) -> None:
    with pytest.raises(pika.exceptions.UnroutableError):  # returned, and confirmed
        channel.basic_publish("dx", "nowhere", b"lost", mandatory=True)


def _get_reject_get(channel: BlockingChannel, queue: str) -> None:
    method, _, _ = channel.basic_get(queue)
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=True)
    again, _, _ = channel.basic_get(queue)
    assert again is not None and again.redelivered
    channel.basic_ack(again.delivery_tag)


def _consume_nack_first(channel: BlockingChannel, queue: str, count: int) -> None:
    channel.basic_qos(prefetch_count=10)
    received = []
    for method, _, _ in channel.consume(queue, inactivity_timeout=10):
        assert method is not None, "the consumer got nothing"
        received.append(method)
        if len(received) == 1:
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:
            channel.basic_ack(method.delivery_tag)
        if len(received) == count + 1:
            break
    channel.cancel()
    assert received[-1].redelivered and not any(m.redelivered for m in received[:-1])


def without_bcc_in_deliveries(trace: dict[str, Any], bcc: str) -> dict[str, Any]:
    if not trace["routing_key"].startswith("deliver."):
        return trace
    headers = [
        (k, t, [item for item in v if item != ("S", bcc)] if k == "routing_keys" else v)
        for k, t, v in trace["headers"]
    ]
    return {**trace, "headers": headers}


def test_firehose_messages_equal_rabbitmqs(
    traced_rabbitmq: RabbitMQProcess, gateway: GatewayServer
) -> None:
    assert gateway.admin("PUT", "/api/vhosts/%2F", {"tracing": True})[0] == 204
    rabbitmqs = run_scenario(traced_rabbitmq.amqp_port)
    expected = [without_bcc_in_deliveries(trace, "hidden") for trace in rabbitmqs]
    assert expected != rabbitmqs  # the aligned field was there (the scenario delivers it)
    got = run_scenario(gateway.amqp_port)
    assert len(expected) == 12
    kinds = [m["routing_key"] for m in expected]
    assert kinds[:5] == ["publish.", "publish.dx", "publish.fx", "publish.dx", "deliver.qa"]
    for index, (theirs, ours) in enumerate(zip(expected, got, strict=True)):
        assert ours == theirs, f"trace message {index} ({theirs['routing_key']}) differs"
