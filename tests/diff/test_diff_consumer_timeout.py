"""Consumer timeout compared with RabbitMQ: a delivery left unacked past the timeout closes
its channel with 406 and the message is redelivered. Both servers run with a 300 ms timeout
(RabbitMQ checks it on its channel tick, set to 50 ms here), so nothing waits for minutes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pamqp import commands as c

from tests.diff.support import Server, describe, run_both
from tests.harness.processes import GatewayProcess
from tests.harness.rabbitmq import RabbitMQProcess

TIMEOUT_MS = 300


@pytest.fixture(scope="module")
def timeout_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    advanced = f"[{{rabbit, [{{consumer_timeout, {TIMEOUT_MS}}}, {{channel_tick_interval, 50}}]}}]."
    rabbit = RabbitMQProcess(tmp_path_factory.mktemp("rabbitmq-timeout"), advanced).start()
    gateway = GatewayProcess(
        tmp_path_factory.mktemp("gateway-timeout") / "data",
        env={"MQGW_CONSUMER_TIMEOUT_MS": str(TIMEOUT_MS)},
    ).start()
    try:
        yield [Server("rabbitmq", rabbit.amqp_port), Server("gateway", gateway.amqp_port)]
    finally:
        gateway.stop()
        rabbit.stop()


def _held_too_long(server: Server, p: str) -> Any:
    with server.raw() as client:
        client.open_channel(1)
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q"))
        client.rpc(1, c.Confirm.Select())
        for body in (b"a", b"b"):
            client.publish(1, "", f"{p}-q", body)
            client.next_method(1)
        client.rpc(1, c.Basic.Qos(prefetch_count=1))
        client.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="slow"))
        first = describe(client.next_item(1))
        closed = describe(client.next_item(1, timeout_s=10))  # the 406, unprompted
        client.send(1, c.Channel.CloseOk())
        client.open_channel(2)
        again = describe(client.rpc(2, c.Basic.Get(queue=f"{p}-q", no_ack=True)))
        count = client.rpc(2, c.Queue.Declare(queue=f"{p}-q", passive=True)).message_count
        return first, closed, again, count


def _acked_in_time(server: Server, p: str) -> Any:
    with server.raw() as client:
        client.open_channel(1)
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q"))
        client.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="quick"))
        got = []
        for i in range(3):
            client.publish(1, "", f"{p}-q", b"m%d" % i)
            delivery = client.next_item(1)
            got.append(describe(delivery))
            client.send(1, c.Basic.Ack(delivery_tag=dict(delivery.method)["delivery_tag"]))
        # Well past the timeout with nothing unacked: the channel stays open.
        later = client.drain(1, timeout_s=3 * TIMEOUT_MS / 1000)
        return got, later


@pytest.mark.parametrize("scenario", [_held_too_long, _acked_in_time])
def test_consumer_timeout_like_rabbitmq(
    timeout_servers: list[Server], names: str, scenario: Any
) -> None:
    rabbit, gateway = run_both(timeout_servers, scenario, names)
    assert gateway == rabbit
