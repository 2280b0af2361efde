"""Stream queues (x-queue-type stream) compared with RabbitMQ 3.10's streams over AMQP 0-9-1:
declare-time rules (arguments, durable/exclusive/auto-delete), consumer rules (x-stream-offset,
prefetch required, manual acks), the methods streams refuse, where each x-stream-offset starts
(with the deliveries' x-stream-offset header compared byte for byte), acks as credit, several
consumers reading the same messages, and new messages reaching a waiting consumer.

Messages are published and confirmed one at a time, so each is a chunk of its own in
RabbitMQ and "last" means the last message on both servers.

Where RabbitMQ 3.10 crashes the connection (541 INTERNAL_ERROR on an x-stream-offset string
without leading digits, a float, a bool, an x-max-age without digits, basic.recover), the
gateway answers the 406 (or 540) RabbitMQ gives the neighbouring inputs; those cases are
checked as such: RabbitMQ's 541 and the gateway's exact text.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pamqp import commands as c

from tests.diff.raw import Message, RawClient, describe_close
from tests.diff.support import Server, describe, run_both

STREAM = {"x-queue-type": "stream"}
QUIET_S = 0.4


def _outcome(reply: Any) -> Any:
    if isinstance(reply, c.Channel.Close | c.Connection.Close):
        return describe_close(reply)
    return describe(reply)


def _declare(client: RawClient, queue: str, **options: Any) -> Any:
    arguments = {**STREAM, **options.pop("arguments", {})}
    options.setdefault("durable", True)
    return client.rpc(1, c.Queue.Declare(queue=queue, arguments=arguments, **options))


def _stream_with(server: Server, queue: str, count: int) -> None:
    with server.raw() as client:
        client.open_channel(1)
        _declare(client, queue)
        client.rpc(1, c.Confirm.Select())
        for i in range(count):
            headers = {"n": i} if i % 2 else None
            client.publish(1, "", queue, f"m{i}".encode(), c.Basic.Properties(headers=headers))
            assert isinstance(client.next_method(1), c.Basic.Ack)


DECLARES: list[dict[str, Any]] = [
    {"exclusive": True},
    {"auto_delete": True},
    {"durable": False},
    {"durable": False, "exclusive": True},
    {"durable": False, "auto_delete": True, "exclusive": True},
    {"arguments": {"x-max-age": "1h"}},
    {"arguments": {"x-max-age": 5}},
    {"arguments": {"x-max-age": "0h"}},
    {"arguments": {"x-max-length-bytes": "a"}},
    {"arguments": {"x-max-length-bytes": -1}, "durable": False},
    {"arguments": {"x-max-length-bytes": 0}},
    {"arguments": {"x-stream-max-segment-size-bytes": -5}},
    {"arguments": {"x-stream-max-segment-size-bytes": 1000000}},
    {"arguments": {"x-stream-max-segment-size-bytes": -1, "x-max-length-bytes": -1}},
    {"arguments": {"x-initial-cluster-size": 0}},
    {"arguments": {"x-initial-cluster-size": "a"}},
    {"arguments": {"x-initial-cluster-size": 3}},
    {"arguments": {"x-queue-leader-locator": "foo"}},
    {"arguments": {"x-queue-leader-locator": "balanced"}},
    {"arguments": {"x-max-length": 10}},
    {"arguments": {"x-max-length": -1}, "durable": False},
    {"arguments": {"x-message-ttl": "a"}},
    {"arguments": {"x-dead-letter-exchange": "x"}},
    {"arguments": {"x-expires": 1000}},
    {"arguments": {"x-overflow": "reject-publish"}},
    {"arguments": {"x-delivery-limit": 5}},
    {"arguments": {"x-queue-mode": "lazy"}},
    {"arguments": {"x-dead-letter-strategy": "at-least-once"}},
    {"arguments": {"x-max-priority": 5}},
    {"arguments": {"x-foo": 1}},
]


def test_declare_rules_like_rabbitmq(servers: list[Server], names: str) -> None:
    def scenario(server: Server, p: str) -> Any:
        outcomes = []
        for i, options in enumerate(DECLARES):
            with server.raw() as client:
                client.open_channel(1)
                reply = _declare(client, f"{p}-{i}", **dict(options))
                outcomes.append(_outcome(reply))
                if isinstance(reply, c.Queue.DeclareOk):
                    client.rpc(1, c.Queue.Delete(queue=f"{p}-{i}"))
        with server.raw() as client:
            client.open_channel(1)
            outcomes.append(_outcome(_declare(client, "")))  # server-named: refused
        return outcomes

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    text = f"invalid property 'exclusive-owner' for queue '{names}-0' in vhost '/'"
    assert rabbit[0] == ("channel", 406, f"PRECONDITION_FAILED - {text}", 50, 10)


def _session(
    server: Server,
    queue: str,
    methods: list[Any],
    qos: int | None = 10,
    then: tuple[int, list[Any]] = (0, []),
    quiet_s: float = QUIET_S,
) -> Any:
    """Send ``methods``; with ``then`` = (n, more): once n messages arrived, send ``more``
    (a client acks or rejects what it has received, not what may still be on its way)."""
    with server.raw() as client:
        client.open_channel(1)
        if qos is not None:
            client.rpc(1, c.Basic.Qos(prefetch_count=qos))
        for method in methods:
            client.send(1, method)
        items: list[Any] = []
        wanted, more = then
        # Every session's last method gets an answer (consume-ok, get-ok, a close...): wait
        # for it as long as for any reply, so a server slow under load is not read as silent.
        while not _answered(items) or sum(isinstance(item, Message) for item in items) < wanted:
            items.append(client.next_item(1))
            if client.closed is not None:
                break
        for method in more:
            client.send(1, method)
        return [_outcome(item) for item in items + client.drain(1, quiet_s)]


def _answered(items: list[Any]) -> bool:
    """Whether a reply other than qos-ok (which only answers the session's set-up) is in."""
    return any(not isinstance(item, (Message, c.Basic.QosOk)) for item in items)


def _consume(queue: str, offset: Any = None, **options: Any) -> c.Basic.Consume:
    arguments = {} if offset is None else {"x-stream-offset": offset}
    return c.Basic.Consume(queue=queue, consumer_tag="t", arguments=arguments, **options)


OFFSETS: list[Any] = [
    None,
    "first",
    "last",
    "next",
    2,
    0,
    -1,
    99,
    "1h",
    "1000000Y",
    "10s",
    dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
    dt.datetime.now(tz=dt.UTC) + dt.timedelta(hours=1),
    "0s",
    "1x",
    "1",
    "12",
    "1.5h",
]


def test_where_each_offset_starts(servers: list[Server], names: str) -> None:
    def scenario(server: Server, p: str) -> Any:
        _stream_with(server, f"{p}-s", 5)

        # A time offset is looked up in the store first: on a loaded machine its deliveries
        # came more than QUIET_S after the consume-ok (a CI run cut them off there). The
        # sessions (a connection each, reading only) run side by side: each waits its own
        # second of quiet, not eighteen in a row.
        def session(offset: Any) -> Any:
            return _session(server, f"{p}-s", [_consume(f"{p}-s", offset)], quiet_s=1.0)

        with ThreadPoolExecutor(len(OFFSETS)) as pool:
            return list(pool.map(session, OFFSETS))

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    first = rabbit[1]
    assert len(first) == 6 and first[1][4] == b"m0"  # consume-ok, then m0..m4


def test_refused_methods_like_rabbitmq(servers: list[Server], names: str) -> None:
    def scenario(server: Server, p: str) -> Any:
        q = f"{p}-s"
        _stream_with(server, q, 3)
        delivered = [_consume(q, "first")]
        return [
            _session(server, q, [c.Basic.Get(queue=q)]),
            _session(server, q, [c.Basic.Get(queue=q, no_ack=True)]),
            _session(server, q, [c.Queue.Purge(queue=q)]),
            _session(server, q, [_consume(q)], qos=None),
            _session(server, q, [_consume(q, no_ack=True)], qos=None),
            _session(server, q, [_consume(q, "0s")], qos=None),
            _session(server, q, [_consume(q, no_ack=True)]),
            _session(server, q, [c.Basic.Qos(prefetch_count=5, global_=True), _consume(q)], None),
            _session(server, q, delivered, then=(3, [c.Basic.Reject(2, requeue=False)])),
            _session(server, q, delivered, then=(3, [c.Basic.Reject(2, requeue=True)])),
            _session(server, q, delivered, then=(3, [c.Basic.Nack(2, requeue=True)])),
            _session(server, q, delivered, then=(3, [c.Basic.Ack(delivery_tag=99)])),
            _session(server, q, delivered, then=(3, [c.Basic.Ack(1), c.Basic.Ack(1)])),
            _session(server, q, [_consume(q, "first", exclusive=True)]),
        ]

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit[0] == [
        (
            "connection",
            540,
            f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{names}-s' "
            "in vhost '/'",
            60,
            70,
        )
    ]


def test_acks_give_credit_and_consumers_share_the_log(servers: list[Server], names: str) -> None:
    def scenario(server: Server, p: str) -> Any:
        q = f"{p}-s"
        _stream_with(server, q, 4)
        with server.raw() as one, server.raw() as two, server.raw() as waiting:
            for client in (one, two, waiting):
                client.open_channel(1)
                client.rpc(1, c.Basic.Qos(prefetch_count=2))
            one.send(1, _consume(q, "first"))
            two.send(1, _consume(q, 1))
            waiting.send(1, _consume(q, "next"))
            seen = [[describe(m) for m in client.drain(1, QUIET_S)] for client in (one, two)]
            one.send(1, c.Basic.Ack(delivery_tag=2, multiple=True))  # credit for two more
            seen.append([describe(m) for m in one.drain(1, QUIET_S)])
            two.send(1, c.Basic.Ack(delivery_tag=1))
            seen.append([describe(m) for m in two.drain(1, QUIET_S)])
            seen.append([describe(m) for m in waiting.drain(1, QUIET_S)])
            with server.raw() as publisher:
                publisher.open_channel(1)
                publisher.rpc(1, c.Confirm.Select())
                publisher.publish(1, "", q, b"late", c.Basic.Properties(content_type="t/p"))
                publisher.next_method(1)
            seen.append([describe(m) for m in waiting.drain(1, QUIET_S)])
        with server.raw() as client:
            client.open_channel(1)
            deleted = _outcome(client.rpc(1, c.Queue.Delete(queue=q, if_empty=True)))
        return seen, deleted

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    late = rabbit[0][-1]
    assert len(late) == 1 and late[0][4] == b"late"


def test_stream_offset_refused_on_other_queues(servers: list[Server], names: str) -> None:
    def scenario(server: Server, p: str) -> Any:
        outcomes = []
        for i, (arguments, offset) in enumerate([({}, "first"), ({}, 5), ({}, "bad")]):
            with server.raw() as client:
                client.open_channel(1)
                client.rpc(1, c.Queue.Declare(queue=f"{p}-{i}", arguments=arguments))
                client.rpc(1, c.Basic.Qos(prefetch_count=2))
                outcomes.append(_outcome(client.rpc(1, _consume(f"{p}-{i}", offset))))
                client.open_channel(2)
                client.rpc(2, c.Queue.Delete(queue=f"{p}-{i}"))
        return outcomes

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit


CRASHES_RABBITMQ = ["abc", "", "-1h", " 1h", 1.5, True]


def test_offsets_rabbitmq_crashes_on_get_its_406(servers: list[Server], names: str) -> None:
    """RabbitMQ 3.10 fails the connection (541) on these; the gateway refuses them with the
    406 RabbitMQ gives "0s" or "1x", naming the value and its wire type."""

    def scenario(server: Server, p: str) -> Any:
        _stream_with(server, f"{p}-s", 1)
        return [_session(server, f"{p}-s", [_consume(f"{p}-s", o)]) for o in CRASHES_RABBITMQ]

    rabbit, gateway = run_both(servers, scenario, names)
    assert all(outcome == [("connection", 541, "INTERNAL_ERROR", 0, 0)] for outcome in rabbit)
    where = f"for queue '{names}-s' in vhost '/'"
    terms = [
        '{longstr,<<"abc">>}',
        '{longstr,<<"">>}',
        '{longstr,<<"-1h">>}',
        '{longstr,<<" 1h">>}',
        None,  # the float's wire type depends on the client's encoder
        "{bool,true}",
    ]
    for outcome, term in zip(gateway, terms, strict=True):
        (kind, code, text, class_id, method_id) = outcome[0]
        assert (kind, code, class_id, method_id) == ("channel", 406, 60, 20)
        assert text.startswith(f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' {where}")
        if term is not None:
            assert text.endswith(f"{{invalid_stream_offset_arg,{term}}}")


def test_deliveries_carry_the_offset_header(servers: list[Server], names: str) -> None:
    """Byte for byte: the header is added last, as a signed long, to tables of any content."""

    def scenario(server: Server, p: str) -> Any:
        q = f"{p}-s"
        with server.raw() as client:
            client.open_channel(1)
            _declare(client, q)
            client.rpc(1, c.Confirm.Select())
            for properties in [
                c.Basic.Properties(),
                c.Basic.Properties(headers={"a": "b", "x-stream-offset": "mine"}),
                c.Basic.Properties(content_type="text/plain", delivery_mode=2, priority=3),
            ]:
                client.publish(1, "", q, b"x", properties)
                client.next_method(1)
        got = _session(server, q, [_consume(q, "first")])
        return [item for item in got if isinstance(item, tuple) and item[0] == "Basic.Deliver"]

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert len(rabbit) == 3
