"""pika, unchanged, against a real gateway process, on both anyio backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.harness.processes import GatewayProcess


@pytest.fixture(params=["asyncio", "trio"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayProcess]:
    """The core scenarios run on asyncio (uvloop) and on trio."""
    process = GatewayProcess(tmp_path / "data", args=["--backend", request.param]).start()
    yield process
    process.stop()


def _connect(gateway: GatewayProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(gateway.url))


def test_blocking_publish_confirm_get_consume_ack(gateway: GatewayProcess) -> None:
    conn = _connect(gateway)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("work", durable=True)
    ch.exchange_declare("events", "topic", durable=True)
    ch.queue_bind("work", "events", "order.#")
    for i in range(10):
        ch.basic_publish("events", f"order.{i}", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    ch.basic_publish("events", "other", b"dropped")
    assert ch.queue_declare("work", passive=True).method.message_count == 10
    method, _props, body = ch.basic_get("work")
    assert (body, method.message_count, method.redelivered) == (b"m0", 9, False)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _props, body = ch.basic_get("work", auto_ack=True)
    assert (body, method.redelivered) == (b"m0", True)  # requeued ahead of newer messages
    ch.basic_qos(prefetch_count=3)
    received: list[bytes] = []
    for method, _props, body in ch.consume("work", inactivity_timeout=5):
        assert method is not None
        received.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(received) == 9:
            break
    ch.cancel()
    assert received == [b"m%d" % i for i in range(1, 10)]
    assert ch.queue_declare("work", passive=True).method.message_count == 0
    conn.close()


def test_errors_close_the_channel_with_rabbitmq_codes(gateway: GatewayProcess) -> None:
    conn = _connect(gateway)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("missing", passive=True)
    assert (info.value.reply_code, info.value.reply_text) == (
        404,
        "NOT_FOUND - no queue 'missing' in vhost '/'",
    )
    ch = conn.channel()
    ch.exchange_declare("x1", "direct")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare("x1", "fanout")
    assert info.value.reply_code == 406
    assert "inequivalent arg 'type' for exchange 'x1'" in info.value.reply_text
    ch = conn.channel()  # the connection carries on
    assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    conn.close()


def test_wrong_password_is_refused_with_403(gateway: GatewayProcess) -> None:
    params = pika.URLParameters(gateway.url.replace("guest:guest", "guest:wrong"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params)
    assert "ACCESS_REFUSED" in str(info.value)


def test_unknown_vhost_is_refused_with_530(gateway: GatewayProcess) -> None:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(pika.URLParameters(gateway.url[: -len("%2F")] + "nowhere"))
    assert "(530) 'NOT_ALLOWED - vhost nowhere not found'" in str(info.value)


def test_mandatory_unroutable_is_returned_312(gateway: GatewayProcess) -> None:
    conn = _connect(gateway)
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        ch.basic_publish("amq.direct", "nobody", b"x", mandatory=True)
    returned = info.value.messages[0]
    assert (returned.method.reply_code, returned.method.reply_text) == (312, "NO_ROUTE")
    assert returned.body == b"x"
    conn.close()


def test_select_connection_round_trip(gateway: GatewayProcess) -> None:
    received: list[bytes] = []

    def on_open(conn: pika.SelectConnection) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch: pika.channel.Channel) -> None:
        ch.queue_declare("sel", callback=lambda _f: declared(ch))

    def declared(ch: pika.channel.Channel) -> None:
        ch.basic_consume("sel", on_message, auto_ack=True)
        for i in range(3):
            ch.basic_publish("", "sel", b"s%d" % i)

    def on_message(ch: pika.channel.Channel, _m: object, _p: object, body: bytes) -> None:
        received.append(body)
        if len(received) == 3:
            ch.connection.close()

    conn = pika.SelectConnection(pika.URLParameters(gateway.url), on_open_callback=on_open)
    conn.ioloop.call_later(10, conn.ioloop.stop)
    conn.add_on_close_callback(lambda *_: conn.ioloop.stop())
    conn.ioloop.start()
    assert received == [b"s0", b"s1", b"s2"]
