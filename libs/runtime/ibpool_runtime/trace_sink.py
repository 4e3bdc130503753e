"""A minimal OpenTelemetry trace collector: OTLP/HTTP in, one JSON line per span out, in a file.

The deployment's stand-in for an OpenTelemetry Collector (no collector image can be pulled here):
services export to it with `OTEL_EXPORTER_OTLP_ENDPOINT=http://<sink>:4318`, it accepts
`POST /v1/traces` in protobuf or JSON, and appends each span with its service name, trace and
span ids (hex), parent, kind, times and attributes to the file. Bad bodies get 400 and nothing
is written. OTLP metrics (`/v1/metrics`) are accepted and dropped: Prometheus scrapes them.

    python -m ibpool_runtime.trace_sink --out /var/lib/ibpool/traces.jsonl [--host 0.0.0.0] [--port 4318]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

MAX_BODY_BYTES = 16 << 20


def spans_of(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """One flat record per span of an export request."""
    out = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.append(
                    {
                        "service": resource.get("service.name", ""),
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex() or None,
                        "name": span.name,
                        "kind": span.kind,
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                        "status": span.status.code,
                    }
                )
    return out


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {x.key: _value(x.value) for x in v.kvlist_value.values}
    return getattr(v, kind)


def make_app(out: Path) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    written = [0]  # spans written so far, for /healthz

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        export = ExportTraceServiceRequest()
        try:
            if request.content_type == "application/json":
                json_format.Parse(body, export)
            else:
                export.ParseFromString(body)
        except (DecodeError, json_format.ParseError) as e:
            return web.json_response({"error": "not an OTLP trace export", "detail": str(e)}, status=400)
        spans = spans_of(export)
        with out.open("a") as f:
            for s in spans:
                f.write(json.dumps(s, separators=(",", ":")) + "\n")
        written[0] += len(spans)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def metrics(_: web.Request) -> web.Response:
        # Services export OTel metrics beside their spans; Prometheus scrapes the same figures
        # from /metrics, so they are accepted and not kept.
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "alive", "spans": written[0]})

    app.router.add_post("/v1/traces", traces)
    app.router.add_post("/v1/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", healthz)
    return app


async def serve(out: Path, host: str, port: int) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    runner = web.AppRunner(make_app(out), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"trace sink on http://{host}:{port}/v1/traces -> {out}", file=sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ibpool_runtime.trace_sink", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4318)
    args = p.parse_args(argv)
    asyncio.run(serve(args.out, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
