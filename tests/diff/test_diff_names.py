"""Names in UTF-8 beyond ASCII, compared with RabbitMQ 3.10: queues, exchanges and consumer
tags of up to 255 bytes (a shortstr) in every method that carries them, and error texts
that quote them (RabbitMQ cuts a reply text above 255 bytes to 252 and "...", even inside a
character). pamqp's own constructors refuse such names; the raw client builds them with
gateway/amqp/unchecked.py, as the server does."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import base
from pamqp import commands as c

from gateway.amqp.unchecked import build
from tests.diff.raw import RawClient
from tests.diff.support import Server, describe, run_both

SHORTSTR_MAX = 255


class Steps:
    """Methods on one connection, each described; a closed channel is reopened (and a
    closed connection reconnected) so that later steps go on."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.client = self._connect()
        self.channel = 1
        self.seen: list[Any] = []

    def _connect(self) -> RawClient:
        client = self.server.raw()
        client.connect()
        client.open_channel(1)
        return client

    def _after(self, item: Any) -> None:
        if isinstance(item, c.Channel.Close):
            self.client.send(self.channel, c.Channel.CloseOk())
            self.channel += 1
            self.client.open_channel(self.channel)
        elif isinstance(item, c.Connection.Close):
            self.client.close()
            self.client, self.channel = self._connect(), 1

    def rpc(self, method: base.Frame, replies: int = 1) -> None:
        self.client.send(self.channel, method)
        for _ in range(replies):
            item = self.client.next_item(self.channel)
            self.seen.append(describe(item))
            self._after(item)
            if isinstance(item, c.Channel.Close | c.Connection.Close):
                return

    def publish(self, exchange: str, routing_key: str, body: bytes) -> None:
        self.client.publish(self.channel, exchange, routing_key, body)

    def close(self) -> list[Any]:
        self.client.close()
        return self.seen


def _round_trip(name: str) -> Callable[[Server, str], list[Any]]:
    """``name`` as a queue, an exchange, a routing key and a consumer tag."""

    def scenario(server: Server, _p: str) -> list[Any]:
        steps = Steps(server)
        steps.rpc(build(c.Queue.Declare, queue=name))
        steps.rpc(build(c.Exchange.Declare, exchange=name, exchange_type="fanout"))
        steps.rpc(build(c.Queue.Bind, queue=name, exchange=name, routing_key=name))
        steps.rpc(build(c.Exchange.Declare, exchange=name, passive=True))
        steps.rpc(build(c.Queue.Declare, queue=name, passive=True))
        steps.publish(name, name, b"got")
        steps.rpc(build(c.Basic.Get, queue=name, no_ack=True))
        steps.publish(name, name, b"delivered")
        steps.rpc(build(c.Basic.Consume, queue=name, consumer_tag=name, no_ack=True), replies=2)
        steps.rpc(build(c.Basic.Cancel, consumer_tag=name))
        steps.rpc(build(c.Queue.Unbind, queue=name, exchange=name, routing_key=name))
        steps.rpc(build(c.Queue.Purge, queue=name))
        steps.rpc(build(c.Exchange.Delete, exchange=name))
        steps.rpc(build(c.Queue.Delete, queue=name))
        return steps.close()

    return scenario


def test_names_beyond_ascii_work_in_every_method(servers: list[Server], names: str) -> None:
    for name in (f"{names}-ключ-队列-✓", f"{names}-" + "ж" * ((SHORTSTR_MAX - 8) // 2)):
        rabbit, gateway = run_both(servers, _round_trip(name), names)
        assert gateway == rabbit
        assert rabbit[0] == ("Queue.DeclareOk", {"queue": name, "message_count": 0,
                                                 "consumer_count": 0})  # fmt: skip
        delivered = [item for item in rabbit if item[0] == "Basic.Deliver"]
        assert delivered and delivered[0][1]["consumer_tag"] == name


def test_cr_and_lf_are_dropped_from_names_where_rabbitmq_drops_them(
    servers: list[Server], names: str
) -> None:
    """rabbit_channel:strip_cr_lf/1: declare, delete and bind, not get or purge."""
    name = f"{names}-a\r\nb"

    def scenario(server: Server, _p: str) -> list[Any]:
        steps = Steps(server)
        steps.rpc(build(c.Queue.Declare, queue=name))
        steps.rpc(build(c.Exchange.Declare, exchange=name, exchange_type="direct"))
        steps.rpc(build(c.Queue.Bind, queue=name, exchange=name, routing_key=name))
        steps.rpc(build(c.Basic.Get, queue=name))
        steps.rpc(build(c.Queue.Purge, queue=name))
        steps.rpc(build(c.Exchange.Delete, exchange=name))
        steps.rpc(build(c.Queue.Delete, queue=name))
        return steps.close()

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit[0][1]["queue"] == f"{names}-ab"


def test_error_texts_quoting_long_names_are_cut_as_rabbitmq_cuts_them(
    servers: list[Server], names: str
) -> None:
    """Above 255 bytes a reply text keeps 252 and "...", here inside a two-byte character."""
    long_name = f"{names}-" + "ж" * ((SHORTSTR_MAX - len(names) - 1) // 2)

    def scenario(server: Server, _p: str) -> list[Any]:
        steps = Steps(server)
        steps.rpc(build(c.Queue.Declare, queue="a" + long_name[1:], passive=True))
        steps.rpc(build(c.Exchange.Declare, exchange=long_name, passive=True))
        steps.rpc(build(c.Queue.Declare, queue=long_name, exclusive=True))
        steps.rpc(build(c.Basic.Consume, queue=long_name, consumer_tag=long_name))
        steps.rpc(build(c.Basic.Consume, queue=long_name, consumer_tag=long_name))  # 530
        return steps.close()

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert (
        rabbit[0][2].endswith("...") and len(rabbit[0][2].encode("utf-8", "surrogateescape")) == 255
    )
    assert rabbit[-1][:2] == ("connection", 530)


def test_names_longer_than_a_shortstr_in_arguments(servers: list[Server], names: str) -> None:
    """No method carries a name above 255 bytes (a shortstr cannot); arguments can, and
    RabbitMQ takes them: a dead-letter exchange and an alternate exchange of 300 bytes."""
    too_long = "ж" * 150

    def scenario(server: Server, p: str) -> list[Any]:
        steps = Steps(server)
        dlx = {"x-dead-letter-exchange": too_long}
        steps.rpc(build(c.Queue.Declare, queue=f"{p}-очередь", arguments=dlx))
        steps.rpc(build(c.Queue.Declare, queue=f"{p}-очередь", passive=True))
        alternate = {"alternate-exchange": too_long}
        steps.rpc(build(c.Exchange.Declare, exchange=f"{p}-обмен", exchange_type="fanout",
                        arguments=alternate))  # fmt: skip
        steps.rpc(build(c.Queue.Delete, queue=f"{p}-очередь"))
        steps.rpc(build(c.Exchange.Delete, exchange=f"{p}-обмен"))
        return steps.close()

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit[0][0] == "Queue.DeclareOk" and rabbit[2] == ("Exchange.DeclareOk", {})


_examples = itertools.count()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.text(min_size=1, max_size=SHORTSTR_MAX))
def test_any_utf8_name_round_trips_as_in_rabbitmq(
    servers: list[Server], names: str, text: str
) -> None:
    prefix = f"{names}-{next(_examples)}-"
    budget = SHORTSTR_MAX - len(prefix)
    raw = text.encode()[:budget]
    name = prefix + raw.decode("utf-8", "ignore")  # whole characters only
    rabbit, gateway = run_both(servers, _round_trip(name), names)
    assert gateway == rabbit
