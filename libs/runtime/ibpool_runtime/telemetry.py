"""OpenTelemetry: tracer and meter providers, and trace context in message headers.

With `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans and metrics go to that collector over OTLP/HTTP.
Otherwise spans still carry trace ids across services (the context rides in message headers, and
log lines name their trace) but are not kept, and OpenTelemetry's metrics are not aggregated
(Prometheus serves them), unless `in_memory=True` (tests), which keeps both in memory
(`memory_exporter()`, `memory_metrics()`) — unbounded, so never in a long-running service.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_memory: InMemorySpanExporter | None = None
_memory_metrics: InMemoryMetricReader | None = None
_provider: TracerProvider | None = None
_meter_provider: MeterProvider | None = None


def setup_tracing(service: str, *, in_memory: bool = False) -> TracerProvider:
    """Install the process-wide tracer and meter providers once; later calls return the same one."""
    global _provider, _memory, _meter_provider, _memory_metrics
    if _provider is not None:
        return _provider
    resource = Resource.create({"service.name": service})
    provider = TracerProvider(resource=resource)
    reader: MetricReader | None = None
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    elif in_memory:
        _memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_memory))
        reader = _memory_metrics = InMemoryMetricReader()
    trace.set_tracer_provider(provider)
    # With nowhere to send them, OpenTelemetry's metrics stay the API's no-op ones: Prometheus
    # (/metrics) has the same figures, and aggregating them took about 4% of the scheduler's
    # interpreter time at 300 jobs/s (a py-spy profile; docs/benchmarks.md).
    if reader is not None:
        _meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        metrics.set_meter_provider(_meter_provider)
    _provider = provider
    return provider


def meter(name: str) -> metrics.Meter:
    return metrics.get_meter(name)


def memory_metrics() -> InMemoryMetricReader | None:
    return _memory_metrics


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
    if _meter_provider is not None:
        _meter_provider.shutdown()
