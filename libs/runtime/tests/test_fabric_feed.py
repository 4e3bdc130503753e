"""The allocator's fabric feed without a bus: fetch a published topology, keep the old one on failure,
read a topology file at start; the pool view's fragmentation and fabric fields."""

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
from ibpool_core.pool.allocate import handle
from ibpool_core.pool.fabric_view import FabricView, fabric_state
from ibpool_core.pool.ledger import Ledger
from ibpool_core.pool.policy_placer import policy_placer
from ibpool_pool_allocator.api import pool_view
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_pool_allocator.fabric_feed import FabricFeed, FabricFetchFailed, durable_name, load_fabric_file
from ibpool_pool_allocator.fragmentation_measure import FragmentationReader, fragmentation_of
from ibpool_proto.fabric import TopologyPublished
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import RequestAllocation, ResourceRequest
from ibpool_runtime.config import ConfigError
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit

SMALL = generate("fat_tree_2tier:hosts=8,radix=8")
LARGER = generate("fat_tree_2tier:hosts=12,radix=8")
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


def feed(view: FabricView, **cfg: Any) -> FabricFeed:
    kit = Kit(
        name="pool_allocator",
        config=PoolAllocatorConfig(instance="unit", **cfg),
        bus=None,  # type: ignore[arg-type]  # the handler and the file loader never use it
        store=None,  # type: ignore[arg-type]
        metrics=ServiceMetrics("pool_allocator"),
    )
    return FabricFeed(kit, view)


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
    f = feed(view, fabric_fetch_timeout_s=2.0)
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
    state = load_fabric_file(str(native))
    assert state.about.version is None and state.about.hosts == 8 and state.about.leaf_groups == 2
    slurm = tmp_path / "topology.conf"
    slurm.write_text(export_topology("slurm", SMALL).text)
    assert load_fabric_file(str(slurm)).about.leaf_groups == 2
    with pytest.raises(ConfigError, match=r"fabric_file.*missing\.json"):
        load_fabric_file(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match="no hosts"):
        load_fabric_file(str(bad))
    bad.write_text("not json {")
    with pytest.raises(ConfigError, match=r"fabric_file.*bad\.json"):
        load_fabric_file(str(bad))


def test_every_replica_has_its_own_fabric_consumer() -> None:
    assert durable_name("pool-allocator", "pool_allocator/a") == "pool-allocator-fabric-a"
    assert durable_name("pool-allocator", "pool_allocator/host.example") == "pool-allocator-fabric-host_example"


def registered(node_id: str) -> NodeRegistered:
    return NodeRegistered(
        source="t",
        key=node_id,
        node_id=node_id,
        hostname=node_id,
        cpu_milli=8000,
        memory_mib=64_000,
        gpus=[GpuInfo(index=i, uuid=f"{node_id}-{i}", model="H100", memory_mib=80_000) for i in range(2)],
        backend="test",
    )


def test_pool_view_says_which_fragmentation_it_shows() -> None:
    ledger = Ledger()
    handle(ledger, registered("node001"), NOW)
    place = policy_placer("best-fit")
    before = pool_view(ledger, fragmentation_of(place, ledger))
    assert before.fragmentation_measure == "partial_free" and before.fabric is None
    ask = RequestAllocation(
        source="t", key="j", job_id="j", tenant="t", queue="q", request=ResourceRequest(kind="fraction", milli=700)
    )
    handle(ledger, ask, NOW, place=place)
    view = FabricView(fabric_state(SMALL, version=None, origin="test"))
    after = pool_view(ledger, fragmentation_of(place, ledger), view.about)
    (model,) = after.models
    # A 700-milli mix cannot use the 300 left on the shared GPU.
    assert (after.fragmentation_measure, after.workload_types, model.fragmentation_milli) == ("fgd", 1, 300)
    assert after.fabric is not None and after.fabric.hosts == 8


def test_fragmentation_reader_measures_again_when_the_ledger_changes() -> None:
    ledger = Ledger()
    handle(ledger, registered("node001"), NOW)
    place = policy_placer("fgd")
    reader = FragmentationReader(place)
    assert reader.read(ledger).measure == "partial_free"
    ask = RequestAllocation(
        source="t", key="j", job_id="j", tenant="t", queue="q", request=ResourceRequest(kind="fraction", milli=600)
    )
    handle(ledger, ask, NOW, place=place)
    again = reader.read(ledger)
    assert (again.measure, again.milli) == ("fgd", {"H100": 400})
    assert reader.read(ledger) is again
