"""Measure what the long-poll read changes: end-to-end latency of a message published on
gateway B to a consumer on gateway A (p50/p99, ~2000 messages at a modest rate), and the idle
CPU of gateway A (and of the broker) with 1,000 consumed-but-idle queues.

    .venv/bin/python tests/cluster/longpoll_probe.py [--messages 2000] [--rate 200]

Starts its own redis-server, `mqgw broker` and two gateways on free loopback ports (from the
source tree in the current directory: run it from a checkout of another version, with
PYTHONPATH set to it, to compare), prints one JSON line, and stops them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pika

from bench.servers import BrokerServer, GatewayServer, check_for, free_port
from tests.harness.redis_server import RedisServer


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def connect(gateway: GatewayServer) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(gateway.url))


def latency(a: GatewayServer, b: GatewayServer, messages: int, rate: float) -> dict[str, float]:
    conn_a = connect(a)
    ch_a = conn_a.channel()
    ch_a.queue_declare("latency")
    seen: list[float] = []
    ch_a.basic_consume(
        "latency",
        lambda _ch, _m, _p, body: seen.append((time.monotonic_ns() - int(body)) / 1e6),
        auto_ack=True,
    )
    conn_a.process_data_events(time_limit=1.0)  # A takes the delivery lease
    done = threading.Event()

    def publish() -> None:
        conn_b = connect(b)
        ch_b = conn_b.channel()
        check_for(5, lambda: ch_b.queue_declare("latency", passive=True))
        for _ in range(messages):
            ch_b.basic_publish("", "latency", str(time.monotonic_ns()).encode())
            conn_b.process_data_events(time_limit=1 / rate)
        conn_b.close()
        done.set()

    threading.Thread(target=publish, daemon=True).start()
    deadline = time.monotonic() + messages / rate + 30
    while (not done.is_set() or len(seen) < messages) and time.monotonic() < deadline:
        conn_a.process_data_events(time_limit=0.05)
    conn_a.close()
    assert len(seen) == messages, f"{len(seen)} of {messages} arrived"
    cuts = statistics.quantiles(seen, n=100)
    return {
        "p50_ms": round(cuts[49], 2),
        "p99_ms": round(cuts[98], 2),
        "max_ms": round(max(seen), 2),
    }


def idle_cpu(
    a: GatewayServer, broker: BrokerServer, queues: int, window_s: float
) -> dict[str, float]:
    conn = connect(a)
    ch = conn.channel()
    for n in range(queues):
        ch.queue_declare(f"idle-{n}")
        ch.basic_consume(f"idle-{n}", lambda *_: None, auto_ack=True)
    assert a.proc is not None and broker.pid is not None
    conn.process_data_events(time_limit=5.0)  # leases taken, reads held
    gw0, br0 = cpu_seconds(a.proc.pid), cpu_seconds(broker.pid)
    conn.process_data_events(time_limit=window_s)
    gw1, br1 = cpu_seconds(a.proc.pid), cpu_seconds(broker.pid)
    conn.close()
    return {
        "gateway_cpu_pct": round(100 * (gw1 - gw0) / window_s, 1),
        "broker_cpu_pct": round(100 * (br1 - br0) / window_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--window", type=float, default=10.0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        redis = RedisServer(root / "redis").start()
        broker = BrokerServer(root / "broker", free_port(), root / "broker.log", "g1", "0",
                              meta=redis.url)  # fmt: skip
        gateways: list[GatewayServer] = []
        try:
            broker.start()
            for name in ("gwA", "gwB"):
                gateways.append(GatewayServer(
                    root / name, ["--meta", redis.url, "--node-name", name]
                ).start())  # fmt: skip
            a, b = gateways
            figures = {"messages": options.messages, "rate": options.rate}
            figures |= latency(a, b, options.messages, options.rate)
            print(json.dumps(figures), flush=True)
            figures |= {"queues": options.queues}
            figures |= idle_cpu(a, broker, options.queues, options.window)
            print(json.dumps(figures), flush=True)
        finally:
            for gateway in gateways:
                gateway.kill()
            broker.kill()
            redis.stop()


if __name__ == "__main__":
    main()
