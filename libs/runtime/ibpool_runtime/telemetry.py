"""OpenTelemetry: tracer and meter providers, and trace context in message headers.

With `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans go to that collector over OTLP/HTTP; otherwise
they are kept in memory (`memory_exporter()`), where tests read them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_memory: InMemorySpanExporter | None = None
_provider: TracerProvider | None = None


def setup_tracing(service: str) -> TracerProvider:
    """Install the process-wide tracer provider once; later calls return the same one."""
    global _provider, _memory
    if _provider is not None:
        return _provider
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        _memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_memory))
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def memory_exporter() -> InMemorySpanExporter | None:
    return _memory


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write `traceparent`/`tracestate` of the current (or given) context into headers."""
    propagate.inject(headers, context=context)


def extract(headers: Mapping[str, str] | None) -> Context:
    return propagate.extract(dict(headers or {}))


def shutdown_tracing() -> None:
    if _provider is not None:
        _provider.force_flush()
