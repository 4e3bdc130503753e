"""The fabric monitor against real NATS and Postgres: versions, and every injected fault detected."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import msgspec

from ibpool_core.fabric.model import Ca, Host, Link, PortRef, Switch, Topology, build_topology
from ibpool_fabric_monitor import state
from ibpool_fabric_monitor.bootstrap import bootstrap
from ibpool_fabric_monitor.config import FabricMonitorConfig
from ibpool_proto import decode
from ibpool_proto.fabric import LinkDegraded, LinkFlapping, LinkRecovered, LinkStateChanged, TopologyPublished
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store
from ibpool_sim.fake_sysfs import write_hca_port
from tests.integration.agent_support import running_agent, unique_prefix
from tests.integration.helpers import eventually, own_store, stream_messages


def small_fabric(name: str, leaf2_uplink_width: int = 4) -> Topology:
    spine, leaf1, leaf2 = "0x00000000000000a1", "0x00000000000000b1", "0x00000000000000b2"
    switches = [Switch(guid=g, name=n, radix=16) for g, n in ((spine, "spine"), (leaf1, "leaf1"), (leaf2, "leaf2"))]
    hosts = [Host(name=f"h{i}") for i in range(4)]
    cas = [Ca(guid=f"0x00000000000001{i:02x}", host=f"h{i}", name="mlx5_0", rail=0) for i in range(4)]
    links = [
        Link(a=PortRef(leaf1, 1), b=PortRef(spine, 1)),
        Link(a=PortRef(leaf2, 1), b=PortRef(spine, 2), width=leaf2_uplink_width),
    ] + [Link(a=PortRef(cas[i].guid, 1), b=PortRef(leaf1 if i < 2 else leaf2, 2 + i % 2)) for i in range(4)]
    return build_topology(name=name, hosts=hosts, cas=cas, switches=switches, links=links)


@asynccontextmanager
async def running_monitor(
    bus: Bus, store: Store, topologies: list[Topology], **overrides: object
) -> AsyncIterator[Service]:
    settings: dict = {
        "poll_interval_s": 0.1,
        "flap_changes": 3,
        "flap_window_s": 5,
        "clear_after_s": 0.5,
        "errors_per_s": 5,
        "rediscover_interval_s": 0.3,
        "instance": "test",
    }
    cfg = FabricMonitorConfig(**(settings | overrides))
    kit = Kit(name="fabric_monitor", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("fabric_monitor"))

    def load() -> Topology:
        return topologies[0]

    service = Service(kit, await bootstrap(kit, load_topology=load))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def link_events(bus: Bus, link_id: str) -> list:
    subjects = [LinkStateChanged, LinkDegraded, LinkFlapping, LinkRecovered]
    out = []
    for cls in subjects:
        out += [decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_FABRIC", cls.subject(link_id))]
    return sorted(out, key=lambda e: e.occurred_at)


async def test_each_injected_fault_is_detected_and_recovers(bus: Bus, store: Store) -> None:
    name = f"fab{uuid.uuid4().hex[:6]}"
    fabric = small_fabric(name)
    links = [ln.link_id for ln in fabric.links]
    faults = {
        links[0]: {"kind": "down"},
        links[1]: {"kind": "flapping", "value": 0.25},
        links[2]: {"kind": "errors", "value": 1000},
        links[3]: {"kind": "width", "value": 1},
        links[4]: {"kind": "speed", "value": 50.0},
        links[5]: {"kind": "congestion", "value": 0.9},
    }
    expected = {
        links[0]: (LinkStateChanged, "down"),
        links[1]: (LinkFlapping, None),
        links[2]: (LinkDegraded, "errors"),
        links[3]: (LinkDegraded, "degraded_width"),
        links[4]: (LinkDegraded, "degraded_speed"),
        links[5]: (LinkDegraded, "congested"),
    }
    async with running_monitor(bus, store, [fabric]) as svc, aiohttp.ClientSession() as http:
        url = svc.http_url
        for link_id, body in faults.items():
            async with http.post(f"{url}/v1/sim/faults", json={"link_id": link_id, **body}) as r:
                assert r.status == 202, await r.text()

        for link_id, (cls, problem) in expected.items():

            async def detected(link_id: str = link_id, cls: type = cls, problem: str | None = problem) -> bool:
                return any(
                    isinstance(e, cls)
                    and (
                        problem is None
                        or getattr(e, "problem", None) == problem
                        or getattr(e, "state", None) == problem
                    )
                    for e in await link_events(bus, link_id)
                )

            await eventually(detected, timeout_s=15, what=f"{cls.__name__} {problem} on {link_id}")

        async with http.get(f"{url}/v1/links?state=down") as r:
            assert [v["link_id"] for v in await r.json()] == [links[0]]
        async with http.get(f"{url}/v1/links?state=sideways") as r:
            assert r.status == 400 and (await r.json())["path"] == "?state"
        # One host's cables: its adapters' links, each with the other end and its state.
        host = fabric.cas[0].host
        guids = {ca.guid for ca in fabric.cas if ca.host == host}
        mine = sorted(ln.link_id for ln in fabric.links if ln.a.guid in guids or ln.b.guid in guids)
        switches = {sw.name for sw in fabric.switches}
        async with http.get(f"{url}/v1/links", params={"host": host}) as r:
            seen = await r.json()
            assert r.status == 200 and [v["link_id"] for v in seen] == mine, seen
            assert all(v["peer"] in switches and v["adapter"] for v in seen), seen
            assert {v["link_id"]: v["state"] for v in seen}.get(links[0], "down") == "down"
        async with http.get(f"{url}/v1/links", params={"host": "no-such-host"}) as r:
            assert r.status == 404 and "no-such-host" in (await r.json())["detail"]

        for link_id in faults:
            async with http.delete(f"{url}/v1/sim/faults/{link_id}") as r:
                assert r.status == 200

        async def all_up() -> bool:
            async with http.get(f"{url}/v1/links") as r:
                return all(v["state"] == "up" for v in await r.json())

        await eventually(all_up, timeout_s=15, what="every link healthy again")
        for link_id in faults:
            recovered = [e for e in await link_events(bus, link_id) if isinstance(e, LinkRecovered)]
            assert recovered, f"no recovery event for {link_id}"
        # one raise per problem, not a storm
        errors = [e for e in await link_events(bus, links[2]) if isinstance(e, LinkDegraded)]
        assert len(errors) == 1, errors


async def test_topology_versions_only_on_change_with_diff(bus: Bus, store: Store) -> None:
    name = f"fab{uuid.uuid4().hex[:6]}"
    topologies = [small_fabric(name)]
    async with running_monitor(bus, store, topologies) as svc, aiohttp.ClientSession() as http:

        async def published() -> list[TopologyPublished]:
            msgs = await stream_messages(bus.js, "IBPOOL_FABRIC", TopologyPublished.subject(name))
            return [decode(m.data) for m in msgs]

        await eventually(lambda: _count(published(), 1), what="first version published")
        topologies[0] = small_fabric(name, leaf2_uplink_width=2)  # the rediscovery loop picks this up
        await eventually(lambda: _count(published(), 2), what="second version published")
        first, second = await published()
        assert (first.version, second.version) == (1, 2)
        assert second.diff is not None and second.diff.links_changed == 1 and second.diff.from_version == 1
        assert second.url == f"{svc.http_url}/v1/topology?version=2"
        async with http.get(second.url) as r:
            body = msgspec.json.decode(await r.read(), type=Topology)
            assert body == topologies[0]
        async with http.get(f"{svc.http_url}/v1/topology/diff?from=1&to=2") as r:
            assert len((await r.json())["links_changed"]) == 1
        async with http.get(f"{svc.http_url}/v1/topology?version=x") as r:
            assert r.status == 400 and "Expected `int`" in (await r.json())["detail"]
        async with http.get(f"{svc.http_url}/v1/topology?version=99") as r:
            assert r.status == 404
        async with http.get(f"{svc.http_url}/v1/hosts/h0/distance/h1") as r:
            body = await r.json()
            assert (body["hops"], body["bottleneck_gbps"]) == (2, 400.0)
        async with http.get(f"{svc.http_url}/v1/hosts/h0/distance/h3?rail=0") as r:
            body = await r.json()
            # leaf2's uplink runs 2x NDR in version 2: the bottleneck of the path
            assert (body["hops"], body["bottleneck_gbps"], body["topology_version"]) == (4, 200.0, 2)
        async with http.get(f"{svc.http_url}/v1/hosts/h0/distance/nobody") as r:
            assert r.status == 404 and "nobody" in (await r.json())["detail"]
        async with http.get(f"{svc.http_url}/v1/hosts/h0/distance/h1?rail=7") as r:
            assert r.status == 404 and "rail 7" in (await r.json())["detail"]  # no such path, as for a host
        async with http.get(f"{svc.http_url}/v1/hosts/h0/distance/h1?rail=-1") as r:
            assert r.status == 400 and (await r.json())["path"] == "?rail"
        await eventually(lambda: _count(published(), 2), what="no third version without a change")


async def test_only_the_newest_topology_versions_are_kept(bus: Bus, store: Store) -> None:
    # Each version holds the whole topology: a fabric that changes now and then must not fill the store.
    name = f"fab{uuid.uuid4().hex[:6]}"
    topologies = [small_fabric(name)]
    async with (
        running_monitor(bus, store, topologies, topology_versions_kept=2) as svc,
        aiohttp.ClientSession() as http,
    ):

        async def versions() -> list[int]:
            async with http.get(f"{svc.http_url}/v1/topology/versions") as r:
                return [v["version"] for v in await r.json()]

        async def made(n: int) -> bool:
            return max(await versions(), default=0) == n

        await eventually(lambda: made(1), what="first version")
        for width, n in ((2, 2), (8, 3)):
            topologies[0] = small_fabric(name, leaf2_uplink_width=width)
            await eventually(lambda n=n: made(n), what=f"version {n}")  # type: ignore[misc]
        assert await versions() == [2, 3]
        async with http.get(f"{svc.http_url}/v1/topology?version=1") as r:
            assert r.status == 404 and "no topology version 1" in (await r.json())["detail"]
        async with http.get(f"{svc.http_url}/v1/topology/diff?from=2&to=3") as r:
            assert r.status == 200 and len((await r.json())["links_changed"]) == 1


async def _count(coro, n: int) -> bool:  # type: ignore[no-untyped-def]
    return len(await coro) == n


async def test_ports_reported_by_node_agents_drive_link_health(
    stack: StackInfo, bus: Bus, store: Store, tmp_path: Path
) -> None:
    """No fabric manager: the agent reads its host's HCA from sysfs, the monitor judges the link from that."""
    prefix = unique_prefix()
    node = f"{prefix}-001"
    ca, leaf = "0x0002c903000e0b72", "0x0000000000000b01"
    fabric = build_topology(
        name=f"fab{uuid.uuid4().hex[:6]}",
        hosts=[Host(name=node)],
        cas=[Ca(guid=ca, host=node, name="mlx5_0", rail=0)],
        switches=[Switch(guid=leaf, name="leaf", radix=8)],
        links=[Link(a=PortRef(ca, 1), b=PortRef(leaf, 3))],
    )
    [link] = [ln.link_id for ln in fabric.links]
    port = write_hca_port(tmp_path, "mlx5_0", "0002:c903:000e:0b72", 1, "4: ACTIVE", "400 Gb/sec (4X NDR)")
    async with (
        own_store(stack) as agent_store,
        running_monitor(bus, store, [fabric], counter_source="agents", rediscover_interval_s=0) as monitor,
        running_agent(
            bus,
            agent_store,
            nodes=1,
            node_prefix=prefix,
            hca_ports="sysfs",
            sysfs_root=str(tmp_path),
            telemetry_interval_s=0.1,
        ),
    ):

        async def judged() -> bool:
            async with aiohttp.ClientSession() as http, http.get(f"{monitor.http_url}/v1/links") as r:
                return {v["link_id"]: v["state"] for v in msgspec.json.decode(await r.read())}.get(link) == "up"

        await eventually(judged, what="link judged up from the agent's report")
        assert not await link_events(bus, link)

        (port / "state").write_text("1: DOWN\n")

        async def went_down() -> bool:
            return any(isinstance(e, LinkStateChanged) and e.state == "down" for e in await link_events(bus, link))

        await eventually(went_down, what="LinkStateChanged(down) from the agent's report")


