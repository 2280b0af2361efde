"""OpenTelemetry traces of messages (``--otel-endpoint``), following the messaging semantic
conventions (messaging.system = rabbitmq).

A ``publish`` span per message covers routing and the append and ends when the publisher's
confirm is sent (at once after the append without confirms). Its parent is the W3C
``traceparent``/``tracestate`` the client put in the message headers, if any, and its own
context replaces them in the stored message. Each delivery (consumer or basic.get) gets a
``deliver`` span, a child of and linked to that publish context, whose context is what the
consumer receives in ``traceparent``; the ack, nack or reject is an event on it, then it
ends. So a trace goes client -> gateway publish -> store -> gateway deliver -> consumer.
Sampling: ParentBased(TraceIdRatioBased(otel_sampling_ratio)); a span not sampled leaves the
headers as they came.

The opentelemetry packages (the ``otel`` extra) are imported only when tracing is on: the
gateway runs without them, and with tracing and the firehose off no session has a tap
(gateway/sessions/taps.py), so the per-message path pays one ``is None`` test per hook.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gateway.amqp import property_bytes as pb
from gateway.observe.otel_extra import MISSING_PACKAGES

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span

    from gateway.config.settings import GatewaySettings

log = logging.getLogger("mqgw.trace")

TRACE_HEADERS = ("traceparent", "tracestate")
SYSTEM = {"messaging.system": "rabbitmq"}


class TracingUnavailable(RuntimeError):
    """--otel-endpoint was given but the opentelemetry packages are not installed."""


class Tracing:
    """The node's tracer and W3C propagator (one per node, shared by every session)."""

    def __init__(self, provider: TracerProvider) -> None:
        # The optional dependency, imported once tracing is on.
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator,
        )

        self.provider = provider
        self.tracer = provider.get_tracer("mqgw")
        self.propagator = TraceContextTextMapPropagator()
        self._trace = trace

    # -- spans --------------------------------------------------------------------------

    def start_publish(
        self,
        exchange: str,
        routing_key: str,
        properties: bytes | memoryview,
        body_size: int,
        start_ns: int,
    ) -> Span:
        """A publish span, the child of the client's context if its headers carry one."""
        carrier = trace_headers(properties)
        parent = self.propagator.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"publish {exchange or 'amq.default'}",
            context=parent,
            kind=self._trace.SpanKind.PRODUCER,
            start_time=start_ns,
        )
        if span.is_recording():  # attributes only for the spans that are kept
            span.set_attributes(
                {
                    **SYSTEM,
                    "messaging.operation": "publish",
                    "messaging.operation.name": "publish",
                    "messaging.destination.name": exchange,
                    "messaging.rabbitmq.destination.routing_key": routing_key,
                    "messaging.message.body.size": body_size,
                }
            )
        return span

    def start_deliver(
        self,
        queue: str,
        exchange: str,
        routing_key: str,
        properties: bytes | memoryview,
        body_size: int,
        redelivered: bool,
        delivery_tag: int,
    ) -> Span:
        """A deliver span: the child of, and linked to, the stored publish context."""
        carrier = trace_headers(properties)
        parent = self.propagator.extract(carrier) if carrier else None
        links = []
        if parent is not None:
            publish_context = self._trace.get_current_span(parent).get_span_context()
            if publish_context.is_valid:
                links.append(self._trace.Link(publish_context))
        span = self.tracer.start_span(
            f"deliver {queue}", context=parent, kind=self._trace.SpanKind.CONSUMER, links=links
        )
        if span.is_recording():
            span.set_attributes(
                {
                    **SYSTEM,
                    "messaging.operation": "deliver",
                    "messaging.operation.name": "deliver",
                    "messaging.destination.name": queue,
                    "messaging.rabbitmq.exchange": exchange,
                    "messaging.rabbitmq.destination.routing_key": routing_key,
                    "messaging.rabbitmq.redelivered": redelivered,
                    "messaging.rabbitmq.message.delivery_tag": delivery_tag,
                    "messaging.message.body.size": body_size,
                }
            )
        return span

    def inject(self, span: Span, properties: bytes | memoryview) -> bytes | None:
        """The properties with ``span``'s context as traceparent/tracestate; None when the
        span is not sampled (the message then goes on as it came)."""
        if not span.is_recording():
            return None
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        edited: bytes | memoryview = properties
        try:
            for name in TRACE_HEADERS:
                value = carrier.get(name)
                edited = pb.set_header(
                    edited, name, "S", None if value is None else pb.longstr(value)
                )
        except (pb.PropertyError, IndexError):
            return None  # properties the broker cannot edit go out as they came
        return bytes(edited)

    def shutdown(self) -> None:
        self.provider.shutdown()


def trace_headers(properties: bytes | memoryview) -> Mapping[str, str]:
    """traceparent and tracestate (long strings) from the headers of raw properties."""
    try:
        table = pb.split_properties(properties).get(pb.HEADERS)
        if table is None:
            return {}
        return {
            key: pb.decode_scalar("S", raw)
            for key, tag, raw in pb.split_table(table)
            if key in TRACE_HEADERS and tag == "S"
        }
    except (pb.PropertyError, IndexError, ValueError):
        return {}


def traces_url(endpoint: str) -> str:
    """An OTLP/HTTP endpoint as given (``http://collector:4318``) -> its traces URL."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def tracing_from_settings(settings: GatewaySettings) -> Tracing | None:
    """The node's tracing: None (off) unless ``otel_endpoint`` is set."""
    if settings.otel_endpoint is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError as error:
        raise TracingUnavailable(f"otel_endpoint is set: {MISSING_PACKAGES} ({error})") from None
    url = traces_url(settings.otel_endpoint)
    processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=url))
    tracing = new_tracing(processor, settings.otel_sampling_ratio, settings.node_name)
    log.info("OpenTelemetry traces to %s (sampling ratio %g)", url, settings.otel_sampling_ratio)
    return tracing


def new_tracing(processor: SpanProcessor, sampling_ratio: float, node_name: str) -> Tracing:
    """Tracing through ``processor`` (tests pass an in-memory exporter's)."""
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.sampling import (  # noqa: PLC0415
        ParentBased,
        TraceIdRatioBased,
    )

    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(sampling_ratio)),
        resource=Resource.create({"service.name": "mqgw", "service.instance.id": node_name}),
    )
    provider.add_span_processor(processor)
    return Tracing(provider)
