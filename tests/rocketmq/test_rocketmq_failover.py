"""A RocketMQ master killed (kill -9) under a pika confirm load, in RocketMQ's controller
mode (a master and a slave, sync replication): the gateway follows the name servers to the
new master, the publisher stays connected, and every confirmed message is delivered."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pytest

from bench.servers import GatewayServer
from tests.harness.rocketmq import local_rocketmq
from tests.harness.waiting import check_for
from tests.replication.load import Publisher, drain

pytestmark = pytest.mark.slow


def test_a_killed_master_loses_no_confirmed_message(tmp_path: Path) -> None:
    with local_rocketmq(tmp_path / "rmq", replicas=2) as rocketmq:
        store = f"rocketmq://{rocketmq.namesrv}/failover"
        gateway = GatewayServer(tmp_path / "gw", ["--store", store]).start()
        try:
            connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
            channel = connection.channel()
            channel.queue_declare("orders", durable=True)
            connection.close()
            publisher = Publisher(gateway.url, "orders")
            publisher.start()
            check_for(30, lambda: len(publisher.confirmed) >= 300, what="300 confirms")
            old = rocketmq.kill_master()
            killed_at, before = time.monotonic(), len(publisher.confirmed)
            new = rocketmq.wait_for_master(60, not_name=old.name)
            elected_s = time.monotonic() - killed_at
            check_for(60, lambda: len(publisher.confirmed) >= before + 300 or publisher.error,
                      what="300 confirms after the kill")  # fmt: skip
            publisher.stop.set()
            publisher.join(30)
            assert publisher.error is None, f"the publisher failed: {publisher.error!r}"
            stall = publisher.longest_stall_s
            print(f"master {old.name} killed; {new.name} master after {elected_s:.2f} s; "
                  f"longest wait for a confirm {stall:.2f} s")  # fmt: skip
            confirmed = set(publisher.confirmed)
            seen = drain(gateway.url, "orders", confirmed)
            lost = confirmed - set(seen)
            assert not lost, f"{len(lost)} confirmed messages lost: {sorted(lost)[:20]}"
        finally:
            gateway.kill()
            print(f"--- gateway log tail ---\n{gateway.log()[-6000:]}")
