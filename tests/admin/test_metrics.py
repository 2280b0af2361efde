"""/metrics and /metrics/per-object against what the AMQP side did: publishing 1,000 messages
with confirms and consuming them with acks moves the rabbitmq_global_* counters by 1,000
each; per-queue readiness, connections and channels show as gauges."""

from __future__ import annotations

import base64
import urllib.request

import pika
from prometheus_client.parser import text_string_to_metric_families

from bench.servers import check_for
from tests.harness.processes import GatewayProcess

COUNT = 1000


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(gateway: GatewayProcess, path: str = "/metrics") -> Samples:
    request = urllib.request.Request(f"http://127.0.0.1:{gateway.admin_port}{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_global_counters_follow_publishes_confirms_deliveries_and_acks(
    admin_gateway: GatewayProcess,
) -> None:
    amqp = "amqp091"
    names = ("received", "confirmed", "delivered", "acknowledged", "delivered_consume_manual_ack")
    before = scrape(admin_gateway)
    start = {n: value(before, f"rabbitmq_global_messages_{n}_total", protocol=amqp) for n in names}
    connection = pika.BlockingConnection(pika.URLParameters(admin_gateway.url))
    channel = connection.channel()
    channel.queue_declare("metrics.count")
    channel.confirm_delivery()
    for i in range(COUNT):
        channel.basic_publish("", "metrics.count", str(i).encode())  # each confirmed
    deliveries = channel.consume("metrics.count", inactivity_timeout=10)
    for got, (method, _properties, _body) in enumerate(deliveries, 1):
        assert method is not None, f"only {got - 1} of {COUNT} delivered"
        channel.basic_ack(method.delivery_tag)
        if got == COUNT:
            break
    channel.cancel()
    channel.queue_delete("metrics.count")
    connection.close()

    def moved() -> dict[str, float] | None:
        now = scrape(admin_gateway)
        delta = {
            n: value(now, f"rabbitmq_global_messages_{n}_total", protocol=amqp) - start[n]
            for n in names
        }
        return delta if delta["acknowledged"] >= COUNT else None

    delta = check_for(10, moved)
    assert delta == dict.fromkeys(names, COUNT)


def test_per_object_queue_series_and_connection_gauges(admin_gateway: GatewayProcess) -> None:
    before = scrape(admin_gateway)
    connections = [pika.BlockingConnection(pika.URLParameters(admin_gateway.url)) for _ in range(2)]
    try:
        channels = [connections[0].channel(), connections[0].channel(), connections[1].channel()]
        channels[0].queue_declare("metrics.ready")
        channels[0].queue_declare("metrics.other")
        for i in range(7):
            channels[0].basic_publish("", "metrics.ready", f"m{i}".encode())
        channels[1].basic_publish("", "metrics.other", b"x")
        # metrics.other: its one message delivered and held unacked by a consumer
        channels[2].basic_qos(prefetch_count=2)
        channels[2].basic_consume("metrics.other", lambda *_: None)

        def settled() -> Samples | None:
            now = scrape(admin_gateway, "/metrics/per-object")
            key = ("rabbitmq_queue_messages_unacked", (("queue", "metrics.other"), ("vhost", "/")))
            ready = ("rabbitmq_queue_messages_ready", (("queue", "metrics.ready"), ("vhost", "/")))
            return now if now.get(key) == 1 and now.get(ready) == 7 else None

        now = check_for(10, settled)
        assert value(now, "rabbitmq_queue_messages_ready", vhost="/", queue="metrics.other") == 0
        assert value(now, "rabbitmq_queue_consumers", vhost="/", queue="metrics.other") == 1
        assert value(now, "rabbitmq_queue_messages_published_total", vhost="/",
                     queue="metrics.ready") == 7  # fmt: skip
        assert value(now, "mqgw_queue_consumer_lag_messages", vhost="/", queue="metrics.ready") == 7
        aggregate = scrape(admin_gateway)
        assert value(aggregate, "rabbitmq_connections") - value(before, "rabbitmq_connections") == 2
        assert value(aggregate, "rabbitmq_channels") - value(before, "rabbitmq_channels") == 3
        assert value(aggregate, "rabbitmq_queue_messages_ready") >= 7
        assert not any(name == "rabbitmq_queue_messages_ready" and labels
                       for name, labels in aggregate)  # fmt: skip
        assert value(aggregate, "mqgw_store_append_seconds_count") > 0
        assert value(aggregate, "mqgw_scheduler_turn_seconds_count") > 0
        channels[0].queue_delete("metrics.ready")
        channels[0].queue_delete("metrics.other")
    finally:
        for connection in connections:
            connection.close()
    # The server sees the closes a moment after the client: poll, do not compare at once.
    check_for(
        10,
        lambda: (
            value(scrape(admin_gateway), "rabbitmq_connections")
            == value(before, "rabbitmq_connections")
        ),
    )


def test_metrics_need_the_monitoring_tag(admin_gateway: GatewayProcess) -> None:
    status, _ = admin_gateway.admin("GET", "/metrics", auth=None)
    assert status == 401
    admin_gateway.admin("PUT", "/api/users/metrics-mgmt", {"password": "pw", "tags": "management"})
    status, answer = admin_gateway.admin("GET", "/metrics", auth=("metrics-mgmt", "pw"))
    assert status == 403 and set(answer) == {"error", "reason"}
    admin_gateway.admin("PUT", "/api/users/metrics-mon", {"password": "pw", "tags": "monitoring"})
    assert admin_gateway.admin("GET", "/metrics/per-object", auth=("metrics-mon", "pw"))[0] == 200
