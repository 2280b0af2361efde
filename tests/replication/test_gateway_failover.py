"""A master killed under a publisher's confirm load: the gateway follows the new master,
re-sends what was not confirmed, and keeps the AMQP connection; nothing confirmed is lost."""

from __future__ import annotations

import threading
import time

import pika
import pytest

from tests.replication.conftest import Group

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


class Publisher(threading.Thread):
    """Publishes numbered persistent messages with confirms until stopped; records which
    were confirmed and the longest wait for one confirm."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.confirmed: list[int] = []
        self.longest_stall_s = 0.0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = connection.channel()
            channel.confirm_delivery()
            n = 0
            while not self.stop.is_set():
                started = time.monotonic()
                channel.basic_publish(
                    "", self.queue, str(n).encode(),
                    pika.BasicProperties(delivery_mode=2), mandatory=True,
                )  # fmt: skip
                self.longest_stall_s = max(self.longest_stall_s, time.monotonic() - started)
                self.confirmed.append(n)
                n += 1
            connection.close()
        except BaseException as error:  # reported by the test
            self.error = error


def _drain(url: str, queue: str, expected: set[int], timeout_s: float = 30) -> dict[int, int]:
    seen: dict[int, int] = {}
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    deadline = time.monotonic() + timeout_s
    while not expected <= set(seen) and time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        n = int(body)
        seen[n] = seen.get(n, 0) + 1
    connection.close()
    return seen


async def test_master_kill_loses_no_confirmed_message(group: Group) -> None:
    group.add_controller("c1")
    group.add_broker("a")
    group.add_broker("b")
    record = await group.until(lambda r: r.master != "" and len(r.in_sync) == 2)
    gateway = group.add_gateway("gw1")
    url = gateway.url
    connection = pika.BlockingConnection(pika.URLParameters(url))
    connection.channel().queue_declare("orders", durable=True)
    connection.close()
    publisher = Publisher(url, "orders")
    publisher.start()
    while len(publisher.confirmed) < 300 and publisher.error is None:
        time.sleep(0.02)
    killed = record.master
    group.master(record).kill()
    before_kill = len(publisher.confirmed)
    await group.until(lambda r: r.master not in ("", killed), timeout_s=10)
    deadline = time.monotonic() + 10
    while len(publisher.confirmed) < before_kill + 300 and time.monotonic() < deadline:
        time.sleep(0.02)
    publisher.stop.set()
    publisher.join(10)
    assert publisher.error is None, f"{publisher.error!r}\n{gateway.log()[-6000:]}"
    assert len(publisher.confirmed) >= before_kill + 300, "publishing did not resume"
    confirmed = set(publisher.confirmed)
    seen = _drain(url, "orders", confirmed)
    missing = confirmed - set(seen)
    assert not missing, f"{len(missing)} confirmed message(s) lost, e.g. {sorted(missing)[:5]}"
    print(f"longest confirm stall at master kill: {publisher.longest_stall_s:.2f} s")
    assert publisher.longest_stall_s < 5
