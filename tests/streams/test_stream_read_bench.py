"""Bench (slow tier): read a stream of N messages (default 1M, MQGW_STREAM_BENCH_N) from
"first" on the gateway and on RabbitMQ 3.10 with the same client (pika, prefetch 2,000,
multiple acks) and compare the read rates. Prints one JSON line per server and the ratio.

    .venv/bin/pytest tests/streams/test_stream_read_bench.py -m slow -s
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from bench.servers import free_port
from tests.harness.processes import GatewayProcess
from tests.harness.rabbitmq import RabbitMQProcess

COUNT = int(os.environ.get("MQGW_STREAM_BENCH_N", "1000000"))
BODY = b"x" * 100
PREFETCH = 2000


def _fill(url: str, queue: str) -> float:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    started = time.monotonic()
    batch = 10_000
    for start in range(0, COUNT, batch):
        for _ in range(min(batch, COUNT - start) - 1):
            channel.basic_publish("", queue, BODY, mandatory=False)
        channel.basic_publish("", queue, BODY)  # confirmed: everything before it is stored
        if start % 100_000 == 0:
            print(f"  published {start + batch:,}/{COUNT:,}", flush=True)
    connection.close()
    return time.monotonic() - started


def _read(url: str, queue: str) -> float:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    seen = 0
    started = time.monotonic()

    def on_message(ch: Any, method: Any, _props: Any, _body: bytes) -> None:
        nonlocal seen
        seen += 1
        if seen % (PREFETCH // 2) == 0 or seen == COUNT:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if seen == COUNT:
            ch.stop_consuming()

    channel.basic_consume(queue, on_message, arguments={"x-stream-offset": "first"})
    channel.start_consuming()
    elapsed = time.monotonic() - started
    connection.close()
    return elapsed


@pytest.mark.slow
def test_reading_a_stream_against_rabbitmq(tmp_path: Path) -> None:
    rabbit = RabbitMQProcess(tmp_path / "rabbitmq").start()
    gateway = GatewayProcess(tmp_path / "gw", ["--admin-port", str(free_port())], flush="sync")
    gateway.start()
    rates = {}
    try:
        for name, url in (("rabbitmq", rabbit.url), ("gateway", gateway.url)):
            fill_s = _fill(url, "bench-stream")
            read_s = _read(url, "bench-stream")
            rates[name] = COUNT / read_s
            line = {"server": name, "messages": COUNT, "fill_s": round(fill_s, 2),
                    "read_s": round(read_s, 2), "read_msg_per_s": round(rates[name])}  # fmt: skip
            print(json.dumps(line), flush=True)
    finally:
        gateway.stop()
        rabbit.stop()
    ratio = rates["gateway"] / rates["rabbitmq"]
    print(json.dumps({"read_rate_ratio_gateway_over_rabbitmq": round(ratio, 2)}))
    assert ratio > 1.0, rates
