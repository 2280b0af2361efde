"""Scraping a gateway with 10,000 queues: /metrics/per-object answers in under a second, and
AMQP deliveries keep flowing meanwhile (p99 delivery latency with a scraper running beside it
compared with none). Prints the figures."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import aio_pika
import pytest

from bench.servers import free_port
from mqgw_cli.admin_client import admin_call
from tests.harness.processes import GatewayProcess

QUEUES = 10_000
SCRAPE_LIMIT_S = 1.0
RATE_PER_S = 500
PHASE_S = 4.0
WARM_UP = 20  # the first deliveries include the consumer's start
SCRAPER = """
import base64, sys, time, urllib.request
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/metrics/per-object")
request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
while True:
    started = time.perf_counter()
    urllib.request.urlopen(request, timeout=30).read()
    print(time.perf_counter() - started, flush=True)
"""


@pytest.fixture(scope="module")
def crowded_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = tmp_path_factory.mktemp("crowded") / "data"
    gateway = GatewayProcess(data, ["--admin-port", str(free_port())]).start()
    queues = [
        {"name": f"crowd.{i:05d}", "vhost": "/", "durable": True, "auto_delete": False,
         "arguments": {}}
        for i in range(QUEUES)
    ]  # fmt: skip
    status, answer = gateway.admin("POST", "/api/definitions", {"queues": queues})
    assert status in (200, 201, 204), answer
    yield gateway
    gateway.stop()


def scrape_s(gateway: GatewayProcess, path: str) -> float:
    base = f"http://127.0.0.1:{gateway.admin_port}"
    started = time.perf_counter()
    status, answer = admin_call(base, "GET", path)
    elapsed = time.perf_counter() - started
    assert status == 200, answer
    assert f'queue="crowd.{QUEUES - 1:05d}"' in answer["reason"] or path == "/metrics"
    return elapsed


async def delivery_latencies(url: str, seconds: float) -> list[float]:
    """Publish at RATE_PER_S with the send time in the body; the receive-minus-send times."""
    latencies: list[float] = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=False)
        queue = await channel.declare_queue("crowd.latency", auto_delete=True)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            latencies.append(time.perf_counter() - float(message.body))

        await queue.consume(on_message, no_ack=True)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            body = repr(time.perf_counter()).encode()
            await channel.default_exchange.publish(aio_pika.Message(body), "crowd.latency")
            await asyncio.sleep(1 / RATE_PER_S)
        await asyncio.sleep(0.5)  # the last ones arrive
    return latencies[WARM_UP:]


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


@pytest.mark.slow
def test_scraping_ten_thousand_queues(crowded_gateway: GatewayProcess) -> None:
    scrape_s(crowded_gateway, "/metrics/per-object")  # warm up
    per_object = sorted(scrape_s(crowded_gateway, "/metrics/per-object") for _ in range(5))
    totals = sorted(scrape_s(crowded_gateway, "/metrics") for _ in range(5))
    url = crowded_gateway.url
    quiet = asyncio.run(delivery_latencies(url, PHASE_S))
    # The scraper is another process: in this one it would take the GIL from the client.
    scraper = subprocess.Popen(
        [sys.executable, "-c", SCRAPER, str(crowded_gateway.admin_port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        busy = asyncio.run(delivery_latencies(url, PHASE_S))
    finally:
        scraper.terminate()
        output, _ = scraper.communicate(timeout=30)
    scrapes = [float(line) for line in output.split()]
    print(
        f"\n{QUEUES} queues: /metrics/per-object median {statistics.median(per_object):.3f} s, "
        f"max {per_object[-1]:.3f} s; /metrics median {statistics.median(totals):.3f} s\n"
        f"delivery latency p50/p99: no scrape {statistics.median(quiet) * 1000:.2f}/"
        f"{p99(quiet) * 1000:.2f} ms ({len(quiet)} msgs); scraping continuously "
        f"({len(scrapes)} scrapes, median {statistics.median(scrapes):.3f} s) "
        f"{statistics.median(busy) * 1000:.2f}/{p99(busy) * 1000:.2f} ms ({len(busy)} msgs)"
    )
    assert per_object[-1] < SCRAPE_LIMIT_S
    assert len(busy) >= 0.9 * len(quiet)  # deliveries kept flowing
    # A scrape yields to the event loop every few hundred queues: no delivery waits for it.
    assert p99(busy) < max(0.25, 5 * p99(quiet))
