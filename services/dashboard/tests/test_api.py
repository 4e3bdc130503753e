"""The dashboard's HTTP side without a bus or services: read-only by default, clear 4xx answers,
server-sent events to every listener."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from ibpool_dashboard import views
from ibpool_dashboard.api import Dashboard, routes
from ibpool_dashboard.feed import Feed
from ibpool_dashboard.sources import Sources
from ibpool_runtime.http import create_app
from ibpool_runtime.metrics import ServiceMetrics


class NothingOnTheBus(Sources):
    """Sources whose every ask of the bus finds no service."""

    async def discover(self, forget_after_s: float = 15.0) -> None:
        self.found, self.urls = [], {}


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[Any, Any], Dashboard]]:
    async with aiohttp.ClientSession() as http:
        sources = NothingOnTheBus(None, http, None)  # type: ignore[arg-type]
        d = Dashboard(None, sources, Feed(), history_points=10, can_act=False)  # type: ignore[arg-type]

        async def ready() -> dict[str, bool]:
            return {"bus": True}

        app = create_app(ServiceMetrics("dashboard"), ready, None, lambda a: a.add_routes(routes(d)))
        async with TestClient(TestServer(app)) as c:
            yield c, d
        d.stop.set()


async def test_without_a_tokens_file_the_dashboard_takes_no_actions(client: Any) -> None:
    c, _ = client
    for path in ("/api/actions/nodes/node-001/drain", "/api/actions/jobs/j1/cancel"):
        r = await c.post(path, json={"reason": "r"})
        assert r.status == 403 and (await r.json())["error"] == "read-only", path


async def test_malformed_requests_are_answered_with_what_is_wrong(client: Any) -> None:
    c, _ = client
    cases = [
        ("POST", "/api/actions/nodes/node-001/reboot", 400, "verb"),
        ("POST", "/api/actions/nodes/a%20b/drain", 400, "node"),
        ("GET", "/api/events?limit=nine", 400, "limit"),
        ("GET", "/api/jobs/a.b", 400, "job_id"),
        ("GET", "/api/nothing", 404, "/api/nothing"),
        ("PUT", "/api/overview", 405, "allowed"),
    ]
    for method, path, status, says in cases:
        r = await c.request(method, path, json={"reason": "r"})
        body = await r.json()
        assert r.status == status and says in body["detail"], (path, r.status, body)


async def test_a_page_names_the_services_that_did_not_answer(client: Any) -> None:
    c, _ = client
    r = await c.get("/api/queue")
    body = await r.json()
    assert r.status == 200 and body["model"]["jobs"] == []
    assert "no scheduler answered on the bus" in body["errors"]["jobs"]


async def test_every_listener_gets_each_overview_point_as_a_tick(client: Any) -> None:
    c, d = client
    streams = [await c.get("/events") for _ in range(2)]
    for s in streams:
        assert s.headers["Content-Type"] == "text/event-stream"
        assert await s.content.readuntil(b"\n\n") == b"retry: 2000\n\n"
    d.add_point(views.HistoryPoint(at=1.0, allocated_pct=50.0, queued=3, running=1))
    for s in streams:
        chunk = await asyncio.wait_for(s.content.readuntil(b"\n\n"), timeout=5)
        assert chunk == b"event: tick\ndata: [1.0,50.0,3,1]\n\n"
        s.close()


async def test_the_pages_and_their_modules_are_served(client: Any) -> None:
    c, _ = client
    index = await c.get("/")
    assert index.status == 200 and '<script type="module" src="/static/app.js">' in await index.text()
    for module in ("app.js", "pages.js", "dom.js", "style.css"):
        assert (await c.get(f"/static/{module}")).status == 200, module
    assert (await c.get("/static/../api.py")).status == 404
