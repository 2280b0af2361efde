"""TTL, dead-lettering and length limits, compared with RabbitMQ.

Dead-lettered messages are compared by their wire bytes: the x-death header is walked field by
field with its AMQP type tags, so a long written as a byte or a missing field shows up. The one
value that cannot match, x-death's ``time``, is compared by type only. Time-dependent steps use
TTLs of 50-150 ms and poll for the outcome (check_for) instead of sleeping.
"""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import commands as c

from gateway.amqp import property_bytes as pb
from tests.diff.support import Server, channel_error, run_both
from tests.harness.processes import check_for

QUIET_S = 0.3


def typed_table(raw: bytes) -> list[Any]:
    """A field table as (key, type tag, value) with nested tables and arrays walked."""
    return [(key, tag, _typed_value(key, tag, value)) for key, tag, value in pb.split_table(raw)]


def _typed_value(key: str, tag: str, raw: bytes) -> Any:
    if key == "time":
        return "<time>"
    if tag == "F":
        return typed_table(raw)
    if tag == "A":
        return [(t, _typed_value("", t, v)) for t, v in pb.split_array(raw)]
    return pb.decode_scalar(tag, raw)


def typed_headers(raw_properties: bytes) -> list[Any]:
    fields = pb.split_properties(raw_properties)
    headers = fields.get(pb.HEADERS)
    other = sorted(bit for bit in fields if bit != pb.HEADERS)
    return [other, [] if headers is None else sorted(typed_table(headers), key=str)]


def _get_all(client: Any, queue: str) -> list[Any]:
    """basic.get (no-ack) until empty: exchange, routing key, typed headers, body."""
    got = []
    while True:
        reply = client.rpc(1, c.Basic.Get(queue=queue, no_ack=True))
        if not hasattr(reply, "raw_properties"):
            return got
        method = dict(reply.method)
        got.append(
            (
                method["exchange"],
                method["routing_key"],
                typed_headers(reply.raw_properties),
                reply.body,
            )
        )


def _count(client: Any, queue: str) -> int:
    ok = client.rpc(1, c.Queue.Declare(queue=queue, passive=True))
    return int(ok.message_count)


def _wait_count(client: Any, queue: str, expected: int, timeout_s: float = 5) -> int:
    check_for(timeout_s, lambda: _count(client, queue) == expected or None)
    return _count(client, queue)


def _dead_letter_target(client: Any, p: str) -> None:
    client.rpc(1, c.Exchange.Declare(exchange=f"{p}-dlx", exchange_type="fanout"))
    client.rpc(1, c.Queue.Declare(queue=f"{p}-dead"))
    client.rpc(1, c.Queue.Bind(queue=f"{p}-dead", exchange=f"{p}-dlx"))


def _queue_ttl_dead_letters(server: Server, p: str) -> Any:
    with server.raw() as client:
        client.open_channel(1)
        _dead_letter_target(client, p)
        args = {"x-message-ttl": 100, "x-dead-letter-exchange": f"{p}-dlx"}
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q", arguments=args))
        client.rpc(1, c.Confirm.Select())
        for i in range(3):
            client.publish(1, "", f"{p}-q", b"m%d" % i, c.Basic.Properties(headers={"h": i}))
            client.next_method(1)
        first = _count(client, f"{p}-q")
        dead = _wait_count(client, f"{p}-dead", 3)
        return first, _count(client, f"{p}-q"), dead, _get_all(client, f"{p}-dead")


def _message_expiration(server: Server, p: str) -> Any:
    """Per-message expiration: only at the head; original-expiration is recorded."""
    with server.raw() as client:
        client.open_channel(1)
        _dead_letter_target(client, p)
        client.rpc(
            1, c.Queue.Declare(queue=f"{p}-q", arguments={"x-dead-letter-exchange": f"{p}-dlx"})
        )
        client.rpc(1, c.Confirm.Select())
        client.publish(1, "", f"{p}-q", b"soon", c.Basic.Properties(expiration="100"))
        client.next_method(1)
        client.publish(1, "", f"{p}-q", b"keep", c.Basic.Properties())
        client.next_method(1)
        client.publish(1, "", f"{p}-q", b"behind", c.Basic.Properties(expiration="10"))
        client.next_method(1)
        dead = _wait_count(client, f"{p}-dead", 1)
        got = client.rpc(1, c.Basic.Get(queue=f"{p}-q", no_ack=True)).body
        # "behind" expired long ago but only leaves at the head: a get finds nothing.
        empty = type(client.rpc(1, c.Basic.Get(queue=f"{p}-q", no_ack=True))).__name__
        check_for(5, lambda: _count(client, f"{p}-dead") == 2 or None)
        return dead, got, empty, _get_all(client, f"{p}-dead")


