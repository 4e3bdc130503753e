"""The trace sink over real HTTP: the OpenTelemetry SDK's own OTLP exporter sends, the file holds the spans."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from ibpool_runtime.trace_sink import make_app


def export_two_spans(endpoint: str) -> tuple[str, str]:
    provider = TracerProvider(resource=Resource.create({"service.name": "pool_allocator"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=5)))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("handle ProposePlacement") as parent:
        with tracer.start_as_current_span("commit", attributes={"ledger.version": 7}) as child:
            pass
    provider.shutdown()
    return f"{parent.get_span_context().span_id:016x}", f"{child.get_span_context().span_id:016x}"


async def test_spans_exported_by_the_sdk_land_in_the_file_with_their_parents(tmp_path: Path) -> None:
    out = tmp_path / "traces.jsonl"
    client = TestClient(TestServer(make_app(out)))
    await client.start_server()
    try:
        endpoint = str(client.make_url("/v1/traces"))
        parent_id, child_id = await asyncio.to_thread(export_two_spans, endpoint)
        spans = {s["span_id"]: s for s in map(json.loads, out.read_text().splitlines())}
        assert set(spans) == {parent_id, child_id}
        assert spans[child_id]["parent_span_id"] == parent_id and spans[parent_id]["parent_span_id"] is None
        assert spans[child_id]["trace_id"] == spans[parent_id]["trace_id"]
        assert spans[child_id]["service"] == "pool_allocator" and spans[child_id]["attributes"] == {"ledger.version": 7}
        assert (await (await client.get("/healthz")).json())["spans"] == 2
    finally:
        await client.close()


async def test_a_body_that_is_not_an_export_is_400_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "traces.jsonl"
    client = TestClient(TestServer(make_app(out)))
    await client.start_server()
    try:
        r = await client.post("/v1/traces", data=b"\xff\x00garbage", headers={"Content-Type": "application/x-protobuf"})
        assert r.status == 400 and (await r.json())["error"] == "not an OTLP trace export"
        r = await client.post("/v1/traces", data=b"{nope", headers={"Content-Type": "application/json"})
        assert r.status == 400
        assert not out.exists()
    finally:
        await client.close()