async def test_a_poll_stores_only_changed_verdicts_and_samples_of_links_not_up(bus: Bus, store: Store) -> None:
    """The bound on the monitor's writes: nothing for links clean since first seen (no row is what a
    restart reads as clean), a verdict only when it changes, and ring samples only of links not up,
    however many polls (not one upsert per link per poll); a restart reads back the one changed."""
    fabric = small_fabric(f"fab{uuid.uuid4().hex[:6]}")
    links = [ln.link_id for ln in fabric.links]
    async with running_monitor(bus, store, [fabric]) as svc, aiohttp.ClientSession() as http:

        def writes(kind: str) -> float:
            value = svc.kit.metrics.registry.get_sample_value("ibpool_fabric_monitor_link_writes_total", {"kind": kind})
            return float(value or 0.0)

        async def judged() -> list[dict[str, object]]:
            async with http.get(f"{svc.http_url}/v1/links") as r:
                return list(await r.json())

        async def first_poll() -> bool:
            return len(await judged()) == len(links)

        await eventually(first_poll, what="the first poll")
        await asyncio.sleep(2.0)  # some 20 polls at 0.1 s
        assert writes("verdict") == 0 and writes("sample") == 0
        assert {v["state"] for v in await judged()} == {"up"}
        async with store.pool.acquire() as conn:
            assert await conn.fetchval("SELECT count(*) FROM counter_ring") == 0
            assert await conn.fetchval("SELECT count(*) FROM link_health") == 0

        async with http.post(f"{svc.http_url}/v1/sim/faults", json={"link_id": links[0], "kind": "down"}) as r:
            assert r.status == 202

        async def sampled() -> bool:
            async with store.pool.acquire() as conn:
                return bool(await conn.fetchval("SELECT count(*) >= 10 FROM counter_ring"))

        await eventually(sampled, what="ten samples of the link that went down")
        async with store.pool.acquire() as conn:
            ring = await conn.fetch("SELECT link_id, count(*) AS n FROM counter_ring GROUP BY link_id")
            stored = await state.link_healths(conn)
        assert [r["link_id"] for r in ring] == [links[0]]
        assert writes("verdict") == 1  # the one that went down, once
        assert list(stored) == [links[0]] and stored[links[0]].state == "down"
