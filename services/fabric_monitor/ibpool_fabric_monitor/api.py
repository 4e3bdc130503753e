"""The fabric monitor's HTTP API: topology versions and diffs, link health, distances, simulated faults."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import msgspec
from aiohttp import web

from ibpool_core.fabric.link_health import LinkHealth
from ibpool_core.fabric.model import Topology, TopologyDiff, diff
from ibpool_runtime.http import BadBody, ErrorBody, Unprocessable, documented, json_response, read_body
from ibpool_sim.fabric_faults import Fault, UnknownLink

from . import state
from .service import FabricMonitor
from .sources import SimulatedSource

LINK_STATES = ("up", "down", "degraded", "flapping")
MAX_VERSION = 2**31 - 1  # topology versions are Postgres integers
Version = Annotated[int, msgspec.Meta(ge=0, le=MAX_VERSION)]


class DistanceView(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    target: str
    rail: int | None
    hops: int | None
    bottleneck_gbps: float | None
    topology_version: int


class LinkView(msgspec.Struct, frozen=True, kw_only=True):
    link_id: str
    state: str
    problems: list[str]
    # With ?host=: the host's adapter on this link (its name, or GUID), its rail, and the other end.
    adapter: str | None = None
    rail: int | None = None
    peer: str | None = None


class HostLink(msgspec.Struct, frozen=True, kw_only=True):
    adapter: str
    rail: int | None
    peer: str


def links_by_host(topology: Topology) -> dict[str, dict[str, HostLink]]:
    """host -> (link id -> the host's end and the other one) for every cable of the host's adapters,
    built in one walk over the links (`?host=` answers from it for as long as the topology holds)."""
    cas = {ca.guid: ca for ca in topology.cas if ca.host}
    names = {sw.guid: sw.name for sw in topology.switches} | {r.guid: r.name for r in topology.routers}
    names |= {ca.guid: f"{ca.host}/{ca.name or ca.guid}" for ca in topology.cas}
    out: dict[str, dict[str, HostLink]] = {ca.host: {} for ca in cas.values()}
    for link in topology.links:
        seen = None  # a cable between two adapters of one host is that host's once, by its first end
        for mine, other in ((link.a, link.b), (link.b, link.a)):
            ca = cas.get(mine.guid)
            if ca is not None and ca.host != seen:
                out[ca.host][link.link_id] = HostLink(
                    adapter=ca.name or ca.guid, rail=ca.rail, peer=names.get(other.guid, other.guid)
                )
                seen = ca.host
    return out


class Cleared(msgspec.Struct, frozen=True, kw_only=True):
    cleared: str


def _int_param(request: web.Request, name: str, default: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise BadBody(f"query parameter `{name}` is required", f"?{name}")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadBody(f"query parameter `{name}` must be an integer, got {raw!r}", f"?{name}") from None
    if not -MAX_VERSION <= value <= MAX_VERSION:
        raise BadBody(f"query parameter `{name}` is out of range: {value}", f"?{name}")
    return value


def _not_found(detail: str) -> web.Response:
    return json_response({"error": "not found", "detail": detail}, status=404)


def routes(monitor: FabricMonitor) -> web.RouteTableDef:
    r = web.RouteTableDef()
    pool = monitor.kit.store.pool
    # `?host=`'s index of the topology in force, made at the first such request after it changed.
    by_host: tuple[Topology | None, dict[str, dict[str, HostLink]]] = (None, {})

    @r.get("/v1/topology")
    @documented("A topology version (default: current)", {200: Topology, 404: ErrorBody}, query={"version": Version})
    async def get_topology(request: web.Request) -> web.Response:
        version = _int_param(request, "version", monitor.version)
        t = await state.topology(pool, version)
        if t is None:
            return _not_found(f"no topology version {version}")
        return web.Response(
            body=msgspec.json.encode(t), content_type="application/json", headers={"X-Topology-Version": str(version)}
        )

    @r.get("/v1/topology/versions")
    @documented("Every topology version", {200: list[state.VersionRow]})
    async def list_versions(_: web.Request) -> web.Response:
        return json_response(await state.versions(pool))

    @r.get("/v1/topology/diff")
    @documented(
        "What changed between two versions",
        {200: TopologyDiff, 404: ErrorBody},
        query={"from": Version, "to": Version},
        required_query=["from"],
    )
    async def get_diff(request: web.Request) -> web.Response:
        old_v, new_v = _int_param(request, "from"), _int_param(request, "to", monitor.version)
        old, new = await state.topology(pool, old_v), await state.topology(pool, new_v)
        if old is None or new is None:
            return _not_found(f"no topology version {old_v if old is None else new_v}")
        return json_response(diff(old, new))

    @r.get("/v1/links")
    @documented(
        "Link health; ?host=NAME: that host's cables only, with its adapter, rail and the other end"
        " (404 for a host the published topology does not have)",
        {200: list[LinkView], 404: ErrorBody},
        query={"state": Literal["up", "down", "degraded", "flapping"], "host": str},
    )
    async def list_links(request: web.Request) -> web.Response:
        wanted = request.query.get("state")
        if wanted is not None and wanted not in LINK_STATES:
            raise BadBody(f"state must be one of {', '.join(LINK_STATES)}, got {wanted!r}", "?state")
        healths: dict[str, LinkHealth] = monitor.healths
        host = request.query.get("host")
        if host is not None:
            nonlocal by_host
            topology = monitor.topology
            if by_host[0] is not topology:
                by_host = (topology, await asyncio.to_thread(links_by_host, topology))
            mine = by_host[1].get(host, {})
            if not mine:
                detail = f"no host {host!r} with adapters in topology version {monitor.version}"
                return json_response(ErrorBody(error="not found", detail=detail), status=404)
            return json_response(
                [
                    LinkView(
                        link_id=link_id,
                        # Not judged yet (no sample since the topology was published): unknown.
                        state=h.state if (h := healths.get(link_id)) is not None else "unknown",
                        problems=sorted(h.active) if h is not None else [],
                        adapter=end.adapter,
                        rail=end.rail,
                        peer=end.peer,
                    )
                    for link_id, end in sorted(mine.items())
                    if wanted is None or (healths[link_id].state if link_id in healths else "unknown") == wanted
                ]
            )
        return json_response(
            [
                LinkView(link_id=h.link_id, state=h.state, problems=sorted(h.active))
                for h in sorted(healths.values(), key=lambda h: h.link_id)
                if wanted is None or h.state == wanted
            ]
        )

    @r.get("/v1/hosts/{name}/distance/{other}")
    @documented(
        "Hops and bottleneck between two hosts",
        {200: DistanceView, 404: ErrorBody, 503: ErrorBody},
        query={"rail": Annotated[int, msgspec.Meta(ge=0, le=MAX_VERSION)]},
    )
    async def distance(request: web.Request) -> web.Response:
        index = monitor.index
        a, b = request.match_info["name"], request.match_info["other"]
        rail = _int_param(request, "rail") if "rail" in request.query else None
        if index is None:
            return json_response({"error": "not ready", "detail": "no topology loaded yet"}, status=503)
        for host in (a, b):
            if host not in index.hosts:
                return _not_found(f"host {host!r} is not in topology version {monitor.version}")
        if rail is not None and (rail not in index.rails(a) or rail not in index.rails(b)):
            return _not_found(f"rail {rail} is not a rail of both hosts ({a}: {list(index.rails(a))})")
        return json_response(
            DistanceView(
                source=a,
                target=b,
                rail=rail,
                hops=index.hops(a, b, rail),
                bottleneck_gbps=index.bottleneck_gbps(a, b, rail),
                topology_version=monitor.version,
            )
        )

    @r.post("/v1/sim/faults")
    @documented("Inject a fault into the simulated fabric", {202: Fault, 404: ErrorBody, 409: ErrorBody}, body=Fault)
    async def inject_fault(request: web.Request) -> web.Response:
        source = monitor.source
        if not isinstance(source, SimulatedSource):
            return json_response(
                {"error": "conflict", "detail": "faults can only be injected into the simulated fabric"}, status=409
            )
        fault = await read_body(request, Fault)
        try:
            source.fabric.inject(fault, monitor.clock.now())
        except UnknownLink as e:
            return _not_found(str(e.args[0]))
        except ValueError as e:
            raise Unprocessable(str(e), "$.value") from None
        return json_response(fault, status=202)

    @r.delete("/v1/sim/faults/{link_id}")
    @documented("Clear a link's simulated fault", {200: Cleared, 409: ErrorBody})
    async def clear_fault(request: web.Request) -> web.Response:
        source = monitor.source
        if not isinstance(source, SimulatedSource):
            return json_response({"error": "conflict", "detail": "no simulated fabric here"}, status=409)
        try:
            source.fabric.clear(request.match_info["link_id"])
        except UnknownLink as e:
            return _not_found(str(e.args[0]))
        return json_response(Cleared(cleared=request.match_info["link_id"]))

    return r
