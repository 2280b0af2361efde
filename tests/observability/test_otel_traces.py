"""OpenTelemetry: a gateway started with --otel-endpoint exports spans over OTLP/HTTP to a
receiver this test runs on loopback. A pika publisher's traceparent reaches the consumer with
the same trace id, through a publish span (child of the client's) and a deliver span (child
of and linked to the publish span) that carries the ack/nack; sampling follows the ratio and
the client's choice; without tracing, delivered properties are byte-for-byte what was sent."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pamqp import commands

from bench.servers import GatewayServer, check_for
from gateway.amqp import frame_writer
from tests.diff.raw import Message, RawClient
from tests.observability.conftest import start_gateway
from tests.observability.otlp_receiver import OtlpReceiver, ReceivedSpan

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
PRODUCER, CONSUMER = 4, 5  # OTLP Span.SpanKind
EXPORT_FAST = {"OTEL_BSP_SCHEDULE_DELAY": "50"}  # the batch processor's delay (ms)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    made = OtlpReceiver()
    yield made
    made.close()


@pytest.fixture
def traced_gateway(tmp_path: Path, receiver: OtlpReceiver) -> Iterator[GatewayServer]:
    gateway = start_gateway(
        tmp_path / "data", "--otel-endpoint", receiver.endpoint, env=EXPORT_FAST
    )
    yield gateway
    gateway.stop()


def connect(gateway: GatewayServer) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(gateway.url))


def parts(traceparent: str) -> tuple[str, str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id, flags


def spans_named(receiver: OtlpReceiver, trace_id: str, *names: str) -> list[ReceivedSpan]:
    """Wait until the trace holds exactly spans with these names; one span per name given."""

    def complete() -> list[ReceivedSpan] | None:
        found = receiver.in_trace(trace_id)
        return found if sorted(s.name for s in found) == sorted(names) else None

    found = check_for(10, complete)
    return [next(s for s in found if s.name == name) for name in names]


def test_a_client_trace_continues_through_publish_and_deliver_to_the_consumer(
    traced_gateway: GatewayServer, receiver: OtlpReceiver
) -> None:
    connection = connect(traced_gateway)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("orders")
        headers = {
            "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
            "tracestate": "vendor=abc",
            "app": "kept",
        }
        channel.basic_publish("", "orders", b"order 1", pika.BasicProperties(headers=headers))
        method, properties, body = next(channel.consume("orders", inactivity_timeout=10))
        assert method is not None and body == b"order 1"
        channel.basic_ack(method.delivery_tag)
        channel.cancel()
    finally:
        connection.close()
    received = properties.headers
    trace_id, consumer_parent, flags = parts(received["traceparent"])
    assert (trace_id, flags) == (CLIENT_TRACE, "01")
    assert received["tracestate"] == "vendor=abc"
    assert received["app"] == "kept"

    publish, deliver = spans_named(receiver, CLIENT_TRACE, "publish amq.default", "deliver orders")
    assert publish.parent_span_id == CLIENT_SPAN and publish.kind == PRODUCER
    assert publish.attributes["messaging.system"] == "rabbitmq"
    assert publish.attributes["messaging.operation"] == "publish"
    assert publish.attributes["messaging.destination.name"] == ""
    assert publish.attributes["messaging.rabbitmq.destination.routing_key"] == "orders"
    assert [name for name, _ in publish.events] == ["ack"]  # ended at the publisher confirm
    assert deliver.parent_span_id == publish.span_id and deliver.kind == CONSUMER
    assert deliver.links == [(CLIENT_TRACE, publish.span_id)]
    assert deliver.span_id == consumer_parent  # the consumer continues from the deliver span
    assert deliver.attributes["messaging.operation"] == "deliver"
    assert deliver.attributes["messaging.destination.name"] == "orders"
    assert [name for name, _ in deliver.events] == ["ack"]
    assert publish.service == "mqgw"


def test_basic_get_and_a_nack_make_their_own_deliver_spans(
    traced_gateway: GatewayServer, receiver: OtlpReceiver
) -> None:
    connection = connect(traced_gateway)
    try:
        channel = connection.channel()
        channel.queue_declare("jobs")
        channel.basic_publish("", "jobs", b"job")  # no traceparent: the gateway starts a trace
        first, properties, _ = channel.basic_get("jobs")
        assert first is not None
        channel.basic_nack(first.delivery_tag, requeue=True)
        again, properties_again, _ = channel.basic_get("jobs")
        assert again is not None and again.redelivered
        channel.basic_ack(again.delivery_tag)
    finally:
        connection.close()
    trace_id, first_span, _ = parts(properties.headers["traceparent"])
    assert parts(properties_again.headers["traceparent"])[0] == trace_id
    publish, _, _ = spans_named(
        receiver, trace_id, "publish amq.default", "deliver jobs", "deliver jobs"
    )
    assert publish.parent_span_id == "" and [n for n, _ in publish.events] == []
    delivers = {s.span_id: s for s in receiver.in_trace(trace_id) if s.name == "deliver jobs"}
    nacked = delivers.pop(first_span)
    assert nacked.events == [("nack", {"messaging.rabbitmq.requeue": True})]
    (acked,) = delivers.values()
    assert [n for n, _ in acked.events] == ["ack"]
    assert acked.attributes["messaging.rabbitmq.redelivered"] is True
    assert all(span.parent_span_id == publish.span_id for span in (nacked, acked))


def test_sampling_ratio_zero_keeps_only_what_clients_sampled(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    gateway = start_gateway(
        tmp_path / "data",
        *("--otel-endpoint", receiver.endpoint, "--otel-sampling-ratio", "0"),
        env=EXPORT_FAST,
    )
    unsampled = f"00-{'1' * 32}-{'2' * 16}-00"
    try:
        connection = connect(gateway)
        channel = connection.channel()
        channel.queue_declare("q")
        bodies = {b"new trace": None, b"not sampled": unsampled}
        bodies[b"sampled"] = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
        got = {}
        for body, traceparent in bodies.items():
            headers = {} if traceparent is None else {"traceparent": traceparent}
            channel.basic_publish("", "q", body, pika.BasicProperties(headers=headers))
            _, properties, _ = channel.basic_get("q", auto_ack=True)
            got[body] = (properties.headers or {}).get("traceparent")
        connection.close()
        spans_named(receiver, CLIENT_TRACE, "publish amq.default", "deliver q")
        # Exported in order: spans of the earlier messages would have arrived by now.
        assert {span.trace_id for span in receiver.spans} == {CLIENT_TRACE}
        assert got[b"new trace"] is None  # not sampled: the message goes on as it came
        assert got[b"not sampled"] == unsampled
        assert parts(got[b"sampled"])[0] == CLIENT_TRACE
    finally:
        gateway.stop()


def _raw_roundtrip(port: int, raw_properties: bytes) -> Message:
    with RawClient(port) as client:
        client.open_channel(1)
        client.rpc(1, commands.Queue.Declare(queue="raw"))
        client.publish(1, "", "raw", b"payload", raw_properties=raw_properties)
        item = client.rpc(1, commands.Basic.Get(queue="raw", no_ack=True))
        assert isinstance(item, Message), item
        return item


def test_tracing_off_delivers_the_properties_as_sent(gateway: GatewayServer) -> None:
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "n": 1}
    sent = commands.Basic.Properties(headers=headers, message_id="m", delivery_mode=2)
    raw = frame_writer.encode_properties(sent)
    got = _raw_roundtrip(gateway.amqp_port, raw)
    assert got.raw_properties == raw
    assert "OpenTelemetry" not in gateway.log()


# FastAPI needs opentelemetry-api; the SDK and the exporter are the optional part.
BLOCK_OTEL_EXTRA = (
    "import sys\n"
    "sys.modules['opentelemetry.sdk'] = None\n"
    "sys.modules['opentelemetry.exporter'] = None\n"
)


def test_the_gateway_runs_without_the_otel_packages(tmp_path: Path) -> None:
    """With the ``otel`` extra unimportable: serving works with tracing off, and asking for
    tracing is a configuration error naming the extra to install."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_OTEL_EXTRA)
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    asked = subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", "serve", "--amqp-port", "0",
         "--admin-port", "0", "--data-dir", str(tmp_path / "a"),
         "--otel-endpoint", "http://127.0.0.1:4318"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert asked.returncode == 2, asked.stderr
    assert "configuration error" in asked.stderr and "mqgw[otel]" in asked.stderr
    gateway = GatewayServer(tmp_path / "b", ["--admin-port", "0"], env=env).start()
    try:
        connection = connect(gateway)
        channel = connection.channel()
        channel.queue_declare("plain")
        channel.basic_publish("", "plain", b"works")
        assert channel.basic_get("plain", auto_ack=True)[2] == b"works"
        connection.close()
    finally:
        gateway.stop()
