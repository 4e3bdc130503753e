"""One trace across services: A handles an event and causes one in B, through the outbox."""

from __future__ import annotations

import asyncio
import uuid

from opentelemetry import trace

from ibpool_proto.job import CancelJob, JobExited
from ibpool_runtime import telemetry
from ibpool_runtime.bus import Bus
from ibpool_runtime.consumer import Consumer, ConsumerSettings, HandlerContext, Subscription
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.outbox import OutboxRelay
from ibpool_runtime.store import Store
from tests.integration.helpers import eventually


async def test_event_handled_in_a_causes_event_in_b_under_one_trace(bus: Bus, store: Store) -> None:
    exporter = telemetry.memory_exporter()
    assert exporter is not None, "tests run with the in-memory span exporter"
    job = f"job-{uuid.uuid4().hex[:8]}"
    seen_in_b: list[str] = []

    async def service_a(event: CancelJob, ctx: HandlerContext) -> None:
        # A reacts to the cancel by reporting the job's exit: an event for B.
        await ctx.emit(
            JobExited(
                source="svc-a",
                key=event.job_id,
                job_id=event.job_id,
                allocation_id="a1",
                node_id="n1",
                exit_code=143,
                reason="signal",
            )
        )

    async def service_b(event: JobExited, ctx: HandlerContext) -> None:
        seen_in_b.append(event.id)

    stop = asyncio.Event()
    consumers = [
        Consumer(
            bus,
            store,
            Subscription(f"a-{job}", (CancelJob.subject(job),), service_a),
            ConsumerSettings(),
            ServiceMetrics("a"),
            "svc-a",
        ),
        Consumer(
            bus,
            store,
            Subscription(f"b-{job}", (JobExited.subject(job),), service_b),
            ConsumerSettings(),
            ServiceMetrics("b"),
            "svc-b",
        ),
    ]
    relay = OutboxRelay(store, bus)
    for c in consumers:
        await c.start()
    tasks = [asyncio.create_task(c.run(stop)) for c in consumers] + [asyncio.create_task(relay.run(stop))]

    # The submitter's own span: the root of the trace.
    with telemetry.tracer("test").start_as_current_span("submit") as root:
        await bus.publish(CancelJob(source="test", key=job, job_id=job))
    root_trace = root.get_span_context().trace_id

    async def b_handled() -> bool:
        return len(seen_in_b) == 1

    await eventually(b_handled, what="service B handled the event A caused")
    stop.set()
    await asyncio.gather(*tasks)

    spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == root_trace]
    names = {s.name: s for s in spans}
    a_span = names[f"handle {CancelJob.ce_type()}"]
    b_span = names[f"handle {JobExited.ce_type()}"]
    assert a_span.kind == trace.SpanKind.CONSUMER and b_span.kind == trace.SpanKind.CONSUMER
    assert a_span.parent is not None and a_span.parent.span_id == root.get_span_context().span_id
    assert b_span.parent is not None and b_span.parent.span_id == a_span.context.span_id

    # the handled events are also OTel metrics, for an OTLP collector
    reader = telemetry.memory_metrics()
    assert reader is not None
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"ibpool.events.handled", "ibpool.handler.duration"} <= names
