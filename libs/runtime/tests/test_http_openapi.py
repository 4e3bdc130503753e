"""GET /openapi.json on a real HTTP server: generated from the routes and their `@documented`
declarations, JSON Schemas from msgspec, error bodies and the bearer scheme where tokens are on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import jsonschema
import msgspec
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ibpool_runtime.config import BaseConfig
from ibpool_runtime.http import (
    STORABLE_TEXT,
    ApiAuth,
    ErrorBody,
    GpuIndex,
    SafeId,
    Unprocessable,
    create_app,
    documented,
    json_response,
    read_body,
)
from ibpool_runtime.metrics import ServiceMetrics


class ThingBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    size: int = 1


class Thing(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    size: int


async def ready() -> dict[str, bool]:
    return {"bus": True}


def routes(app: web.Application) -> None:
    r = web.RouteTableDef()

    @r.post("/v1/things")
    @documented("Make a thing", {201: Thing, 409: ErrorBody}, body=ThingBody)
    async def make(request: web.Request) -> web.Response:
        body = await read_body(request, ThingBody)
        return json_response(Thing(id="t1", name=body.name, size=body.size), status=201)

    @r.get("/v1/things/{id}")
    @documented("A thing", {200: Thing}, query={"verbose": bool})
    async def show(request: web.Request) -> web.Response:
        return json_response(Thing(id=request.match_info["id"], name="x", size=1))

    @r.get("/v1/undocumented")
    async def undocumented(_: web.Request) -> web.Response:
        return json_response({})

    app.router.add_routes(r)


async def document_of(auth: ApiAuth | None = None) -> dict[str, Any]:
    c = TestClient(TestServer(create_app(ServiceMetrics("demo"), ready, add_routes=routes, auth=auth, title="demo")))
    await c.start_server()
    try:
        r = await c.get("/openapi.json")
        assert r.status == 200
        return dict(await r.json())
    finally:
        await c.close()


async def test_the_document_describes_every_route() -> None:
    doc = await document_of()
    assert doc["openapi"] == "3.1.0" and doc["info"]["title"] == "demo"
    assert sorted(doc["paths"]) == [
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/readyz",
        "/v1/things",
        "/v1/things/{id}",
        "/v1/undocumented",
    ]
    make = doc["paths"]["/v1/things"]["post"]
    assert make["summary"] == "Make a thing"
    assert make["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ThingBody"}
    assert sorted(make["responses"]) == ["201", "400", "409", "413", "415", "422"]
    assert make["responses"]["409"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    assert "security" not in make
    show = doc["paths"]["/v1/things/{id}"]["get"]
    assert [(p["name"], p["in"], p["required"]) for p in show["parameters"]] == [
        ("id", "path", True),
        ("verbose", "query", False),
    ]
    assert sorted(show["responses"]) == ["200", "400", "404"]
    assert doc["paths"]["/v1/undocumented"]["get"]["x-undocumented"] is True
    assert doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"].keys() == {"text/plain"}
    schemas = doc["components"]["schemas"]
    assert schemas["ThingBody"]["properties"]["name"] == {"type": "string", "minLength": 1, "pattern": STORABLE_TEXT}
    assert schemas["ThingBody"]["required"] == ["name"]
    assert "securitySchemes" not in doc["components"]


async def test_the_schemas_hold_for_what_the_server_answers() -> None:
    doc = await document_of()
    resolver = {"components": doc["components"]}
    thing = {"$ref": "#/components/schemas/Thing", **resolver}
    jsonschema.validate({"id": "t1", "name": "x", "size": 1}, thing)
    error = {"$ref": "#/components/schemas/ErrorBody", **resolver}
    jsonschema.validate({"error": "not found", "detail": "no thing"}, error)  # the services' 404 bodies
    try:
        jsonschema.validate({"name": 3}, {"$ref": "#/components/schemas/ThingBody", **resolver})
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("a bad body fits the schema")


async def test_with_tokens_the_calls_that_need_one_say_so(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("operator op-secret\n")
    auth = ApiAuth.from_config(BaseConfig(api_tokens_file=str(tokens)))
    doc = await document_of(auth)
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    make = doc["paths"]["/v1/things"]["post"]
    assert make["security"] == [{"bearer": []}]
    assert {"401", "403"} <= set(make["responses"])
    show = doc["paths"]["/v1/things/{id}"]["get"]  # reads are open unless api_protect_reads
    assert "security" not in show and "401" not in show["responses"]
    assert "security" not in doc["paths"]["/openapi.json"]["get"]


async def test_nul_characters_in_the_url_are_refused_before_the_handler() -> None:
    c = TestClient(TestServer(create_app(ServiceMetrics("demo"), ready, add_routes=routes)))
    await c.start_server()
    try:
        r = await c.get("/v1/things/a%00b")
        assert r.status == 404
        r = await c.get("/v1/things/a", params={"verbose": "x\x00"})
        assert r.status == 400
        assert (await r.json())["path"] == "?verbose"
        r = await c.post("/v1/things", data=b'{"name": "a\\u0000"}', headers={"Content-Type": "application/json"})
        assert r.status == 400
        assert (await r.json())["path"] == "$.name"
    finally:
        await c.close()


@documented("A GPU", {200: dict[str, int]}, path={"index": GpuIndex}, query={"job": SafeId})
async def gpu(request: web.Request) -> web.Response:
    return json_response({"index": int(request.match_info["index"])})


async def test_typed_path_and_query_parameters_are_documented_and_checked_before_the_handler() -> None:
    def add(app: web.Application) -> None:
        app.router.add_get("/gpus/{index}", gpu)

    c = TestClient(TestServer(create_app(ServiceMetrics("demo"), ready, add_routes=add)))
    await c.start_server()
    try:
        doc = await (await c.get("/openapi.json")).json()
        op = doc["paths"]["/gpus/{index}"]["get"]
        index, job = op["parameters"]
        assert index["schema"] == {"type": "integer", "minimum": 0, "maximum": 1023}
        assert job["schema"]["pattern"] == "^[A-Za-z0-9_-]{1,128}$" and "400" in op["responses"]
        ok = await c.get("/gpus/3?job=j1")
        assert ok.status == 200 and await ok.json() == {"index": 3}
        for bad, where in (("/gpus/x", "{index}"), ("/gpus/4096", "{index}"), ("/gpus/1?job=a%20b", "?job")):
            r = await c.get(bad)
            assert r.status == 400 and (await r.json())["path"] == where, bad
    finally:
        await c.close()


async def test_every_string_a_document_describes_excludes_nul() -> None:
    doc = await document_of()
    body = doc["components"]["schemas"]["ThingBody"]["properties"]
    assert body["name"]["pattern"] == STORABLE_TEXT
    strings = [s for s in _walk(doc) if s.get("type") == "string" and "format" not in s and "enum" not in s]
    assert strings and all("pattern" in s for s in strings)


def _walk(node: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(node, dict):
        out.append(node)
        for v in node.values():
            out += _walk(v)
    elif isinstance(node, list):
        for v in node:
            out += _walk(v)
    return out


async def test_integral_floats_are_integers_and_contradictions_are_422() -> None:
    class Sized(msgspec.Struct, forbid_unknown_fields=True):
        low: int
        high: int

    @documented("Sized", {200: dict[str, int]}, body=Sized)
    async def sized(request: web.Request) -> web.Response:
        body = await read_body(request, Sized)
        if body.low > body.high:
            raise Unprocessable(f"low {body.low} is above high {body.high}", "$.low")
        return json_response({"low": body.low, "high": body.high})

    def add(app: web.Application) -> None:
        app.router.add_post("/sized", sized)

    c = TestClient(TestServer(create_app(ServiceMetrics("demo"), ready, add_routes=add)))
    await c.start_server()
    try:
        r = await c.post("/sized", json={"low": 2.0, "high": 3})  # JSON Schema's integer includes 2.0
        assert r.status == 200 and await r.json() == {"low": 2, "high": 3}
        r = await c.post("/sized", json={"low": 2.5, "high": 3})
        assert r.status == 400 and (await r.json())["path"] == "$.low"
        r = await c.post("/sized", json={"low": 4, "high": 3})
        assert r.status == 422 and (await r.json())["path"] == "$.low"
    finally:
        await c.close()
