"""The HTTP app factory over real HTTP (aiohttp's test server on loopback)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ibpool_proto.pool import ProposePlacement
from ibpool_runtime.http import BadBody, create_app, json_response, read_body
from ibpool_runtime.metrics import ServiceMetrics

JSON = {"Content-Type": "application/json"}


async def ready() -> dict[str, bool]:
    return {"bus": True, "store": False}


def app() -> web.Application:
    def routes(a: web.Application) -> None:
        async def propose(request: web.Request) -> web.Response:
            body = await read_body(request, ProposePlacement)
            return json_response({"job_id": body.job_id}, status=202)

        async def listing(request: web.Request) -> web.Response:
            wanted = request.query.get("status", "healthy")
            if wanted not in ("healthy", "failed"):
                raise BadBody(f"status must be one of healthy, failed, got {wanted!r}", "?status")
            return json_response([])

        a.router.add_post("/v1/proposals", propose)
        a.router.add_get("/v1/things", listing)

    return create_app(ServiceMetrics("demo"), ready, add_routes=routes)


async def client() -> TestClient:
    c = TestClient(TestServer(app()))
    await c.start_server()
    return c


async def test_bad_json_is_400_saying_malformed() -> None:
    c = await client()
    try:
        r = await c.post("/v1/proposals", data=b"{not json", headers=JSON)
        body = await r.json()
        assert r.status == 400 and body["error"] == "invalid request body" and "malformed JSON" in body["detail"]
    finally:
        await c.close()


async def test_invalid_body_is_400_with_the_field_path() -> None:
    c = await client()
    try:
        doc = {
            "type": ProposePlacement.ce_type(),
            "source": "s",
            "key": "j",
            "job_id": "j",
            "tenant": "t",
            "queue": "q",
            "ledger_version": 3,
            "assignments": [{"node_id": "n", "gpu_index": "zero"}],
        }
        r = await c.post("/v1/proposals", json=doc)
        body = await r.json()
        assert r.status == 400 and body["path"] == "$.assignments[0].gpu_index"
        assert "Expected `int`" in body["detail"]
        ok = dict(doc, assignments=[{"node_id": "n", "gpu_index": 0}])
        r = await c.post("/v1/proposals", json=ok)
        assert r.status == 202 and (await r.json()) == {"job_id": "j"}
    finally:
        await c.close()


async def test_a_query_parameter_a_handler_refuses_is_400_naming_the_parameter_not_the_body() -> None:
    c = await client()
    try:
        r = await c.get("/v1/things?status=sick")
        body = await r.json()
        assert r.status == 400 and body["error"] == "invalid query parameter" and body["path"] == "?status", body
        assert "'sick'" in body["detail"]
        assert (await c.get("/v1/things?status=failed")).status == 200
    finally:
        await c.close()


async def test_too_large_body_is_413_unknown_route_404_wrong_method_405() -> None:
    c = await client()
    try:
        r = await c.post("/v1/proposals", data=b"x" * (2 << 20), headers=JSON)
        assert r.status == 413 and (await r.json())["error"] == "request body too large"
        r = await c.get("/v1/nothing")
        assert r.status == 404 and "GET /v1/nothing" in (await r.json())["detail"]
        r = await c.get("/v1/proposals")
        assert r.status == 405 and r.headers["Allow"] == "POST"
    finally:
        await c.close()


async def test_a_body_not_declared_as_json_is_415_before_the_handler() -> None:
    # A browser's cross-origin "simple" POST can only send text/plain, form or multipart bodies.
    c = await client()
    try:
        doc = b'{"job_id": "j"}'
        for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}, {}):
            r = await c.post("/v1/proposals", data=doc, headers=headers)
            body = await r.json()
            assert r.status == 415 and body["error"] == "unsupported media type", (headers, body)
            assert "application/json" in body["detail"]
        r = await c.post("/v1/proposals", data=doc, headers={"Content-Type": "application/json; charset=utf-8"})
        assert r.status == 400 and (await r.json())["error"] == "invalid request body"  # JSON, but not a proposal
    finally:
        await c.close()


async def test_readyz_is_503_when_a_check_fails_and_metrics_are_prometheus_text() -> None:
    c = await client()
    try:
        r = await c.get("/readyz")
        assert r.status == 503 and (await r.json()) == {"ready": False, "checks": {"bus": True, "store": False}}
        r = await c.get("/metrics")
        assert r.status == 200 and "ibpool_service_info" in await r.text()
        r = await c.get("/healthz")
        assert r.status == 200
    finally:
        await c.close()
