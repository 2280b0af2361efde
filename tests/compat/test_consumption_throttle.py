"""Throttles set over HTTP hold: the delivered rate stays within ±10 % of the limit, the
tightest of two scopes binds, and a bytes/s limit paces by body size.

The consumer is the benchmark's raw-socket client (bench/load), fast enough that the gateway,
not the consumer, sets the pace: each read is stamped, and the deliveries in a window after a
warm-up give the rate. The default tier measures 3 rates over 4 s windows; the slow tier
covers the issue's range, 10 to 50,000 msgs/s, over 10 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from pamqp import commands

from bench.load.connection import RawConnection
from bench.load.frames import PublishTemplate
from bench.servers import free_port
from tests.compat.test_consumption_control import put_control, queue_stats
from tests.harness.processes import GatewayProcess, check_for

WARMUP_S = 0.5
TOLERANCE = 0.10


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = tmp_path_factory.mktemp("throttle") / "data"
    process = GatewayProcess(
        data, ["--admin-port", str(free_port())], env={"MQGW_FLUSH": "async"}
    ).start()
    yield process
    process.stop()


def preload(gateway: GatewayProcess, queue: str, count: int, body_bytes: int = 32) -> None:
    """Declare ``queue`` and fill it with ``count`` messages over one raw connection."""
    conn = RawConnection(gateway.url)
    conn.open_channel(1)
    conn.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    template = PublishTemplate.build(1, "", queue, body_bytes, persistent=False)
    batch = 2000
    for first in range(0, count, batch):
        conn.send(b"".join(template.render(n, 0) for n in range(first, min(first + batch, count))))
    conn.close()
    check_for(60, lambda: queue_stats(gateway, queue)["messages_ready"] == count)


class RawCounter:
    """A no-ack consumer on its own thread that stamps how many deliveries each read brought."""

    def __init__(self, gateway: GatewayProcess, queue: str) -> None:
        self.conn = RawConnection(gateway.url)
        self.conn.open_channel(1)
        self.stamps: list[tuple[float, int]] = []
        self.queue = queue
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> RawCounter:
        consume = commands.Basic.Consume(queue=self.queue, consumer_tag="t", no_ack=True)
        self.conn.call(1, consume, commands.Basic.ConsumeOk)
        self.started = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        self.conn.sock.settimeout(0.2)
        parser = self.conn.parser
        while not self._stop.is_set():
            try:
                self.conn.receive()
            except TimeoutError:
                continue
            if parser.deliveries:
                self.stamps.append((time.monotonic(), len(parser.deliveries)))
                parser.deliveries.clear()

    def rate(self, window_s: float) -> float:
        """Deliveries per second in [start + warm-up, + window], waiting for the window."""
        begin = self.started + WARMUP_S
        end = begin + window_s
        time.sleep(max(0.0, end - time.monotonic()))  # the measurement window itself
        self.stop()
        return sum(n for at, n in self.stamps if begin <= at < end) / window_s

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.conn.sock.close()


def measured_rate(gateway: GatewayProcess, queue: str, window_s: float) -> float:
    return RawCounter(gateway, queue).start().rate(window_s)


def test_raw_counter_sees_an_unthrottled_queue_faster_than_the_limits(
    gateway: GatewayProcess,
) -> None:
    """The consumer is not the bottleneck: unthrottled, far more than the highest limit."""
    preload(gateway, "unthrottled", 30_000)
    counter = RawCounter(gateway, "unthrottled").start()
    check_for(10, lambda: sum(n for _, n in counter.stamps) == 30_000)
    elapsed = counter.stamps[-1][0] - counter.started
    counter.stop()
    assert 30_000 / elapsed > 6_000, elapsed


@pytest.mark.parametrize("rate", [20, 300, 3000])
def test_queue_throttle_holds_within_ten_percent(gateway: GatewayProcess, rate: int) -> None:
    queue, window_s = f"throttle-{rate}", 4.0
    preload(gateway, queue, int(rate * (WARMUP_S + window_s) * 1.5) + 10)
    put_control(gateway, f"/api/controls/queues/%2F/{queue}", {"rate_msgs": rate})
    measured = measured_rate(gateway, queue, window_s)
    assert abs(measured - rate) <= rate * TOLERANCE, (measured, rate)


def test_the_tightest_of_two_scopes_binds(gateway: GatewayProcess) -> None:
    queue = "throttle-two"
    preload(gateway, queue, 2000)
    put_control(gateway, f"/api/controls/queues/%2F/{queue}", {"rate_msgs": 400})
    put_control(gateway, "/api/controls/global", {"rate_msgs": 100})
    try:
        measured = measured_rate(gateway, queue, 4.0)
    finally:
        gateway.admin("DELETE", "/api/controls/global")
    assert abs(measured - 100) <= 100 * TOLERANCE, measured


def test_a_bytes_limit_paces_by_body_size(gateway: GatewayProcess) -> None:
    queue = "throttle-bytes"
    preload(gateway, queue, 1500, body_bytes=1000)
    put_control(gateway, "/api/controls/clients/127.0.0.1", {"rate_bytes": 100_000})
    try:
        measured = measured_rate(gateway, queue, 4.0)
    finally:
        gateway.admin("DELETE", "/api/controls/clients/127.0.0.1")
    assert abs(measured - 100) <= 100 * TOLERANCE, measured  # 100,000 B/s of 1,000 B bodies


def test_lifting_a_throttle_restores_full_speed(gateway: GatewayProcess) -> None:
    queue = "throttle-lifted"
    preload(gateway, queue, 20_000)
    put_control(gateway, f"/api/controls/queues/%2F/{queue}", {"rate_msgs": 50})
    counter = RawCounter(gateway, queue).start()
    check_for(5, lambda: queue_stats(gateway, queue)["mqgw"]["delivered"] >= 25)
    status, _ = gateway.admin("PUT", f"/api/controls/queues/%2F/{queue}", {"rate_msgs": None})
    assert status == 204  # nothing left in the control: it is removed
    check_for(10, lambda: queue_stats(gateway, queue)["mqgw"]["delivered"] == 20_000)
    counter.stop()


@pytest.mark.slow
@pytest.mark.parametrize("rate", [10, 1000, 10_000, 50_000])
def test_throttle_holds_over_ten_seconds_from_10_to_50k(gateway: GatewayProcess, rate: int) -> None:
    queue, window_s = f"throttle-slow-{rate}", 10.0
    preload(gateway, queue, int(rate * (WARMUP_S + window_s) * 1.2) + 10)
    put_control(gateway, f"/api/controls/queues/%2F/{queue}", {"rate_msgs": rate})
    measured = measured_rate(gateway, queue, window_s)
    assert abs(measured - rate) <= rate * TOLERANCE, (measured, rate)
