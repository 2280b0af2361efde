"""x-dead-letter-strategy compared with RabbitMQ 3.10: classic queues refuse the argument,
quorum queues validate it (at-most-once | at-least-once), and a rejected or delivery-limited
message of an at-least-once quorum queue (x-overflow reject-publish, a dead-letter exchange)
reaches the dead-letter queue with the same x-death and leaves its queue.

That the original is settled only once the dead letter is durable is mqgw's own mechanism
(tests/streams/test_dead_letter_at_least_once.py checks it); here the outcome is compared.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands as c

from tests.diff.raw import Message, RawClient
from tests.diff.support import Server, declare_outcomes, run_both
from tests.harness.processes import check_for

ARGUMENTS: list[dict[str, Any]] = [
    {"x-dead-letter-strategy": "at-least-once"},
    {"x-dead-letter-strategy": "at-most-once"},
    {"x-dead-letter-strategy": "foo", "x-max-length": -1},
    {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once"},
    {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-most-once"},
    {"x-queue-type": "quorum", "x-dead-letter-strategy": "foo"},
    {"x-queue-type": "quorum", "x-dead-letter-strategy": 1},
    {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "dlx",
    },
]


def test_declare_like_rabbitmq(servers: list[Server], names: str) -> None:
    def scenario(server: Server, p: str) -> Any:
        return declare_outcomes(server, p, ARGUMENTS, durable=lambda _: True)

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit[0][2].endswith("of queue type rabbit_classic_queue")


def _count(client: RawClient, queue: str) -> int:
    reply = client.rpc(1, c.Queue.Declare(queue=queue, passive=True))
    return int(reply.message_count)


def _death(message: Message) -> Any:
    headers = dict(message.properties.headers or {})
    deaths = [{k: v for k, v in d.items() if k != "time"} for d in headers.pop("x-death")]
    return message.body, deaths, headers


def _at_least_once(server: Server, p: str) -> Any:
    with server.raw() as client:
        client.open_channel(1)
        client.rpc(1, c.Exchange.Declare(exchange=f"{p}-dlx", exchange_type="fanout"))
        client.rpc(1, c.Queue.Declare(queue=f"{p}-dead", durable=True))
        client.rpc(1, c.Queue.Bind(queue=f"{p}-dead", exchange=f"{p}-dlx"))
        arguments = {
            "x-queue-type": "quorum",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-dead-letter-exchange": f"{p}-dlx",
            "x-delivery-limit": 1,
        }
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q", durable=True, arguments=arguments))
        client.rpc(1, c.Confirm.Select())
        for body in (b"rejected", b"returned"):
            client.publish(1, "", f"{p}-q", body, c.Basic.Properties(delivery_mode=2))
            client.next_method(1)
        check_for(5, lambda: _count(client, f"{p}-q") == 2 or None)
        got = client.rpc(1, c.Basic.Get(queue=f"{p}-q"))
        client.send(1, c.Basic.Reject(delivery_tag=got.method.delivery_tag, requeue=False))
        for _ in range(2):  # past the delivery limit on the second return
            check_for(5, lambda: _count(client, f"{p}-q") == 1 or None)
            got = client.rpc(1, c.Basic.Get(queue=f"{p}-q"))
            client.send(1, c.Basic.Nack(delivery_tag=got.method.delivery_tag, requeue=True))
        check_for(5, lambda: _count(client, f"{p}-dead") == 2 or None)
        dead = [_death(client.rpc(1, c.Basic.Get(queue=f"{p}-dead", no_ack=True)))]
        dead.append(_death(client.rpc(1, c.Basic.Get(queue=f"{p}-dead", no_ack=True))))
        return dead, _count(client, f"{p}-q")


def test_at_least_once_dead_letters_like_rabbitmq(servers: list[Server], names: str) -> None:
    rabbit, gateway = run_both(servers, _at_least_once, names)
    assert gateway == rabbit
    dead, left = rabbit
    assert [body for body, _, _ in dead] == [b"rejected", b"returned"] and left == 0
