"""The dashboard's HTTP side: the pages (static HTML and ES modules), their JSON models, `/events`
(server-sent events fed from the bus) and the operator's actions.

Reads are open (as every service's are unless `api_protect_reads`). Actions live under
`/api/actions/`, which only an operator's token may call (the runtime's `ApiAuth`); the token is
forwarded to the service that acts, as `ibpool drain` or `ibpool job cancel` sends it, so the
dashboard holds no power of its own. Without an API tokens file the dashboard takes no actions at
all (403): read-only by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from aiohttp import web

from ibpool_cli.ops import NOT_FOUND, Cluster, OpsError
from ibpool_runtime.bus import Bus
from ibpool_runtime.http import ErrorBody, SafeId, documented, json_response, read_body

from . import views
from .feed import Feed, job_events
from .sources import Sources

STATIC = Path(__file__).parent / "static"
KEEPALIVE_S = 15.0
NodeVerb = Literal["cordon", "uncordon", "drain", "recover"]
# A node's name as the services take it in a path (letters, digits, `_`, `-`, `.`).
NodeId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]
EventLimit = Annotated[int, msgspec.Meta(ge=1, le=5000)]


class ActionBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Why: it goes into the events and the node's verdict history, as with `ibpool drain --reason`.
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]


class ServiceRow(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    instance: str
    role: str
    http_url: str


class EventsView(msgspec.Struct, frozen=True, kw_only=True):
    following: bool
    events: list[views.EventRow]


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """A page's model, and which services did not answer for it (service read -> why)."""

    model: object
    errors: dict[str, str]


class Dashboard:
    """What the routes read: the services, the bus feed, the overview's history."""

    def __init__(self, bus: Bus, sources: Sources, feed: Feed, history_points: int, can_act: bool) -> None:
        self.bus, self.sources, self.feed, self.can_act = bus, sources, feed, can_act
        self.history: deque[views.HistoryPoint] = deque(maxlen=history_points)
        self.stop = asyncio.Event()
        self._tick_listeners: set[asyncio.Queue[views.HistoryPoint]] = set()

    def add_point(self, point: views.HistoryPoint) -> None:
        """A new point of the overview's history, sent to every `/events` listener as a `tick`."""
        self.history.append(point)
        for q in list(self._tick_listeners):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(point)

    @contextlib.contextmanager
    def listen_ticks(self) -> Iterator[asyncio.Queue[views.HistoryPoint]]:
        q: asyncio.Queue[views.HistoryPoint] = asyncio.Queue(100)
        self._tick_listeners.add(q)
        try:
            yield q
        finally:
            self._tick_listeners.discard(q)


def _problem(status: int, error: str, detail: str) -> web.Response:
    return json_response(ErrorBody(error=error, detail=detail), status=status)


def _ops_problem(e: OpsError) -> web.Response:
    if e.code == NOT_FOUND:
        return _problem(404, "not found", str(e))
    # The service answered with an error: a conflict with its state (409); it could not be reached: 502.
    return _problem(502 if e.status is None else 409, "service error", str(e))