def _reject_chain(server: Server, p: str) -> Any:
    """Rejected back and forth between two queues: counts grow, latest death first."""
    with server.raw() as client:
        client.open_channel(1)
        for me, other in (("a", "b"), ("b", "a")):
            args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{p}-{other}"}
            client.rpc(1, c.Queue.Declare(queue=f"{p}-{me}", arguments=args))
        client.rpc(1, c.Confirm.Select())
        client.publish(1, "amq.direct", "nowhere", b"x", c.Basic.Properties(delivery_mode=2))
        client.next_method(1)
        client.rpc(1, c.Queue.Bind(queue=f"{p}-a", exchange="amq.direct", routing_key="k"))
        client.publish(
            1,
            "amq.direct",
            "k",
            b"hop",
            c.Basic.Properties(delivery_mode=2, headers={"CC": ["cc1"]}),
        )
        client.next_method(1)
        seen = []
        for queue in ("a", "b", "a", "b"):
            _wait_count(client, f"{p}-{queue}", 1)
            reply = client.rpc(1, c.Basic.Get(queue=f"{p}-{queue}"))
            seen.append((dict(reply.method)["exchange"], dict(reply.method)["routing_key"],
                         typed_headers(reply.raw_properties)))  # fmt: skip
            client.send(
                1, c.Basic.Reject(delivery_tag=dict(reply.method)["delivery_tag"], requeue=False)
            )
        _wait_count(client, f"{p}-a", 1)
        return seen, _get_all(client, f"{p}-a")


def _cycles(server: Server, p: str) -> Any:
    """Expiry back into the same queue is a cycle (dropped); a rejection is not."""
    with server.raw() as client:
        client.open_channel(1)
        args = {"x-message-ttl": 50, "x-dead-letter-exchange": ""}
        client.rpc(1, c.Queue.Declare(queue=f"{p}-loop", arguments=args))
        client.rpc(1, c.Queue.Declare(queue=f"{p}-rej", arguments={"x-dead-letter-exchange": ""}))
        client.rpc(1, c.Confirm.Select())
        client.publish(1, "", f"{p}-loop", b"cycle")
        client.next_method(1)
        client.publish(1, "", f"{p}-rej", b"back")
        client.next_method(1)
        dropped = _wait_count(client, f"{p}-loop", 0)
        reply = client.rpc(1, c.Basic.Get(queue=f"{p}-rej"))
        client.send(
            1, c.Basic.Reject(delivery_tag=dict(reply.method)["delivery_tag"], requeue=False)
        )
        returned = _wait_count(client, f"{p}-rej", 1)
        return dropped, returned, _get_all(client, f"{p}-rej")


def _max_length(server: Server, p: str, args: dict[str, Any], publishes: int = 4) -> Any:
    with server.raw() as client:
        client.open_channel(1)
        _dead_letter_target(client, p)
        args = {**args, "x-dead-letter-exchange": f"{p}-dlx"}
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q", arguments=args))
        client.rpc(1, c.Confirm.Select())
        confirms = []
        for i in range(publishes):
            client.publish(1, "", f"{p}-q", b"m%d" % i)
            confirms.append(type(client.next_method(1)).__name__)
        check_for(5, lambda: _count(client, f"{p}-dead") == publishes - 2 or None)
        return confirms, _get_all(client, f"{p}-q"), _get_all(client, f"{p}-dead")


def _drop_head(server: Server, p: str) -> Any:
    return _max_length(server, p, {"x-max-length": 2})


def _drop_head_bytes(server: Server, p: str) -> Any:
    return _max_length(server, p, {"x-max-length-bytes": 4})  # two 2-byte bodies fit


def _reject_publish_dlx(server: Server, p: str) -> Any:
    return _max_length(server, p, {"x-max-length": 2, "x-overflow": "reject-publish-dlx"})


def _reject_publish(server: Server, p: str) -> Any:
    with server.raw() as client:
        client.open_channel(1)
        client.rpc(
            1,
            c.Queue.Declare(
                queue=f"{p}-q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
            ),
        )
        client.rpc(1, c.Queue.Declare(queue=f"{p}-free"))
        for name in ("q", "free"):
            client.rpc(1, c.Queue.Bind(queue=f"{p}-{name}", exchange="amq.fanout"))
        client.rpc(1, c.Confirm.Select())
        confirms = []
        for i in range(3):
            client.publish(1, "amq.fanout", "", b"m%d" % i, mandatory=True)
            confirms.append(describe_confirm(client.next_method(1)))
        counts = _count(client, f"{p}-q"), _count(client, f"{p}-free")
        for name in ("q", "free"):
            client.rpc(1, c.Queue.Unbind(queue=f"{p}-{name}", exchange="amq.fanout"))
        return confirms, counts


def describe_confirm(method: Any) -> Any:
    fields = dict(method)
    return (method.name, fields.get("delivery_tag"), fields.get("multiple"))


