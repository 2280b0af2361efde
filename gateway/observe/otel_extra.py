"""Whether the optional OpenTelemetry packages are there: a leaf, so that the settings can
refuse ``otel_endpoint`` without them before tracing (which reads the settings) is built."""

from __future__ import annotations

import importlib.util

MISSING_PACKAGES = (
    "OpenTelemetry is not installed (pip install 'mqgw[otel]': opentelemetry-sdk and "
    "opentelemetry-exporter-otlp-proto-http)"
)


def otel_installed() -> bool:
    """Whether the ``otel`` extra is importable (checked without importing it)."""
    try:
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
        )
    except (ImportError, ValueError):
        return False
