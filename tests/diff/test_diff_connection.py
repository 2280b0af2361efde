"""Connection and channel behaviour, compared with RabbitMQ 3.10: connection.start's
server properties, channel.flow, and the order of queue.delete-ok and the basic.cancel
that deleting a consumed queue causes."""

from __future__ import annotations

import time
from typing import Any

from pamqp import commands as c

from tests.diff.raw import RawClient
from tests.diff.support import Server, describe, run_both


def test_server_properties_have_rabbitmq_keys(servers: list[Server], names: str) -> None:
    """Tools show cluster_name, copyright and information; the values are each server's."""

    def scenario(server: Server, p: str) -> Any:
        with server.raw() as client:
            assert isinstance(client.start, c.Connection.Start)
            properties = client.start.server_properties
            return sorted((key, type(value).__name__) for key, value in properties.items())

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert ("cluster_name", "str") in rabbit and ("information", "str") in rabbit


def test_channel_flow(servers: list[Server], names: str) -> None:
    """active=true is answered; active=false closes the connection (540), as 3.10 does."""

    def scenario(server: Server, p: str) -> Any:
        with server.raw() as client:
            client.open_channel(1)
            seen = [describe(client.rpc(1, c.Channel.Flow(active=True)))]
            seen.append(describe(client.rpc(1, c.Channel.Flow(active=False))))
            return seen

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit == [
        ("Channel.FlowOk", {"active": True}),
        ("connection", 540, "NOT_IMPLEMENTED - active=false", 20, 20),
    ]


def _frames_for(client: RawClient, quiet_s: float = 0.5) -> dict[int, list[Any]]:
    """Everything the server sends until it is quiet, per channel, in order."""
    per_channel: dict[int, list[Any]] = {}
    while True:
        try:
            channel, item = client._read_item(time.monotonic() + quiet_s)
        except TimeoutError:
            return per_channel
        per_channel.setdefault(channel, []).append(describe(item))


def test_deleting_a_consumed_queue_answers_before_cancelling(
    servers: list[Server], names: str
) -> None:
    """queue.delete-ok, then basic.cancel on the deleting channel (py-amqp and kombu raise
    ConsumerCancelled on the other order); the other channel's consumer is cancelled too."""

    def scenario(server: Server, p: str) -> Any:
        with server.raw() as client:
            client.open_channel(1)
            client.open_channel(2)
            client.rpc(1, c.Queue.Declare(queue=f"{p}-q"))
            client.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="mine"))
            client.rpc(2, c.Basic.Consume(queue=f"{p}-q", consumer_tag="other"))
            client.send(1, c.Queue.Delete(queue=f"{p}-q"))
            return _frames_for(client)

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit == {
        1: [
            ("Queue.DeleteOk", {"message_count": 0}),
            ("Basic.Cancel", {"consumer_tag": "mine", "nowait": True}),
        ],
        2: [("Basic.Cancel", {"consumer_tag": "other", "nowait": True})],
    }