def routes(d: Dashboard) -> list[web.AbstractRouteDef]:
    async def index(_: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    @documented("The cluster in numbers, with the history of allocation and queue depth", {200: Page})
    async def overview(_: web.Request) -> web.Response:
        snap = await d.sources.snapshot("pool", "health", "jobs", "links")
        model = views.overview(snap.pool, snap.health, snap.jobs, snap.links, d.feed.telemetry, list(d.history))
        return json_response(Page(model=model, errors=snap.errors))

    @documented("Every GPU by node: state, the jobs on it (whole, fraction, MIG), telemetry", {200: Page})
    async def gpus(_: web.Request) -> web.Response:
        snap = await d.sources.snapshot("pool", "allocations", "health")
        model = views.gpu_grid(snap.pool, snap.allocations, snap.health, d.feed.telemetry)
        return json_response(Page(model=model, errors=snap.errors))

    @documented("The waiting jobs with why each waits, the running ones, the queues", {200: Page})
    async def queue(_: web.Request) -> web.Response:
        snap = await d.sources.snapshot("jobs", "queues")
        return json_response(
            Page(model=views.queue(snap.jobs, snap.queues, dt.datetime.now(dt.UTC)), errors=snap.errors)
        )

    @documented(
        "The fabric's tiers and link health; with `job`, that job's hosts highlighted",
        {200: Page},
        query={"job": SafeId},
    )
    async def fabric(request: web.Request) -> web.Response:
        job_id = request.query.get("job")
        topology, why = await d.sources.topology()
        snap = await d.sources.snapshot("links")
        errors = snap.errors | ({"topology": why} if why else {})
        hosts: list[str] = []
        if job_id:
            try:
                hosts = list((await d.sources.cluster().call("GET", "scheduler", f"/v1/jobs/{job_id}"))["nodes"])
            except OpsError as e:
                if e.code == NOT_FOUND:
                    return _problem(404, "not found", f"no job {job_id!r}: {e}")
                errors["job"] = str(e)
        model = views.fabric(topology, snap.links, hosts, job_id)
        return json_response(Page(model=model, errors=errors))

    @documented("Every node: health, cordons and drains, GPUs, jobs, verdict history", {200: Page})
    async def nodes(_: web.Request) -> web.Response:
        snap = await d.sources.snapshot("pool", "health", "allocations", "verdicts")
        model = views.nodes(snap.pool, snap.health, snap.allocations, snap.verdicts)
        return json_response(Page(model=model, errors=snap.errors))

    @documented(
        "One job: placement, SHARP, ranks, its events and trace id",
        {200: Page, 404: ErrorBody, 502: ErrorBody},
        path={"job_id": SafeId},
    )
    async def job(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        try:
            found = await d.sources.cluster().call("GET", "scheduler", f"/v1/jobs/{job_id}")
        except OpsError as e:
            return _ops_problem(e)
        events = await job_events(d.bus, job_id)
        return json_response(Page(model=views.job_detail(found, events), errors={}))

    @documented("The newest events on the bus (oldest first)", {200: EventsView}, query={"limit": EventLimit})
    async def recent_events(request: web.Request) -> web.Response:
        limit = int(request.query.get("limit", "200"))
        rows = list(d.feed.recent)[-limit:]
        return json_response(EventsView(following=d.feed.following, events=rows))

    @documented("The services found on the bus", {200: list[ServiceRow]})
    async def found(_: web.Request) -> web.Response:
        rows = [
            ServiceRow(service=v.service, instance=v.instance, role=v.role, http_url=v.http_url)
            for v in d.sources.found
        ]
        return json_response(rows)

    @documented("Server-sent events: `bus` (each event as it is stored), `tick` (an overview point)", {200: str})
    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        with d.feed.listen() as q, d.listen_ticks() as ticks:
            upto = d.feed.seq  # what comes after this is in `q`
            await response.prepare(request)
            await response.write(b"retry: 2000\n\n")  # listening already: nothing after this is missed
            # A browser that reconnects says the last event it had: what it missed comes first.
            last = request.headers.get("Last-Event-ID", "")
            if last.isdigit():
                missed = [r for r in d.feed.recent if int(last) < r.seq <= upto]
                if missed:
                    await response.write(b"".join(_sse("bus", msgspec.json.encode(r), r.seq) for r in missed))
            stopping = asyncio.ensure_future(d.stop.wait())
            try:
                while not d.stop.is_set():
                    got_event = asyncio.ensure_future(q.get())
                    got_tick = asyncio.ensure_future(ticks.get())
                    done, pending = await asyncio.wait(
                        {got_event, got_tick, stopping}, timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED
                    )
                    for p in pending - {stopping}:
                        p.cancel()
                    chunks = []
                    if got_event in done:
                        row = got_event.result()
                        chunks.append(_sse("bus", msgspec.json.encode(row), row.seq))
                    if got_tick in done:
                        chunks.append(_sse("tick", msgspec.json.encode(got_tick.result())))
                    await response.write(b"".join(chunks) if chunks else b": keepalive\n\n")
            except ConnectionResetError:  # the browser went away
                pass
            finally:
                stopping.cancel()
        return response

    @documented(
        "An operator's action on a node (cordon, uncordon, drain, recover), forwarded to the failover controller",
        {200: dict[str, object], 403: ErrorBody, 404: ErrorBody, 409: ErrorBody, 502: ErrorBody},
        body=ActionBody,
        path={"node": NodeId, "verb": NodeVerb},
    )
    async def node_action(request: web.Request) -> web.Response:
        refused = _refuse_unless_able(d)
        if refused is not None:
            return refused
        body = await read_body(request, ActionBody)
        node, verb = request.match_info["node"], request.match_info["verb"]
        try:
            answer = await _as_caller(d, request).call(
                "POST", "failover_controller", f"/health/nodes/{node}/{verb}", {"reason": body.reason}
            )
        except OpsError as e:
            return _ops_problem(e)
        return json_response(answer)

    @documented(
        "Cancel a job, forwarded to the scheduler",
        {200: dict[str, object], 403: ErrorBody, 404: ErrorBody, 502: ErrorBody},
        path={"job_id": SafeId},
    )
    async def cancel_job(request: web.Request) -> web.Response:
        refused = _refuse_unless_able(d)
        if refused is not None:
            return refused
        try:
            answer = await _as_caller(d, request).call(
                "DELETE", "scheduler", f"/v1/jobs/{request.match_info['job_id']}"
            )
        except OpsError as e:
            return _ops_problem(e)
        return json_response(answer)

    return [
        web.get("/", index),
        web.get("/api/overview", overview),
        web.get("/api/gpus", gpus),
        web.get("/api/queue", queue),
        web.get("/api/fabric", fabric),
        web.get("/api/nodes", nodes),
        web.get("/api/jobs/{job_id}", job),
        web.get("/api/events", recent_events),
        web.get("/api/services", found),
        web.get("/events", events),
        web.post("/api/actions/nodes/{node}/{verb}", node_action),
        web.post("/api/actions/jobs/{job_id}/cancel", cancel_job),
        web.static("/static", STATIC),
    ]


def _sse(kind: str, data: bytes, seq: int | None = None) -> bytes:
    """One server-sent event; `seq` (a bus event's) is its id, which a reconnecting browser sends back."""
    head = b"id: %d\n" % seq if seq is not None else b""
    return head + b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _refuse_unless_able(d: Dashboard) -> web.Response | None:
    if d.can_act:
        return None
    return _problem(
        403, "read-only", "this dashboard takes no actions: it has no API tokens file (api_tokens_file) to check"
    )


def _as_caller(d: Dashboard, request: web.Request) -> Cluster:
    """The services as the caller reaches them: with the caller's own (operator) token."""
    header = request.headers.get("Authorization", "")
    return d.sources.cluster(header.partition(" ")[2].strip() or None)
