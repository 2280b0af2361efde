"""What the replication tests share: a confirming publisher thread, draining a queue, and a
group with a gateway under a publisher's load."""

from __future__ import annotations

import threading
import time

import pika

from tests.replication.conftest import Group


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


def drain(url: str, queue: str, expected: set[int], timeout_s: float = 30) -> dict[int, int]:
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


async def loaded_group(
    group: Group, controllers: int = 1, broker_flags: tuple[str, ...] = ()
) -> tuple[Publisher, str]:
    for n in range(1, controllers + 1):
        group.add_controller(f"c{n}")
    group.add_broker("a", *broker_flags)
    group.add_broker("b", *broker_flags)
    await group.until(lambda r: r.master != "" and len(r.in_sync) == 2)
    gateway = group.add_gateway("gw1")
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    connection.channel().queue_declare("orders", durable=True)
    connection.close()
    publisher = Publisher(gateway.url, "orders")
    publisher.start()
    more(publisher, 200)
    return publisher, gateway.url


def more(publisher: Publisher, count: int, timeout_s: float = 15) -> None:
    target = len(publisher.confirmed) + count
    deadline = time.monotonic() + timeout_s
    while len(publisher.confirmed) < target and time.monotonic() < deadline:
        assert publisher.error is None, repr(publisher.error)
        time.sleep(0.02)
    assert len(publisher.confirmed) >= target, "publishing stalled"


def finish(publisher: Publisher, url: str) -> None:
    publisher.stop.set()
    publisher.join(10)
    assert publisher.error is None, repr(publisher.error)
    confirmed = set(publisher.confirmed)
    seen = drain(url, "orders", confirmed)
    missing = confirmed - set(seen)
    assert not missing, f"{len(missing)} confirmed message(s) lost, e.g. {sorted(missing)[:5]}"
