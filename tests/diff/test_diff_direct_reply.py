"""Direct reply-to against RabbitMQ: the round trip and the refusals, compared."""

from __future__ import annotations

from typing import Any

import pika

from tests.diff.support import Server, channel_error, run_both


def _round_trip(server: Server, prefix: str) -> Any:
    conn = server.pika()
    ch = conn.channel()
    ch.queue_declare(f"{prefix}rpc")
    replies: list[tuple[bytes, str | None]] = []
    ch.basic_consume(
        "amq.rabbitmq.reply-to",
        lambda _c, _m, props, body: replies.append((body, props.correlation_id)),
        auto_ack=True,
    )
    ch.basic_publish(
        "",
        f"{prefix}rpc",
        b"ping",
        pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="7"),
    )
    _method, props, body = ch.basic_get(f"{prefix}rpc", auto_ack=True)
    rewritten = props.reply_to.startswith("amq.rabbitmq.reply-to.")
    ch.basic_publish(
        "",
        props.reply_to,
        b"pong:" + body,
        pika.BasicProperties(correlation_id=props.correlation_id),
    )
    while not replies:
        conn.process_data_events(time_limit=1)
    passive = ch.queue_declare("amq.rabbitmq.reply-to", passive=True).method
    outcome = (rewritten, replies, passive.message_count, passive.consumer_count)
    conn.close()
    return outcome


def _refusals(server: Server, _prefix: str) -> Any:
    conn = server.pika()
    results = []
    ch = conn.channel()

    def consume_with_acks() -> None:
        ch.basic_consume("amq.rabbitmq.reply-to", lambda *_: None, auto_ack=False)
        conn.process_data_events(time_limit=0.5)

    results.append(channel_error(consume_with_acks))
    ch = conn.channel()
    ch.confirm_delivery()
    results.append(
        channel_error(
            lambda: ch.basic_publish(
                "", "x", b"q", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
            )
        )
    )
    conn.close()
    return results


def test_direct_reply_round_trip_matches(servers: list[Server], names: str) -> None:
    rabbit, gateway = run_both(servers, _round_trip, names)
    assert gateway == rabbit
    assert rabbit == (True, [(b"pong:ping", "7")], 0, 1)


def test_direct_reply_refusals_match(servers: list[Server], names: str) -> None:
    rabbit, gateway = run_both(servers, _refusals, names)
    assert gateway == rabbit
