"""OpenTelemetry SDK providers whose spans stay in memory: one of a test's own, and one for the
test process set as the global provider (OpenTelemetry allows that once per process), so
enqueue() inside a test's span traces its rows."""

from __future__ import annotations

import functools

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from postroom.tracing import Tracing


def memory_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider of the caller's own, each span exported to memory as it ends."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@functools.cache
def memory_tracing() -> tuple[Tracing, TracerProvider, InMemorySpanExporter]:
    """The roles' Tracing, the provider (global) and its exporter; clear the exporter per test."""
    provider, exporter = memory_provider()
    trace.set_tracer_provider(provider)
    return Tracing.from_provider(provider), provider, exporter
