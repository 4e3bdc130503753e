"""The fabric feed without a bus: fetch a published topology, keep the old one on failure, read a
topology file at start, fold link verdicts and place them on the fabric."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from ibpool_core.fabric.formats import export_topology
from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.model import Topology, content_hash
from ibpool_core.fabric.view import FabricView, fabric_state
from ibpool_proto.fabric import LinkDegraded, LinkRecovered, LinkStateChanged, TopologyPublished
from ibpool_runtime.config import BaseConfig, ConfigError
from ibpool_runtime.fabric_feed import FabricFeed, FabricFetchFailed, durable_name, load_fabric_file
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit

SMALL = generate("fat_tree_2tier:hosts=8,radix=8")
# The same fabric grown (its versions compare): the fabric monitor publishes both under one name.
LARGER = msgspec.structs.replace(generate("fat_tree_2tier:hosts=12,radix=8"), name=SMALL.name)
OTHER = generate("fat_tree_2tier:hosts=12,radix=8")
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class FabricServer:
    """Serves topologies by version as the fabric monitor does, counting requests."""

    def __init__(self) -> None:
        self.versions: dict[int, Topology] = {}
        self.status = 200
        self.hits = 0
        self.url = ""

    async def topology(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.status != 200:
            return web.json_response({"error": "boom"}, status=self.status)
        t = self.versions.get(int(request.query["version"]))
        if t is None:
            return web.json_response({"error": "not found"}, status=404)
        return web.Response(body=msgspec.json.encode(t), content_type="application/json")

    def published(self, version: int, topology: Topology, digest: str | None = None) -> TopologyPublished:
        self.versions[version] = topology
        return TopologyPublished(
            source="fabric_monitor/test",
            key=topology.name,
            version=version,
            content_hash=digest or content_hash(topology),
            hosts=len(topology.hosts),
            switches=len(topology.switches),
            links=len(topology.links),
            url=f"{self.url}/v1/topology?version={version}",
        )


@pytest.fixture
async def server() -> AsyncIterator[FabricServer]:
    fs = FabricServer()
    app = web.Application()
    app.router.add_get("/v1/topology", fs.topology)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fs.url = f"http://127.0.0.1:{port}"
    try:
        yield fs
    finally:
        await runner.cleanup()


def feed(view: FabricView, fetch_timeout_s: float = 10.0) -> FabricFeed:
    kit: Kit[Any] = Kit(
        name="scheduler",
        config=BaseConfig(instance="unit"),
        bus=None,  # type: ignore[arg-type]  # the handler and the file loader never use it
        store=None,  # type: ignore[arg-type]
        metrics=ServiceMetrics("scheduler"),
    )
    return FabricFeed(kit, view, fetch_timeout_s=fetch_timeout_s, durable_prefix="scheduler")


async def test_published_topology_is_fetched_once_and_replaces_the_view(server: FabricServer) -> None:
    view = FabricView()
    f = feed(view)
    try:
        first = server.published(1, SMALL)
        await f.on_topology(first)
        about = view.about
        assert about is not None and (about.version, about.hosts, about.leaf_groups) == (1, 8, 2)
        assert view.hops("node001", "node005") == 4
        await f.on_topology(first)  # redelivered: nothing fetched
        assert server.hits == 1
        await f.on_topology(server.published(2, LARGER))
        assert view.about is not None and (view.about.version, view.about.hosts) == (2, 12)
        await f.on_topology(server.published(1, SMALL))  # an older version announced late: ignored
        assert view.about.version == 2 and server.hits == 2
        # another fabric (another name: a fabric monitor of another fabric) replaces it whatever its version
        await f.on_topology(server.published(1, OTHER))
        assert view.about.name == OTHER.name and view.about.version == 1 and server.hits == 3
    finally:
        if f._http is not None:
            await f._http.close()


@pytest.mark.parametrize(
    ("status", "digest", "why"),
    [(500, None, "HTTP 500"), (200, "0" * 64, "content hash"), (404, None, "HTTP 404")],
)
async def test_failed_fetch_keeps_the_previous_fabric_and_raises(
    server: FabricServer, status: int, digest: str | None, why: str
) -> None:
    view = FabricView()
    f = feed(view)
    try:
        await f.on_topology(server.published(1, SMALL))
        server.status = status
        event = server.published(2, LARGER, digest)
        if status == 404:
            server.status = 200
            del server.versions[2]
        with pytest.raises(FabricFetchFailed, match=why):
            await f.on_topology(event)
        assert view.about is not None and view.about.version == 1
        assert f.failures._value.get() == 1
    finally:
        if f._http is not None:
            await f._http.close()


async def test_unreachable_fabric_monitor_is_a_clear_failure() -> None:
    view = FabricView()
    f = feed(view, fetch_timeout_s=2.0)
    event = FabricServer().published(1, SMALL)
    event = msgspec.structs.replace(event, url="http://127.0.0.1:9/v1/topology?version=1")
    try:
        with pytest.raises(FabricFetchFailed, match=r"GET http://127\.0\.0\.1:9/"):
            await f.on_topology(event)
        assert view.about is None
    finally:
        if f._http is not None:
            await f._http.close()


def test_topology_file_is_read_in_any_format(tmp_path: Path) -> None:
    native = tmp_path / "fabric.json"
    native.write_text(export_topology("native", SMALL).text)
    state = load_fabric_file(service="scheduler", path=str(native))
    assert state.about.version is None and state.about.hosts == 8 and state.about.leaf_groups == 2
    slurm = tmp_path / "topology.conf"
    slurm.write_text(export_topology("slurm", SMALL).text)
    assert load_fabric_file(service="scheduler", path=str(slurm)).about.leaf_groups == 2
    with pytest.raises(ConfigError, match=r"fabric_file.*missing\.json"):
        load_fabric_file(service="scheduler", path=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match="no hosts"):
        load_fabric_file(service="scheduler", path=str(bad))
    bad.write_text("not json {")
    with pytest.raises(ConfigError, match=r"fabric_file.*bad\.json"):
        load_fabric_file(service="scheduler", path=str(bad))


def test_every_replica_has_its_own_fabric_consumer() -> None:
    assert durable_name("pool-allocator", "pool_allocator/a") == "pool-allocator-fabric-a"
    assert durable_name("pool-allocator", "pool_allocator/host.example") == "pool-allocator-fabric-host_example"


def recovered(link_id: str, at: dt.datetime) -> LinkRecovered:
    return LinkRecovered(
        source="fm", key=link_id, link_id=link_id, occurred_at=at, topology_version=1, problem="errors"
    )


def test_link_verdicts_fall_on_host_adapters_and_leaf_uplinks() -> None:
    """The newest verdict of each link counts; a host cable marks its host, a leaf uplink its leaf."""
    f = feed(FabricView())
    f.view.replace(fabric_state(SMALL, version=1, origin="test"))
    links = {lk.link_id: lk for lk in SMALL.links}
    cas = {ca.guid: ca.host for ca in SMALL.cas}
    host_link = next(lid for lid, lk in links.items() if lk.a.guid in cas or lk.b.guid in cas)
    host = cas.get(links[host_link].a.guid) or cas[links[host_link].b.guid]
    uplink = next(lid for lid, lk in links.items() if lk.a.guid not in cas and lk.b.guid not in cas)
    at = NOW
    assert f.link_health() == {}
    f.on_link(LinkDegraded(source="fm", key=host_link, link_id=host_link, occurred_at=at, topology_version=1))
    f.on_link(
        LinkStateChanged(
            source="fm",
            key=uplink,
            link_id=uplink,
            occurred_at=at,
            state="down",
            previous_state="up",
            topology_version=1,
        )
    )
    health = f.link_health()
    assert health[host] == "degraded"
    leaf = f.view.state.targets[uplink].leaf_guid  # type: ignore[union-attr]
    assert leaf is not None and health[leaf] == "down"
    # an older verdict changes nothing; a newer recovery clears the host
    version = f.links_version
    f.on_link(recovered(host_link, at - dt.timedelta(1)))
    assert f.links_version == version and f.link_health()[host] == "degraded"
    f.on_link(recovered(host_link, at + dt.timedelta(1)))
    assert host not in f.link_health() and f.link_health()[leaf] == "down"
