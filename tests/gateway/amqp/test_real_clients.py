"""Real client libraries (pika, aiormq) against ServerConnection over a socket.

A toy shell (a dict of queued messages, no routing) drives the sans-IO
connection; what is checked is the protocol layer: handshake, confirms,
properties passed through verbatim, large bodies, channel and connection errors
as the clients interpret them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pamqp import commands

from gateway.amqp import ServerConnection, events
from gateway.amqp.errors import NotFound

pika = pytest.importorskip("pika")
aiormq = pytest.importorskip("aiormq")


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    conn = ServerConnection(heartbeat_s=0)
    queued: list[tuple[bytes, bytes]] = []
    while not conn.closed:
        data = await reader.read(65536)
        if not data:
            break
        pending: list[Any] = conn.receive_data(data)
        while pending:
            event = pending.pop(0)
            if isinstance(event, events.AuthRequested):
                ok = event.password == b"guest"
                pending += conn.accept_auth() if ok else conn.reject_auth("bad password")
            elif isinstance(event, events.VHostOpenRequested):
                pending += conn.accept_vhost() if event.vhost == "/" else conn.reject_vhost()
            elif isinstance(event, events.ChannelCloseRequested):
                conn.channel_close_ok(event.channel)
            elif isinstance(event, events.Publish):
                queued.append((event.properties_bytes, event.body))
                conn.send_ack(event.channel, len(queued))
            elif isinstance(event, events.ChannelMethod):
                _answer(conn, event.channel, event.method, queued)
        writer.write(conn.data_to_send())
        await writer.drain()
    writer.close()


def _answer(conn: ServerConnection, channel: int, method: Any, queued: list[Any]) -> None:
    if isinstance(method, commands.Queue.Declare):
        conn.send_method(channel, commands.Queue.DeclareOk(method.queue, len(queued), 0))
    elif isinstance(method, commands.Queue.Delete):
        conn.close_channel(channel, NotFound("no queue 'zz' in vhost '/'", 50, 40))
    elif isinstance(method, commands.Confirm.Select):
        conn.send_method(channel, commands.Confirm.SelectOk())
    elif isinstance(method, commands.Basic.Cancel):
        conn.send_method(channel, commands.Basic.CancelOk(method.consumer_tag))
    elif isinstance(method, commands.Basic.Consume):
        tag = method.consumer_tag or "ctag-1"
        conn.send_method(channel, commands.Basic.ConsumeOk(tag))
        for tag_number, (properties, body) in enumerate(queued, 1):
            conn.send_deliver(channel, tag, tag_number, False, "", "q", properties, body)


@pytest.fixture
def port() -> Iterator[int]:
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        holder["server"] = await asyncio.start_server(_serve_one, "127.0.0.1", 0)
        holder["port"] = holder["server"].sockets[0].getsockname()[1]
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    assert started.wait(5)
    yield holder["port"]
    loop.call_soon_threadsafe(holder["server"].close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _params(port: int, password: str = "guest", vhost: str = "/") -> Any:
    return pika.ConnectionParameters(
        port=port,
        virtual_host=vhost,
        credentials=pika.PlainCredentials("guest", password),
        socket_timeout=5,
        connection_attempts=1,
    )


def test_pika_publish_confirm_consume_and_errors(port: int) -> None:
    connection = pika.BlockingConnection(_params(port))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("q")
    properties = pika.BasicProperties(
        content_type="text/plain", headers={"h": [1, {"x": "y"}]}, delivery_mode=2
    )
    channel.basic_publish("", "q", b"hello", properties)
    channel.basic_publish("", "q", b"B" * 400_000)  # several body frames both ways
    got: list[tuple[Any, ...]] = []

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        got.append((props.content_type, props.headers, props.delivery_mode, len(body)))
        if len(got) == 2:
            ch.stop_consuming()

    channel.basic_consume("q", on_message, auto_ack=True)
    channel.start_consuming()
    assert got == [("text/plain", {"h": [1, {"x": "y"}]}, 2, 5), (None, None, None, 400_000)]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_delete("zz")
    assert closed.value.reply_code == 404
    assert closed.value.reply_text == "NOT_FOUND - no queue 'zz' in vhost '/'"
    connection.channel().queue_declare("q")  # the connection survived the soft error
    connection.close()


def test_pika_sees_auth_and_vhost_refusals(port: int) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(_params(port, password="wrong"))
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as denied:
        pika.BlockingConnection(_params(port, vhost="nope"))
    assert "NOT_ALLOWED - vhost nope not found" in str(denied.value)


def test_aiormq_handshake_and_publish(port: int) -> None:
    async def run() -> None:
        connection = await aiormq.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
        channel = await connection.channel()
        confirmation = await channel.basic_publish(b"aio", routing_key="q")
        assert isinstance(confirmation, commands.Basic.Ack)
        await connection.close()

    asyncio.run(asyncio.wait_for(run(), 10))
