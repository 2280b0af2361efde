"""A cluster whose Redis is a Sentinel deployment (``--meta redis+sentinel://…``): the Redis
master killed under load. AMQP traffic on existing queues goes on through the failover (it
needs no Redis per message), the gateway and the broker find the promoted replica by
themselves, declarations work again once it serves, and no confirmed message is lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from bench.servers import BrokerServer, GatewayServer, check_for, free_port
from tests.cluster.test_outages import Publisher, drain
from tests.harness.sentinel import Sentinels, sentinels


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[Sentinels, GatewayServer]]:
    with sentinels(tmp_path / "redis") as redis_set:
        broker = BrokerServer(tmp_path / "broker", free_port(), tmp_path / "broker.log", "g1",
                              "0", meta=redis_set.url)  # fmt: skip
        gateway = GatewayServer(
            tmp_path / "gw1",
            ["--meta", redis_set.url, "--node-name", "gw1", "--admin-port", str(free_port())],
        )
        try:
            broker.start()
            gateway.start()
            yield redis_set, gateway
        finally:
            gateway.kill()
            print(f"--- gateway log tail ---\n{gateway.log()[-6000:]}")
            broker.kill()


def _declares(gateway: GatewayServer, name: str) -> bool:
    try:
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
            conn.channel().queue_declare(name, durable=True)
        return True
    except pika.exceptions.AMQPError:
        return False


def test_the_redis_master_killed_under_load(deployment: tuple[Sentinels, GatewayServer]) -> None:
    redis_set, gateway = deployment
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        conn.channel().queue_declare("steady", durable=True)
    publisher = Publisher(gateway, "steady")
    publisher.start()
    check_for(10, lambda: len(publisher.confirmed) >= 200)
    redis_set.master.stop()  # SIGKILL
    killed = time.monotonic()
    before = len(publisher.confirmed)
    # Existing topology: publishing goes on while the sentinels elect the replica.
    check_for(10, lambda: len(publisher.confirmed) >= before + 200)
    check_for(15, lambda: redis_set.master_port() == redis_set.replica.port)
    check_for(20, lambda: _declares(gateway, "after-failover"))
    declared_after_s = time.monotonic() - killed
    check_for(10, lambda: len(publisher.confirmed) >= before + 400)
    publisher.stop.set()
    publisher.join(10)
    got = drain(gateway, "steady", set(publisher.confirmed), 30)
    assert set(publisher.confirmed) <= got
    assert publisher.failed == 0  # no publish was refused across the failover
    print(f"declarations served again {declared_after_s:.2f} s after the master's death")
