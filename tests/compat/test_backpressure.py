"""A consumer that never reads its socket: the gateway stops pushing to it at a high-water
mark, its memory stays bounded, and every other consumer keeps receiving."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pika
from pamqp import body, commands, frame, header

from tests.harness.processes import GatewayProcess, check_for
from tests.harness.raw_client import handshake, read_frames

MESSAGES = 100_000
SIZE = 1024  # 100 MB in all: far more than the gateway may hold for one slow client


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _count(url: str, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def _flood(port: int, queue: str, count: int, size: int) -> tuple[socket.socket, bytearray]:
    """Declare ``queue`` and pipeline ``count`` publishes into it over a raw connection."""
    sock, buffer = handshake(port)
    sock.sendall(frame.marshal(commands.Queue.Declare(queue=queue), 1))
    read_frames(sock, buffer)
    message = b"".join(
        (
            frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1),
            frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), 1),
            frame.marshal(body.ContentBody(b"x" * size), 1),
        )
    )
    chunk = message * 1000
    for _ in range(count // 1000):
        sock.sendall(chunk)
    return sock, buffer


def test_a_stalled_consumer_costs_bounded_memory(gateway: GatewayProcess) -> None:
    assert gateway.proc is not None
    _flood(gateway.amqp_port, "flood", MESSAGES, SIZE)[0].close()
    check_for(60, lambda: _count(gateway.url, "flood") == MESSAGES, interval_s=0.2)
    rss_before = _rss_mb(gateway.proc.pid)

    stalled, _ = handshake(gateway.amqp_port)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    stalled.sendall(frame.marshal(commands.Basic.Consume(queue="flood", no_ack=True), 1))
    # Wait until the gateway has stopped pushing: the count stops falling.
    counts: list[int] = []

    def settled() -> bool:
        counts.append(_count(gateway.url, "flood"))
        return len(counts) >= 3 and counts[-1] == counts[-2] == counts[-3] < MESSAGES

    check_for(30, settled, interval_s=0.3)
    growth = _rss_mb(gateway.proc.pid) - rss_before
    assert counts[-1] > MESSAGES // 2, "the gateway delivered most of the backlog anyway"
    assert growth < 40, f"gateway RSS grew {growth:.0f} MB for one stalled consumer"

    # Everyone else is served as usual.
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    ch = conn.channel()
    ch.queue_declare("other")
    for i in range(50):
        ch.basic_publish("", "other", b"%d" % i)
    got = []
    for method, _props, payload in ch.consume("other", auto_ack=True, inactivity_timeout=5):
        assert method is not None, "another consumer starved"
        got.append(payload)
        if len(got) == 50:
            break
    assert got == [b"%d" % i for i in range(50)]
    conn.close()
    stalled.close()


def test_a_fast_consumer_receives_a_long_backlog_without_stalling(gateway: GatewayProcess) -> None:
    """Back-pressure accounting must return to zero: an estimate that drifted by a few bytes
    per message once stopped deliveries for good after ~70k small messages."""
    count, size = 150_000, 100
    sock, buffer = _flood(gateway.amqp_port, "long", count, size)
    check_for(60, lambda: _count(gateway.url, "long") == count, interval_s=0.2)
    sock.sendall(frame.marshal(commands.Basic.Consume(queue="long", no_ack=True), 1))
    sock.settimeout(10)
    bodies = 0
    pending = bytearray(buffer)
    while bodies < count:
        pending += sock.recv(1 << 20)  # a stall ends the test with a timeout
        pos = 0
        while len(pending) - pos >= 7:
            kind, _channel, length = struct.unpack_from(">BHI", pending, pos)
            if len(pending) - pos < length + 8:
                break
            bodies += kind == 3
            pos += length + 8
        del pending[:pos]
    sock.close()
    assert bodies == count
