"""Depth breakers on a cluster of two gateways over one broker, with pika: the depth that
trips them is the broker's (every gateway's publishes), each gateway trips within a moment
of the other, and a breaker holds only the publishers of its own queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pika.adapters.blocking_connection import BlockingChannel

from bench.servers import GatewayServer
from tests.cluster.conftest import Cluster, running_cluster
from tests.compat.test_depth_breaker import breaker_of, confirm_channel, publish, set_breaker_policy
from tests.harness.processes import check_for

OF = 100  # trips above 70, resets below 50


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root: Path = tmp_path_factory.mktemp("breakers")
    with running_cluster(root, ["gwA", "gwB"]) as made:
        yield made


def _depth(channel: BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def test_a_reject_breaker_counts_every_gateways_publishes(two: Cluster) -> None:
    gw_a, gw_b = two.gateways
    set_breaker_policy(gw_a, "deep", "reject")
    conn_a, ch_a = confirm_channel(gw_a)
    conn_b, ch_b = confirm_channel(gw_b)
    ch_a.queue_declare("deep", durable=True)
    check_for(5, lambda: breaker_of(gw_b, "deep")["high"] == 70)  # the policy reached gwB
    assert all(publish(ch_a, "deep", b"a%d" % i) for i in range(50))
    on_b = [publish(ch_b, "deep", b"b%d" % i) for i in range(50)]
    accepted = sum(on_b)
    # gwB judges by the broker's count: gwA's 50 and its own 20 reach high; at most what it
    # routed within one sample's age more (its own are counted at once).
    assert 20 <= accepted <= 22 and on_b[:20] == [True] * 20 and not any(on_b[accepted:])
    check_for(2, lambda: breaker_of(gw_a, "deep")["state"] == "tripped")  # gwA follows
    assert not publish(ch_a, "deep", b"refused on A")
    depth = _depth(ch_a, "deep")
    assert depth == 50 + accepted

    for _ in range(depth - 49):  # below low, consumed through gwA
        _, _, body = ch_a.basic_get("deep", auto_ack=True)
        assert body is not None
    for gateway in (gw_a, gw_b):
        check_for(5, lambda g=gateway: breaker_of(g, "deep")["state"] == "closed")  # type: ignore[misc]
    assert publish(ch_b, "deep", b"after on B") and publish(ch_a, "deep", b"after on A")
    assert breaker_of(gw_b, "deep")["trips"] == 1
    check_for(5, lambda: "depth breaker tripped" in gw_b.log())
    check_for(5, lambda: "depth breaker reset" in gw_a.log())
    conn_a.close()
    conn_b.close()


def test_a_block_breaker_holds_its_publishers_on_either_gateway_only(two: Cluster) -> None:
    gw_a, gw_b = two.gateways
    set_breaker_policy(gw_a, "held", "block")
    conn_a, ch_a = confirm_channel(gw_a)
    ch_a.queue_declare("held", durable=True)
    ch_a.queue_declare("busy", durable=True)
    check_for(5, lambda: breaker_of(gw_b, "held")["high"] == 70)
    confirmed: list[int] = []
    nacked: list[int] = []

    def publish_on_b() -> None:
        conn, channel = confirm_channel(gw_b)
        for i in range(150):
            (confirmed if publish(channel, "held", b"%d" % i) else nacked).append(i)
        conn.close()

    publisher = threading.Thread(target=publish_on_b, daemon=True)
    publisher.start()
    check_for(10, lambda: breaker_of(gw_b, "held")["state"] == "tripped")
    check_for(5, lambda: _flow(gw_b))
    stuck_at = len(confirmed)
    assert 71 <= stuck_at < 150 and not nacked

    started = time.monotonic()  # another queue's publisher, on the other gateway
    assert all(publish(ch_a, "busy", b"x") for _ in range(1000))
    busy_s = time.monotonic() - started
    assert len(confirmed) == stuck_at, "the held publisher went on while tripped"
    assert busy_s < 15, f"1,000 publishes to another queue took {busy_s:.1f} s"

    taken: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(taken) < 150 and time.monotonic() < deadline:
        _, _, body = ch_a.basic_get("held", auto_ack=True)
        if body is None:
            time.sleep(0.02)
            continue
        taken.append(body)
    publisher.join(10)
    assert not nacked and len(confirmed) == 150
    assert sorted(taken, key=int) == [b"%d" % i for i in range(150)]  # none lost or twice
    conn_a.close()


def _flow(gateway: GatewayServer) -> bool:
    status, connections = gateway.admin("GET", "/api/connections")
    assert status == 200
    mine = [c for c in connections if c.get("node", gateway.data_dir.name) == gateway.data_dir.name]
    return any(c["state"] == "flow" for c in mine)
