"""aio-pika (robust connection, confirms, the RPC pattern) and aiormq against the gateway."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aiormq
import pytest
from pamqp import commands

from tests.harness.processes import GatewayProcess


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_aio_pika_robust_confirms_and_consume(gateway: GatewayProcess) -> None:
    async def scenario() -> list[bytes]:
        conn = await aio_pika.connect_robust(gateway.url)
        async with conn:
            channel = await conn.channel(publisher_confirms=True)
            queue = await channel.declare_queue("aio", durable=True)
            for i in range(50):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(b"a%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key="aio",
                )
                assert isinstance(confirmation, aiormq.abc.ConfirmationFrameType)
                assert isinstance(confirmation, commands.Basic.Ack)
            got: list[bytes] = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        got.append(message.body)
                    if len(got) == 50:
                        break
            return got

    assert run(scenario()) == [b"a%d" % i for i in range(50)]


def test_aio_pika_rpc_pattern_with_reply_to_and_correlation_id(gateway: GatewayProcess) -> None:
    async def scenario() -> list[str]:
        conn = await aio_pika.connect_robust(gateway.url)
        async with conn:
            server_channel = await conn.channel()
            requests = await server_channel.declare_queue("rpc_requests")

            async def serve(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with message.process():
                    reply = b"echo:" + message.body
                    await server_channel.default_exchange.publish(
                        aio_pika.Message(reply, correlation_id=message.correlation_id),
                        routing_key=message.reply_to or "",
                    )

            await requests.consume(serve)
            client_channel = await conn.channel()
            callback_queue = await client_channel.declare_queue(exclusive=True)
            futures: dict[str, asyncio.Future[bytes]] = {}

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                futures.pop(message.correlation_id or "").set_result(message.body)

            await callback_queue.consume(on_reply, no_ack=True)
            results = []
            for n in range(5):
                correlation_id = str(uuid.uuid4())
                future = futures[correlation_id] = asyncio.get_running_loop().create_future()
                await client_channel.default_exchange.publish(
                    aio_pika.Message(
                        b"%d" % n, correlation_id=correlation_id, reply_to=callback_queue.name
                    ),
                    routing_key="rpc_requests",
                )
                results.append((await future).decode())
            return results

    assert run(scenario()) == [f"echo:{n}" for n in range(5)]


def test_aiormq_raw_channel_errors_and_recovery(gateway: GatewayProcess) -> None:
    async def scenario() -> None:
        conn = await aiormq.connect(gateway.url)
        channel = await conn.channel()
        await channel.queue_declare("raw")
        await channel.basic_publish(b"hello", routing_key="raw")
        message = await channel.basic_get("raw")
        assert message.body == b"hello"
        await channel.basic_ack(message.delivery_tag)
        await channel.basic_ack(message.delivery_tag)  # double ack: the channel is closed
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
            await channel.basic_get("raw")
        assert "unknown delivery tag" in str(info.value)
        channel = await conn.channel()  # the connection is still fine
        result = await channel.queue_declare("raw", passive=True)
        assert result.message_count == 0
        await conn.close()

    run(scenario())
