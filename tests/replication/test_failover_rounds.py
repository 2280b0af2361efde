"""Slow tier: 20 rounds of master kill -9 under confirm load from pika, aio-pika and kombu
publishers at once. Every confirmed message is consumed afterwards; clients stay connected;
the longest confirm stall of each round is reported (the figure of issue 12).

    .venv/bin/pytest -m slow tests/replication/test_failover_rounds.py -s
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import aio_pika
import kombu
import pika
import pytest

from tests.replication.conftest import Group
from tests.replication.load import Publisher, drain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]
ROUNDS = int(os.environ.get("MQGW_FAILOVER_ROUNDS", "20"))


class KombuPublisher(Publisher):
    def run(self) -> None:
        try:
            with kombu.Connection(
                self.url, transport_options={"confirm_publish": True}
            ) as connection:
                producer = connection.Producer()
                n = 0
                while not self.stop.is_set():
                    started = time.monotonic()
                    producer.publish(
                        f"k{n}", exchange="", routing_key=self.queue, delivery_mode=2,
                        serializer="raw", retry=False,
                    )  # fmt: skip
                    self.longest_stall_s = max(self.longest_stall_s, time.monotonic() - started)
                    self.confirmed.append(n)
                    n += 1
        except BaseException as error:
            self.error = error


class AioPikaPublisher(Publisher):
    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as error:
            self.error = error

    async def _run(self) -> None:
        connection = await aio_pika.connect(self.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            n = 0
            while not self.stop.is_set():
                started = time.monotonic()
                await channel.default_exchange.publish(
                    aio_pika.Message(f"a{n}".encode(), delivery_mode=2), routing_key=self.queue
                )
                self.longest_stall_s = max(self.longest_stall_s, time.monotonic() - started)
                self.confirmed.append(n)
                n += 1


def _stall_round(publishers: list[Publisher]) -> float:
    worst = max(p.longest_stall_s for p in publishers)
    for p in publishers:
        p.longest_stall_s = 0.0
    return worst


def _progress(publishers: list[Publisher], count: int, timeout_s: float = 20) -> None:
    targets = [len(p.confirmed) + count for p in publishers]
    deadline = time.monotonic() + timeout_s
    while any(len(p.confirmed) < t for p, t in zip(publishers, targets, strict=True)):
        for p in publishers:
            assert p.error is None, f"{type(p).__name__}: {p.error!r}"
        assert time.monotonic() < deadline, "publishing stalled"
        time.sleep(0.02)


async def test_twenty_master_kills_lose_nothing(group: Group) -> None:
    group.add_controller("c1")
    group.add_controller("c2")
    group.add_broker("a")
    group.add_broker("b")
    await group.until(lambda r: r.master != "" and len(r.in_sync) == 2)
    gateway = group.add_gateway("gw1")
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    for queue in ("pika", "aio", "kombu"):
        connection.channel().queue_declare(queue, durable=True)
    connection.close()
    publishers = [
        Publisher(gateway.url, "pika"),
        AioPikaPublisher(gateway.url, "aio"),
        KombuPublisher(gateway.url, "kombu"),
    ]
    for p in publishers:
        p.start()
    _progress(publishers, 100)
    stalls = []
    for round_ in range(ROUNDS):
        record = await group.record()
        _stall_round(publishers)
        group.master(record).kill()
        await group.until(lambda r, e=record.epoch: r.epoch > e and r.master != "", 15)
        _progress(publishers, 100)
        stalls.append(_stall_round(publishers))
        group.brokers[record.master].start()
        await group.until(lambda r: r.in_sync == {"a", "b"}, 20)
        print(f"round {round_ + 1}: longest confirm stall {stalls[-1]:.2f} s", flush=True)
    for p in publishers:
        p.stop.set()
    for p in publishers:
        p.join(15)
        assert p.error is None, f"{type(p).__name__}: {p.error!r}"
    lost = {}
    duplicates = {}
    for p, prefix in zip(publishers, ("", "a", "k"), strict=True):
        try:
            seen = _drain_prefixed(gateway.url, p.queue, prefix, set(p.confirmed))
        except pika.exceptions.AMQPError:
            print(gateway.log()[-5000:])
            raise
        lost[p.queue] = len(set(p.confirmed) - set(seen))
        duplicates[p.queue] = sum(c - 1 for c in seen.values())
    print(f"confirm stall at master kill over {ROUNDS} rounds: "
          f"p50 {statistics.median(stalls):.2f} s, max {max(stalls):.2f} s; "
          f"duplicates {duplicates}")  # fmt: skip
    assert lost == {"pika": 0, "aio": 0, "kombu": 0}
    assert max(stalls) < 5


def _drain_prefixed(url: str, queue: str, prefix: str, expected: set[int]) -> dict[int, int]:
    if not prefix:
        return drain(url, queue, expected)
    seen: dict[int, int] = {}
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    deadline = time.monotonic() + 60
    while not expected <= set(seen) and time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        n = int(body.decode()[len(prefix) :])
        seen[n] = seen.get(n, 0) + 1
    connection.close()
    return seen
