"""In a cluster the firehose switch reaches every gateway through the metadata change feed:
turned on at one gateway's admin API, the other copies its publishes too; turned off, it
stops there as well."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from bench.servers import BrokerServer, GatewayServer, check_for, free_port
from tests.cluster.conftest import Cluster
from tests.harness.redis_server import RedisServer
from tests.observability.firehose_reader import FirehoseReader, normalise


@pytest.fixture
def two_gateways(tmp_path: Path) -> Iterator[Cluster]:
    redis = RedisServer(tmp_path / "redis").start()
    broker = BrokerServer(
        tmp_path / "broker", free_port(), tmp_path / "broker.log", "g1", "0", meta=redis.url
    )
    cluster = Cluster(tmp_path, redis, broker)
    try:
        broker.start()
        cluster.add_gateway("gw-a")
        cluster.add_gateway("gw-b")
        yield cluster
    finally:
        for gateway in cluster.gateways:
            gateway.kill()
        broker.kill()
        redis.stop()


def publish(gateway: GatewayServer, body: bytes) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    try:
        channel = connection.channel()
        channel.queue_declare("work")
        channel.basic_publish("", "work", body)
    finally:
        connection.close()


def node_of(reader: FirehoseReader, index: int) -> str:
    """The ``node`` header of the index-th trace message read (normalise blanks it)."""
    headers = reader.seen[index].properties.headers or {}
    return str(headers["node"])


def test_the_switch_follows_the_change_feed(two_gateways: Cluster) -> None:
    gw_a, gw_b = two_gateways.gateways
    # The trace queue and its binding first: the feed brings them to gw-b before the switch.
    # It is read where the copies are made (a basic.get on another gateway does not see a
    # queue's new messages once it has read it to the end: gateway/cluster/link.py polls
    # only queues with consumers).
    reader = FirehoseReader(gw_b.amqp_port)
    try:
        assert gw_a.admin("PUT", "/api/vhosts/%2F", {"tracing": True})[0] == 204
        check_for(10, lambda: "Enabling tracing for vhost '/'" in gw_b.log())
        publish(gw_b, b"from b")
        traces = [normalise(m) for m in reader.wait_for(1)]
        assert traces[0]["routing_key"] == "publish." and traces[0]["body"] == b"from b"
        assert node_of(reader, 0) == "gw-b"
        assert gw_a.admin("PUT", "/api/vhosts/%2F", {"tracing": False})[0] == 204
        check_for(10, lambda: "Disabling tracing for vhost '/'" in gw_b.log())
        publish(gw_b, b"untraced")
        assert gw_a.admin("PUT", "/api/vhosts/%2F", {"tracing": True})[0] == 204
        check_for(10, lambda: gw_b.log().count("Enabling tracing for vhost '/'") == 2)
        publish(gw_b, b"again")
        assert [m.body for m in reader.wait_for(2)] == [b"from b", b"again"]
        assert gw_b.admin("GET", "/api/vhosts/%2F")[1]["tracing"] is True
    finally:
        reader.close()
