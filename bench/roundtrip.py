"""`mqgw bench roundtrip`: an aio-pika publisher with confirms and a consumer, side by side.

A first, client-library-level figure (the full raw-socket benchmark is a later issue): N
persistent messages into a durable queue, publisher confirms with a window, one consumer
with manual acks and prefetch; time from the first publish to the last ack.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import aio_pika


async def roundtrip(url: str, count: int, size: int, window: int = 1000) -> dict[str, object]:
    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    body = b"x" * size
    connection = await aio_pika.connect(url)
    async with connection:
        publish_channel = await connection.channel(publisher_confirms=True)
        consume_channel = await connection.channel()
        await consume_channel.set_qos(prefetch_count=window)
        queue = await consume_channel.declare_queue(queue_name, durable=True)
        done = asyncio.get_running_loop().create_future()
        received = 0

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal received
            await message.ack()
            received += 1
            if received == count and not done.done():
                done.set_result(None)

        await queue.consume(on_message)
        slots = asyncio.Semaphore(window)

        async def publish_one() -> None:
            try:
                await publish_channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=queue_name,
                )
            finally:
                slots.release()

        start = time.perf_counter()
        tasks = []
        for _ in range(count):
            await slots.acquire()
            tasks.append(asyncio.ensure_future(publish_one()))
        await asyncio.gather(*tasks)
        published = time.perf_counter() - start
        await done
        elapsed = time.perf_counter() - start
        await queue.delete(if_unused=False, if_empty=False)
    return {
        "url": url.rsplit("@", maxsplit=1)[-1],
        "messages": count,
        "bytes": size,
        "publish_seconds": round(published, 3),
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(count / elapsed),
    }


def run(urls: list[str], count: int, size: int, rounds: int) -> None:
    results: dict[str, list[float]] = {u: [] for u in urls}
    for _ in range(rounds):
        for url in urls:  # alternate, so drift hits both sides alike
            result = asyncio.run(roundtrip(url, count, size))
            print(json.dumps(result), flush=True)
            results[url].append(float(result["msgs_per_s"]))  # type: ignore[arg-type]
    if len(urls) == 2:
        a, b = (sorted(results[u])[len(results[u]) // 2] for u in urls)
        print(json.dumps({"median_ratio_a_over_b": round(a / b, 2), "a": a, "b": b}))
