"""The dashboard in a real headless browser (Debian's chromium, over the DevTools protocol) against
the real system (`ibpool run --serve`, secured: the dashboard reads the bus as the subscriber user).

Each page loads with no uncaught exception, console error or failed request, shows what the
running system holds, and changes without a reload when the bus says something happened: a job
submitted appears in the queue, a node drained through the dashboard (with the operator's token)
shows as drained, its DrainRequested arrives in the event stream. Chromium missing: skipped, or
failed with IBPOOL_REQUIRE_CHROMIUM=1 (CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request

import aiohttp
import pytest

from ibpool_dashboard.browser import Chromium, find_chromium
from ibpool_dashboard.screenshots import PAGES, Served, served

NODES = [f"node-{i:03d}" for i in range(1, 6)]  # 4 and the spare
# A tenth of a GPU, ahead of the run's own work: it runs wherever any GPU has that much free (the
# run's own allocations fill the cluster differently each time).
JOB = {"id": "dash-job", "tenant": "ops", "priority": 100, "fraction": 0.1, "workload": {"simulated_runtime_s": 600}}


def require_chromium() -> None:
    if find_chromium() is None:
        why = "chromium is not installed (Debian: apt-get install chromium)"
        if os.environ.get("IBPOOL_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"{why}, and IBPOOL_REQUIRE_CHROMIUM=1")
        pytest.skip(why)


def get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def post(url: str, body: object, token: str | None) -> tuple[int, dict[str, object]]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_every_page_shows_the_running_system_and_follows_the_bus_live() -> None:
    require_chromium()
    with served(nodes=4) as run:
        await check_pages(run)


async def check_pages(run: Served) -> None:
    base = run.urls["dashboard"] + "/"
    async with Chromium() as browser:
        await browser.open(base)
        await browser.wait_for("document.body.dataset.sse === 'open'", "the server-sent events stream open")
        for name, (route, ready) in PAGES.items():
            if name == "job":
                continue  # below, with a job of the test's own
            await browser.open(base + route)
            await browser.wait_for(ready, f"the {name} page drawn")
        await browser.open(base + "#/nodes")
        shown = await browser.wait_for(
            f"[...document.querySelectorAll('[data-view=nodes] tr[data-node]')].map(r => r.dataset.node).length"
            f" === {len(NODES)} && [...document.querySelectorAll('tr[data-node]')].map(r => r.dataset.node)",
            "every node of the run on the nodes page",
        )
        assert shown == NODES
        await browser.open(base + "#/overview")
        await browser.wait_for("document.querySelector('[data-gpus=\"40\"]')", "the overview counting 40 GPUs")

        # Live: a job submitted now appears in the queue page, with no reload.
        await browser.open(base + "#/queue")
        await browser.wait_for(PAGES["queue"][1], "the queue page drawn")
        await browser.evaluate("window.notReloaded = true")
        run.call("POST", "scheduler", "/v1/jobs", JOB)
        await browser.wait_for(
            "window.notReloaded && document.querySelector('[data-view=queue] [data-job=\"dash-job\"]')",
            "the job submitted during the test appearing on the queue page without a reload",
        )

        # Its page: placement (two ranks), the events it has on the bus, its trace id; on the fabric, its hosts lit.
        await browser.open(base + "#/job/dash-job")
        await browser.wait_for(
            "document.querySelector('[data-view=job][data-state=running]')", "dash-job running on its page", 60
        )
        events = await browser.wait_for(
            "[...document.querySelectorAll('[data-view=job] [data-event-type]')].map(e => e.dataset.eventType)"
            ".filter(t => t === 'JobScheduled').length && "
            "[...document.querySelectorAll('[data-view=job] [data-event-type]')].map(e => e.dataset.eventType)",
            "dash-job's events listed on its page",
        )
        assert {"JobQueued", "JobScheduled"} <= set(events), events
        placed = run.call("GET", "scheduler", "/v1/jobs/dash-job")["nodes"]
        await browser.open(base + "#/gpus")
        held = await browser.wait_for(
            "[...document.querySelectorAll('[data-slice-job=\"dash-job\"]')]"
            ".map(e => e.closest('[data-gpu]').dataset.gpu)",
            "dash-job's tenth of a GPU on the GPU grid",
        )
        assert len(held) == 1 and held[0].split("/")[0] == placed[0], (held, placed)
        await browser.open(base + "#/fabric?job=dash-job")
        lit = await browser.wait_for(
            "document.querySelector('[data-highlighted-job=\"dash-job\"]') && "
            "[...document.querySelectorAll('[data-view=fabric] [data-lit]')].map(e => e.dataset.fabricNode)"
            ".concat(['(drawn)'])",
            "dash-job's placement highlighted on the fabric",
        )
        hosts = await browser.evaluate(
            "[...document.querySelectorAll('[data-view=fabric] rect')].map(r => r.parentNode.dataset.fabricNode)"
        )
        assert len(placed) == 1 and {h for h in lit if h in hosts} == set(placed) & set(hosts), (placed, lit)

        # A browser reconnecting with the last event id it had gets what it missed first.
        async with (
            aiohttp.ClientSession() as http,
            http.get(run.urls["dashboard"] + "/events", headers={"Last-Event-ID": "0"}) as r,
        ):
            assert r.headers["Content-Type"].startswith("text/event-stream")
            seen = b""
            while b"\nevent: bus\n" not in seen:
                seen += await asyncio.wait_for(r.content.readany(), timeout=10)
            assert seen.startswith(b"retry: 2000\n\nid: "), seen[:200]

        status, document = get(run.urls["dashboard"] + "/openapi.json")
        assert status == 200 and "/api/actions/nodes/{node}/{verb}" in str(document["paths"])

        # Malformed reads: clear 4xx answers naming what is wrong.
        for path, status, says in [
            ("/api/events?limit=0", 400, "limit"),
            ("/api/fabric?job=a.b", 400, "job"),
            ("/api/jobs/no-such-job", 404, "no-such-job"),
            ("/api/nope", 404, "/api/nope"),
        ]:
            got, body = get(run.urls["dashboard"] + path)
            assert got == status and says in str(body.get("detail")), (path, got, body)

        # Actions: read-only without the operator's token, refused clearly when malformed.
        action = run.urls["dashboard"] + "/api/actions/nodes/node-002/drain"
        assert post(action, {"reason": "no token"}, None)[0] == 401
        assert post(action, {"reason": "not an operator"}, client_token(run))[0] == 403
        status, body = post(action, {}, run.token)
        assert status == 400 and "reason" in str(body["detail"]), body
        assert post(run.urls["dashboard"] + "/api/actions/nodes/node-002/reboot", {"reason": "x"}, run.token)[0] == 400

        # Live: a drain through the dashboard shows on the nodes page and in the event stream, no reload.
        await browser.open(base + "#/events")
        await browser.wait_for(PAGES["events"][1], "the events page drawn")
        await browser.evaluate("window.notReloaded = true")
        status, body = post(action, {"reason": "e2e: dashboard drain"}, run.token)
        assert status == 200 and body["outcome"], body
        await browser.wait_for(
            "window.notReloaded && document.querySelector('#event-list [data-event-type=DrainRequested]"
            '[data-event-key="node-002"]\')',
            "node-002's DrainRequested arriving in the event stream without a reload",
        )
        await browser.open(base + "#/nodes")
        await browser.wait_for(
            'document.querySelector(\'tr[data-node="node-002"][data-drained="e2e: dashboard drain"]\')',
            "node-002 shown as drained on the nodes page",
        )
        assert browser.problems == [], "\n".join(browser.problems)


def client_token(run: Served) -> str | None:
    from ibpool_runtime import devstack

    info = devstack.read_info(run.state)
    return devstack.api_token(info, "client") if info is not None else None
