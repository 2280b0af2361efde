"""Publish flow control across gateways: a publisher on gateway A feeding a queue that gateway
B delivers, faster than B can, is held by B's progress reports at the broker, so the queue does
not grow without bound; once B's consumer is gone, nothing holds A's publishers."""

from __future__ import annotations

import base64
import contextlib
import re
import threading
import time
import urllib.request

from pamqp import commands

from bench.load.connection import RawConnection
from bench.servers import GatewayServer, check_for
from gateway.queues.intake import FLOW_HIGH
from tests.cluster.conftest import Cluster
from tests.cluster.test_two_gateways import channel

BODY = b"x" * 100


def remote_holds(gateway: GatewayServer) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{gateway.admin_port}/metrics")
    request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    found = re.search(r'^mqgw_publisher_flow_holds_total\{by="remote"\} (\S+)$', text, re.M)
    assert found, "no remote flow-hold series in /metrics"
    return int(float(found.group(1)))


class FastConsumer(threading.Thread):
    """An auto-ack consumer that reads its socket as fast as it can and parses nothing (a
    client library would cost this process the CPU the gateways need)."""

    def __init__(self, gateway: GatewayServer, queue: str) -> None:
        super().__init__(daemon=True)
        self.conn = RawConnection(gateway.url)
        self.conn.open_channel(1)
        consume = commands.Basic.Consume(0, queue, "fast", no_ack=True)
        self.conn.call(1, consume, commands.Basic.ConsumeOk)
        self.read = 0
        self.stop = threading.Event()

    def run(self) -> None:
        self.conn.sock.settimeout(0.2)
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                self.read += len(self.conn.sock.recv(1 << 18))
        self.conn.sock.close()


def publish_for(gateway: GatewayServer, exchange: str, seconds: float) -> int:
    conn, ch = channel(gateway)
    sent, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(200):
            ch.basic_publish(exchange, "", BODY)
        sent += 200
    conn.close()
    return sent


def test_a_publisher_on_one_gateway_is_held_while_the_other_cannot_keep_up(
    cluster: Cluster,
) -> None:
    """fanout-10 split over two gateways: B delivers ten queues that A's publisher feeds,
    ten deliveries per publish, more than B can push out."""
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_b, ch_b = channel(b)
    ch_b.exchange_declare("fan", "fanout")
    queues = [f"fan{n}" for n in range(10)]
    consumers = []
    for queue in queues:
        ch_b.queue_declare(queue, durable=True)
        ch_b.queue_bind(queue, "fan")
        consumers.append(FastConsumer(b, queue))
        consumers[-1].start()
    for queue in queues:
        check_for(10, lambda q=queue: f"delivering queue '{q}'" in b.log(), interval_s=0.05)
    check_for(5, lambda: channel(a)[1].queue_declare(queues[-1], passive=True))

    peak, done = 0, threading.Event()
    sent: list[int] = []
    publisher = threading.Thread(target=lambda: (sent.append(publish_for(a, "fan", 4)),
                                                 done.set()))  # fmt: skip
    publisher.start()
    while not done.is_set():  # the holder's counts: its read positions against the ends
        for queue in queues:
            peak = max(peak, ch_b.queue_declare(queue, passive=True).method.message_count)
        conn_b.sleep(0.1)
    publisher.join()
    # Unheld, the publisher outruns B's deliveries by far and tens of thousands pile up in
    # each queue; held, each stays within a few publish batches of FLOW_HIGH.
    assert peak < 6 * FLOW_HIGH, (peak, sent[0], [c.read for c in consumers])
    assert remote_holds(a) > 0
    assert remote_holds(b) == 0  # B delivers the queues: nothing of this is held there

    # B's consumers go: the reports say so (no credit, then no lease), and hold nobody.
    for consumer in consumers:
        consumer.stop.set()
        consumer.join()
    before = remote_holds(a)
    conn_a, ch_a = channel(a)
    for _ in range(10_000):
        ch_a.basic_publish("fan", "", BODY)
    ready = ch_a.queue_declare(queues[0], passive=True).method.message_count  # after them all
    assert ready >= 10_000
    assert remote_holds(a) - before <= 1  # at most while the last move was recent
    conn_a.close()
    conn_b.close()
