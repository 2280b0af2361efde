"""mqgw's stream extensions against a real gateway: a named consumer's tracked offset
(x-mqgw-stream-consumer-name) survives reconnects and a restart, and retention by
x-max-length-bytes and x-max-age drops a stream's oldest messages."""

from __future__ import annotations

import time
from typing import Any

from pamqp import commands as c

from tests.diff.raw import Message, RawClient
from tests.harness.processes import GatewayProcess, check_for

STREAM = {"x-queue-type": "stream"}


def _client(gateway: GatewayProcess) -> RawClient:
    client = RawClient(gateway.amqp_port)
    client.connect()
    client.open_channel(1)
    return client


def _publish(client: RawClient, queue: str, bodies: list[bytes]) -> None:
    client.rpc(1, c.Confirm.Select())
    for body in bodies:
        client.publish(1, "", queue, body)
        assert isinstance(client.next_method(1), c.Basic.Ack)


def _deliveries(client: RawClient, quiet_s: float = 0.4) -> list[tuple[int, int, bool, bytes]]:
    """(delivery tag, x-stream-offset, redelivered, body) of what arrives."""
    got = []
    for item in client.drain(1, quiet_s):
        if isinstance(item, Message) and isinstance(item.method, c.Basic.Deliver):
            offset = (item.properties.headers or {})["x-stream-offset"]
            got.append((item.method.delivery_tag, offset, item.method.redelivered, item.body))
    return got


def _consume(client: RawClient, queue: str, prefetch: int, **arguments: Any) -> None:
    client.rpc(1, c.Basic.Qos(prefetch_count=prefetch))
    reply = client.rpc(1, c.Basic.Consume(queue=queue, consumer_tag="t", arguments=arguments))
    assert isinstance(reply, c.Basic.ConsumeOk), reply


def test_a_named_consumer_resumes_after_reconnect_and_restart(gateway: GatewayProcess) -> None:
    named = {"x-mqgw-stream-consumer-name": "billing", "x-stream-offset": "first"}
    client = _client(gateway)
    client.rpc(1, c.Queue.Declare(queue="s", durable=True, arguments=STREAM))
    _publish(client, "s", [b"m%d" % i for i in range(10)])
    _consume(client, "s", 5, **named)
    first = _deliveries(client)
    assert [offset for _, offset, _, _ in first] == [0, 1, 2, 3, 4]
    client.send(1, c.Basic.Ack(delivery_tag=3, multiple=True))  # 0..2 done, 3 and 4 not
    assert [offset for _, offset, _, _ in _deliveries(client)] == [5, 6, 7]
    second = _client(gateway)  # the name is in use meanwhile
    second.rpc(1, c.Basic.Qos(prefetch_count=5))
    refused = second.rpc(1, c.Basic.Consume(queue="s", arguments=named))
    assert isinstance(refused, c.Channel.Close) and refused.reply_code == 403
    second.close()
    client.close()

    client = _client(gateway)  # x-stream-offset applies only the first time
    _consume(client, "s", 3, **{**named, "x-stream-offset": "last"})
    again = _deliveries(client)
    # From the lowest unacked offset (flagged redelivered while the position is in memory).
    assert [offset for _, offset, _, _ in again] == [3, 4, 5]
    client.send(1, c.Basic.Ack(delivery_tag=3, multiple=True))
    assert [offset for _, offset, _, _ in _deliveries(client)] == [6, 7, 8]
    client.send(1, c.Basic.Ack(delivery_tag=4))  # offset 6 acked: the position is 7
    time.sleep(0.1)
    client.close()
    gateway.stop()
    gateway.start()
    client = _client(gateway)
    _consume(client, "s", 10, **named)
    assert [offset for _, offset, _, _ in _deliveries(client)] == [7, 8, 9]
    client.close()


def test_retention_by_bytes_and_age(gateway: GatewayProcess) -> None:
    client = _client(gateway)
    arguments = {**STREAM, "x-max-length-bytes": 1000}
    client.rpc(1, c.Queue.Declare(queue="by-bytes", durable=True, arguments=arguments))
    _publish(client, "by-bytes", [b"%099d" % i for i in range(30)])  # 100 bytes each
    _consume(client, "by-bytes", 50, **{"x-stream-offset": "first"})
    assert [offset for _, offset, _, _ in _deliveries(client)] == list(range(20, 30))
    client.close()

    client = _client(gateway)
    arguments = {**STREAM, "x-max-age": "1s"}
    client.rpc(1, c.Queue.Declare(queue="by-age", durable=True, arguments=arguments))
    _publish(client, "by-age", [b"old"] * 5)

    def dropped() -> bool | None:
        status, queue = gateway.admin("GET", "/api/queues/%2F/by-age")
        assert status == 200
        return queue["messages_ready"] == 0 or None

    check_for(10, dropped, interval_s=0.2)
    _publish(client, "by-age", [b"new"])
    _consume(client, "by-age", 10, **{"x-stream-offset": "first"})
    assert [(offset, body) for _, offset, _, body in _deliveries(client)] == [(5, b"new")]
    client.close()