def _delivery_limit(server: Server, p: str) -> Any:
    """x-delivery-limit (quorum-queue style): returns are counted in x-delivery-count; past
    the limit the message is dead-lettered with reason delivery_limit."""
    with server.raw() as client:
        client.open_channel(1)
        _dead_letter_target(client, p)
        args = {
            "x-queue-type": "quorum",
            "x-delivery-limit": 1,
            "x-dead-letter-exchange": f"{p}-dlx",
        }
        client.rpc(1, c.Queue.Declare(queue=f"{p}-q", durable=True, arguments=args))
        client.rpc(1, c.Confirm.Select())
        client.publish(1, "", f"{p}-q", b"poison", c.Basic.Properties(delivery_mode=2))
        client.next_method(1)
        seen = []
        for _ in range(2):
            _wait_count(client, f"{p}-q", 1)
            reply = client.rpc(1, c.Basic.Get(queue=f"{p}-q"))
            method = dict(reply.method)
            seen.append((method["redelivered"], typed_headers(reply.raw_properties)))
            client.send(1, c.Basic.Nack(delivery_tag=method["delivery_tag"], requeue=True))
        dead = _wait_count(client, f"{p}-dead", 1)
        return seen, dead, _count(client, f"{p}-q"), _get_all(client, f"{p}-dead")


def _ttl_zero(server: Server, p: str) -> Any:
    """TTL 0: delivered to a consumer that can take it at once, else gone."""
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"{p}-q", arguments={"x-message-ttl": 0})
    ch.basic_publish("", f"{p}-q", b"nobody")
    after = ch.queue_declare(f"{p}-q", passive=True).method.message_count
    got: list[bytes] = []
    ch.basic_consume(f"{p}-q", lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    ch.basic_publish("", f"{p}-q", b"taken")
    check_for(5, lambda: conn.process_data_events(0.02) or got or None, interval_s=0)
    conn.close()
    return after, got


def _missing_dlx(server: Server, p: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(f"{p}-q", arguments={"x-dead-letter-exchange": f"{p}-none"})
    ch.basic_publish("", f"{p}-q", b"lost")
    method, _, _ = ch.basic_get(f"{p}-q")
    ch.basic_reject(method.delivery_tag, requeue=False)
    count = check_for(
        2, lambda: ch.queue_declare(f"{p}-q", passive=True).method.message_count == 0 or None
    )
    conn.close()
    return count


def _expires(server: Server, p: str) -> Any:
    """x-expires: gone once unused; a consumer keeps it. The probe is a mandatory publish
    (returned once the queue is gone): unlike a passive declare it does not renew the lease."""
    conn = server.pika()
    ch = conn.channel()
    ch.queue_declare(f"{p}-q", arguments={"x-expires": 150})
    ch.queue_declare(f"{p}-used", arguments={"x-expires": 150})
    ch.basic_consume(f"{p}-used", lambda *a: None)
    probe = conn.channel()
    probe.confirm_delivery()

    def gone() -> bool:
        try:
            probe.basic_publish("", f"{p}-q", b"probe", mandatory=True)
        except pika.exceptions.UnroutableError:
            return True
        ch.queue_purge(f"{p}-used")  # not a use of -q; keeps the connection busy
        return False

    check_for(5, gone, interval_s=0.05)
    declared = channel_error(lambda: probe.queue_declare(f"{p}-q", passive=True))
    in_use = channel_error(
        lambda: ch.queue_declare(f"{p}-used", passive=True).method.consumer_count
    )
    conn.close()
    return declared, in_use


@pytest.mark.parametrize(
    "scenario",
    [
        _queue_ttl_dead_letters,
        _message_expiration,
        _reject_chain,
        _cycles,
        _drop_head,
        _drop_head_bytes,
        _reject_publish_dlx,
        _reject_publish,
        _delivery_limit,
        _ttl_zero,
        _missing_dlx,
        _expires,
    ],
)
def test_queue_features_like_rabbitmq(servers: list[Server], names: str, scenario: Any) -> None:
    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit


INVALID_ARGUMENTS: list[dict[str, Any]] = [
    {"x-message-ttl": -1},
    {"x-message-ttl": "soon"},
    {"x-expires": 0},
    {"x-max-length": -2},
    {"x-max-length-bytes": "big"},
    {"x-overflow": "sideways"},
    {"x-dead-letter-routing-key": "k"},
    {"x-dead-letter-exchange": 5},
]


def _invalid_argument(server: Server, p: str, arguments: dict[str, Any]) -> Any:
    conn = server.pika()
    ch = conn.channel()
    outcome = channel_error(lambda: ch.queue_declare(f"{p}-q", arguments=arguments))
    conn.close()
    return outcome


@pytest.mark.parametrize("arguments", INVALID_ARGUMENTS, ids=",".join)
def test_invalid_queue_arguments_like_rabbitmq(
    servers: list[Server], names: str, arguments: dict[str, Any]
) -> None:
    rabbit, gateway = run_both(servers, lambda s, p: _invalid_argument(s, p, arguments), names)
    assert gateway == rabbit


@pytest.mark.parametrize("expiration", ["-5", "soon", "1.5", " 10"])
def test_invalid_expiration_like_rabbitmq(
    servers: list[Server], names: str, expiration: str
) -> None:
    def scenario(server: Server, p: str) -> Any:
        conn = server.pika()
        ch = conn.channel()
        ch.queue_declare(f"{p}-q")
        props = pika.BasicProperties(expiration=expiration)
        ch.basic_publish("", f"{p}-q", b"x", props)
        outcome = channel_error(lambda: ch.queue_declare(f"{p}-q", passive=True))
        if conn.is_open:
            conn.close()
        return outcome

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
