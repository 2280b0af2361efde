"""Errors, compared with RabbitMQ: reply code, reply text and the failing class/method id.

These use the raw client (tests/diff/raw.py): pika and aiormq drop the class/method ids of
a close, and cannot send the frames some errors need.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pamqp import commands as c

from tests.diff.raw import RawClient
from tests.diff.support import Server, describe, run_both

# A step runs on the client and returns what it observed (already described).
Step = Callable[[RawClient, str], Any]


def rpc(method: Callable[[str], Any], channel: int = 1) -> Step:
    """Send the method (built from the name prefix) and describe the reply."""

    def step(client: RawClient, p: str) -> Any:
        reply = client.rpc(channel, method(p))
        if isinstance(reply, c.Channel.Close):
            client.send(channel, c.Channel.CloseOk())
            client.open_channel(channel)  # later steps keep using the channel number
        return describe(reply)

    return step


def send(method: Callable[[str], Any], channel: int = 1) -> Step:
    """Send a method that has no reply; describe whatever the server says in 0.3 s."""

    def step(client: RawClient, p: str) -> Any:
        client.send(channel, method(p))
        items = client.drain(channel, 0.3)
        if any(isinstance(i, c.Channel.Close) for i in items):
            client.send(channel, c.Channel.CloseOk())
            client.open_channel(channel)
        return [describe(i) for i in items]

    return step


def publish(exchange: str, key: str, channel: int = 1, **options: Any) -> Step:
    def step(client: RawClient, p: str) -> Any:
        client.publish(channel, exchange.format(p=p), key.format(p=p), b"body", **options)
        items = client.drain(channel, 0.3)
        if any(isinstance(i, c.Channel.Close) for i in items):
            client.send(channel, c.Channel.CloseOk())
            client.open_channel(channel)
        return [describe(i) for i in items]

    return step


def get_and(then: str, times: int = 1) -> Step:
    """basic.get one message, then ack/nack/reject its tag ``times`` times (or tag+1)."""

    def step(client: RawClient, p: str) -> Any:
        got = client.rpc(1, c.Basic.Get(queue=f"{p}-q"))
        tag = got.method.delivery_tag  # type: ignore[union-attr]
        for _ in range(times):
            if then == "ack":
                client.send(1, c.Basic.Ack(tag))
            elif then == "ack+1":
                client.send(1, c.Basic.Ack(tag + 1))
            elif then == "nack":
                client.send(1, c.Basic.Nack(tag + 5, requeue=False))
            elif then == "reject":
                client.send(1, c.Basic.Reject(tag + 5))
            elif then == "ack-multiple-twice":
                client.send(1, c.Basic.Ack(tag, multiple=True))
        items = client.drain(1, 0.3)
        if any(isinstance(i, c.Channel.Close) for i in items):
            client.send(1, c.Channel.CloseOk())
            client.open_channel(1)
        return [describe(i) for i in items]

    return step


def on_other_connection(*steps: Step) -> Step:
    """Run steps on a second connection (the first keeps its exclusive queues)."""

    def step(client: RawClient, p: str) -> Any:
        with RawClient(client.port) as other:
            other.open_channel(1)
            return [s(other, p) for s in steps]

    return step


def q(**kw: Any) -> Callable[[str], Any]:
    """queue.declare of {p}-q (or kw['queue'] formatted with p)."""
    name = kw.pop("queue", "{p}-q")
    return lambda p: c.Queue.Declare(queue=name.format(p=p), **kw)


def x(kind: str = "direct", **kw: Any) -> Callable[[str], Any]:
    name = kw.pop("exchange", "{p}-x")
    return lambda p: c.Exchange.Declare(exchange=name.format(p=p), exchange_type=kind, **kw)


def m(factory: Callable[..., Any], **kw: Any) -> Callable[[str], Any]:
    """Any method, string arguments formatted with the prefix."""
    return lambda p: factory(
        **{k: v.format(p=p) if isinstance(v, str) else v for k, v in kw.items()}
    )


TTL = {"x-message-ttl": 1000}
# fmt: off
ERRORS: dict[str, list[Step]] = {
    # 404 NOT_FOUND
    "passive-queue-missing": [rpc(q(passive=True))],
    "passive-exchange-missing": [rpc(x(passive=True))],
    "bind-missing-queue": [rpc(x()), rpc(m(c.Queue.Bind, queue="{p}-none", exchange="{p}-x"))],
    "bind-missing-exchange": [rpc(q()), rpc(m(c.Queue.Bind, queue="{p}-q", exchange="{p}-no"))],
    "exchange-bind-missing": [rpc(x()), rpc(m(c.Exchange.Bind, destination="{p}-x",
                                              source="{p}-no"))],
    "unbind-missing-queue": [rpc(x()), rpc(m(c.Queue.Unbind, queue="{p}-no", exchange="{p}-x"))],
    "publish-missing-exchange": [publish("{p}-none", "k")],
    "consume-missing-queue": [rpc(m(c.Basic.Consume, queue="{p}-none"))],
    "get-missing-queue": [rpc(m(c.Basic.Get, queue="{p}-none"))],
    "purge-missing-queue": [rpc(m(c.Queue.Purge, queue="{p}-none"))],
    "no-previously-declared-queue": [rpc(m(c.Queue.Bind, queue="", exchange="amq.direct"))],
    "delete-missing-queue-and-exchange": [rpc(m(c.Queue.Delete, queue="{p}-none")),
                                          rpc(m(c.Exchange.Delete, exchange="{p}-none"))],
    # 406 PRECONDITION_FAILED
    "redeclare-exchange-type": [rpc(x()), rpc(x("fanout"))],
    "redeclare-exchange-durable": [rpc(x()), rpc(x(durable=True))],
    "redeclare-exchange-auto-delete": [rpc(x()), rpc(x(auto_delete=True))],
    "redeclare-exchange-internal": [rpc(x()), rpc(x(internal=True))],
    "redeclare-exchange-alternate": [rpc(x(arguments={"alternate-exchange": "a"})),
                                     rpc(x(arguments={"alternate-exchange": "b"})),
                                     rpc(x())],
    "redeclare-queue-durable": [rpc(q()), rpc(q(durable=True))],
    "redeclare-queue-auto-delete": [rpc(q()), rpc(q(auto_delete=True))],
    "redeclare-queue-ttl": [rpc(q(arguments=TTL)), rpc(q(arguments={"x-message-ttl": 2000})),
                            rpc(q()), rpc(q(arguments=TTL))],
    "redeclare-queue-ttl-missing": [rpc(q()), rpc(q(arguments=TTL))],
    "redeclare-queue-max-length": [rpc(q(arguments={"x-max-length": 5})),
                                   rpc(q(arguments={"x-max-length": "5"}))],
    "redeclare-queue-ignored-arg": [rpc(q(arguments={"x-other": 1})),
                                    rpc(q(arguments={"x-other": 2}))],
    "ack-unknown-tag": [rpc(q()), publish("", "{p}-q"), get_and("ack+1")],
    "double-ack": [rpc(q()), publish("", "{p}-q"), get_and("ack", times=2)],
    "ack-multiple-twice": [rpc(q()), publish("", "{p}-q"), get_and("ack-multiple-twice", 2)],
    "nack-unknown-tag": [rpc(q()), publish("", "{p}-q"), get_and("nack")],
    "reject-unknown-tag": [rpc(q()), publish("", "{p}-q"), get_and("reject")],
    "ack-on-fresh-channel": [send(lambda p: c.Basic.Ack(1))],
    "delete-if-unused": [rpc(q()), rpc(m(c.Basic.Consume, queue="{p}-q", consumer_tag="t")),
                         rpc(m(c.Queue.Delete, queue="{p}-q", if_unused=True))],
    "delete-if-empty": [rpc(q()), publish("", "{p}-q"),
                        rpc(m(c.Queue.Delete, queue="{p}-q", if_empty=True)),
                        rpc(m(c.Queue.Delete, queue="{p}-q", if_unused=True))],
    "exchange-delete-if-unused": [rpc(x()), rpc(q()),
                                  rpc(m(c.Queue.Bind, queue="{p}-q", exchange="{p}-x")),
                                  rpc(m(c.Exchange.Delete, exchange="{p}-x", if_unused=True)),
                                  rpc(m(c.Queue.Unbind, queue="{p}-q", exchange="{p}-x")),
                                  rpc(m(c.Exchange.Delete, exchange="{p}-x", if_unused=True))],
    "tx-commit-without-select": [rpc(lambda p: c.Tx.Commit()), rpc(lambda p: c.Tx.Rollback())],
    "confirm-after-tx": [rpc(lambda p: c.Tx.Select()), rpc(lambda p: c.Confirm.Select())],
    "tx-after-confirm": [rpc(lambda p: c.Confirm.Select()), rpc(lambda p: c.Tx.Select())],
    "headers-bad-x-match": [rpc(x("headers")), rpc(q()),
                            rpc(m(c.Queue.Bind, queue="{p}-q", exchange="{p}-x",
                                  arguments={"x-match": "some"}))],
    "user-id-mismatch": [publish("", "k", properties=c.Basic.Properties(user_id="bob"))],
    "alternate-exchange-not-a-string": [rpc(x(arguments={"alternate-exchange": 1}))],
    # 403 ACCESS_REFUSED
    "declare-amq-exchange": [rpc(x(exchange="amq.{p}"))],
    "declare-amq-queue": [rpc(q(queue="amq.{p}"))],
    "passive-amq-queue": [rpc(q(queue="amq.{p}", passive=True))],
    "redeclare-amq-direct": [rpc(x(exchange="amq.direct")), rpc(x("topic", exchange="amq.direct"))],
    "delete-amq-exchange": [rpc(m(c.Exchange.Delete, exchange="amq.direct"))],
    "delete-default-exchange": [rpc(m(c.Exchange.Delete, exchange=""))],
    "bind-default-exchange": [rpc(q()), rpc(m(c.Queue.Bind, queue="{p}-q", exchange=""))],
    "publish-internal-exchange": [rpc(x(internal=True)), publish("{p}-x", "k")],
    "exclusive-consumer-taken": [rpc(q()),
                                 rpc(m(c.Basic.Consume, queue="{p}-q", exclusive=True)),
                                 rpc(m(c.Basic.Consume, queue="{p}-q", consumer_tag="b"))],
    "consumer-then-exclusive": [rpc(q()), rpc(m(c.Basic.Consume, queue="{p}-q")),
                                rpc(m(c.Basic.Consume, queue="{p}-q", exclusive=True))],
    # 405 RESOURCE_LOCKED
    "exclusive-queue-other-connection": [
        rpc(q(exclusive=True)),
        on_other_connection(
            rpc(q(exclusive=True)), rpc(q()), rpc(q(passive=True)),
            rpc(m(c.Basic.Consume, queue="{p}-q")), rpc(m(c.Basic.Get, queue="{p}-q")),
            rpc(m(c.Queue.Purge, queue="{p}-q")), rpc(m(c.Queue.Delete, queue="{p}-q")),
            rpc(m(c.Queue.Bind, queue="{p}-q", exchange="amq.fanout")),
            rpc(m(c.Queue.Unbind, queue="{p}-q", exchange="amq.fanout")),
        ),
    ],
    "exclusive-redeclare-same-connection": [rpc(q(exclusive=True)), rpc(q()),
                                            rpc(q(exclusive=True))],
    # 530 NOT_ALLOWED, 540 NOT_IMPLEMENTED, 503 COMMAND_INVALID (hard errors)
    "reuse-consumer-tag": [rpc(q()), rpc(m(c.Basic.Consume, queue="{p}-q", consumer_tag="t")),
                           rpc(m(c.Basic.Consume, queue="{p}-q", consumer_tag="t"))],
    "qos-prefetch-size": [rpc(lambda p: c.Basic.Qos(prefetch_size=10))],
    "recover-requeue-false": [rpc(lambda p: c.Basic.Recover(requeue=False))],
    "publish-immediate": [publish("", "k", immediate=True)],
    "unknown-exchange-type": [rpc(x("nonsense"))],
}
# fmt: on


def _run(steps: list[Step]) -> Callable[[Server, str], Any]:
    def scenario(server: Server, p: str) -> Any:
        with server.raw() as client:
            client.open_channel(1)
            observed = []
            for step in steps:
                observed.append(step(client, p))
                if client.closed is not None:
                    break  # a hard error ended the connection
            return observed

    return scenario


@pytest.mark.parametrize("name", list(ERRORS), ids=str)
def test_error_matches_rabbitmq(servers: list[Server], names: str, name: str) -> None:
    rabbit, gateway = run_both(servers, _run(ERRORS[name]), names)
    assert gateway == rabbit
