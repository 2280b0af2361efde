"""Direct reply-to (amq.rabbitmq.reply-to), as RabbitMQ's RPC clients use it."""

from __future__ import annotations

import pika
import pytest

from tests.harness.processes import GatewayProcess


def test_rpc_round_trip_through_direct_reply_to(gateway: GatewayProcess) -> None:
    server_conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    server = server_conn.channel()
    server.queue_declare("rpc")
    client_conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    client = client_conn.channel()
    replies: list[tuple[bytes, str | None]] = []
    client.basic_consume(
        "amq.rabbitmq.reply-to",
        lambda _ch, _m, props, body: replies.append((body, props.correlation_id)),
        auto_ack=True,
    )
    for n in range(3):
        client.basic_publish(
            "",
            "rpc",
            b"q%d" % n,
            pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=str(n)),
        )
        method, props, body = server.basic_get("rpc", auto_ack=True)
        assert method is not None
        assert props.reply_to.startswith("amq.rabbitmq.reply-to.")  # rewritten per channel
        server.basic_publish(
            "",
            props.reply_to,
            b"a:" + body,
            pika.BasicProperties(correlation_id=props.correlation_id),
        )
        while len(replies) <= n:
            client_conn.process_data_events(time_limit=1)
    assert replies == [(b"a:q0", "0"), (b"a:q1", "1"), (b"a:q2", "2")]
    # Replies are never stored: nothing waits in any queue.
    assert server.queue_declare("rpc", passive=True).method.message_count == 0
    client_conn.close()
    # The requester is gone: a mandatory reply comes back unroutable.
    server.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        server.basic_publish("", "amq.rabbitmq.reply-to.gone", b"late", mandatory=True)
    server_conn.close()


def test_direct_reply_to_refusals_match_rabbitmq(gateway: GatewayProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_consume("amq.rabbitmq.reply-to", lambda *_: None, auto_ack=False)
        conn.process_data_events(time_limit=1)
    assert info.value.args == (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("", "x", b"q", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    assert info.value.args == (406, "PRECONDITION_FAILED - fast reply consumer does not exist")
    conn.close()
