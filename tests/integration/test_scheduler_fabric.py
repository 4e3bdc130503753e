"""The scheduler places on the fabric the fabric monitor publishes, against real NATS and Postgres.

A 3-tier rail-optimised fabric (8 DGX hosts, 2 rails, scalable units of 2, radix 4: tier-1 groups
of 2 hosts, tier-2 groups of 4, tier 3 all 8) is published by a running fabric monitor; one node
agent per host, the pool allocator and the scheduler run in-process. Every placement is checked
against the fabric's own `FabricIndex.covering_subtree`; SHARP trees are reserved and released;
a degraded leaf uplink moves the next gang away; a new topology version is followed live.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.model import Topology, build_topology, rename_hosts
from ibpool_core.sched.sharp import SharpLimits
from ibpool_fabric_monitor.bootstrap import bootstrap as monitor_bootstrap
from ibpool_fabric_monitor.config import FabricMonitorConfig
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store
from ibpool_scheduler.config import SchedulerConfig
from ibpool_scheduler.service import Scheduler
from tests.integration.agent_support import running_agent, unique_prefix
from tests.integration.helpers import eventually, own_store
from tests.integration.test_scheduler import (
    call,
    job_id,
    job_state,
    pool_stream_next,
    running_allocator,
    running_scheduler,
    until_leading,
)

SPEC = "rail_optimised:hosts=8,rails=2,su_size=2,radix=4"
LONG = {"simulated_runtime_s": 600}


@dataclass
class FabricCluster:
    service: Service[SchedulerConfig]
    sched: Scheduler
    monitor: Service[Any]
    node_ids: list[str]
    topologies: list[Topology]  # what the fabric monitor discovers next: [0]

    @property
    def index(self) -> FabricIndex:
        return FabricIndex(self.topologies[0])

    def tier_of(self, hosts: list[str]) -> int:
        sub = self.index.covering_subtree(hosts)
        assert sub is not None, hosts
        return sub.level


@asynccontextmanager
async def fabric_cluster(bus: Bus, store: Store, stack: StackInfo, **scheduler: Any) -> AsyncIterator[FabricCluster]:
    prefix = unique_prefix()
    base = generate(SPEC)
    names = {h.name: f"{prefix}-{i:03d}" for i, h in enumerate(base.hosts, start=1)}
    fabric = rename_hosts(base, names)
    fabric = build_topology(
        name=f"fabric-{prefix}", hosts=fabric.hosts, cas=fabric.cas, switches=fabric.switches, links=fabric.links
    )
    topologies = [fabric]
    node_ids = sorted(names.values())
    async with AsyncExitStack() as stack_:
        cfg = FabricMonitorConfig(
            instance=f"fm-{prefix}",
            poll_interval_s=0.1,
            errors_per_s=5,
            clear_after_s=0.5,
            rediscover_interval_s=0.3,
        )
        kit = Kit(
            name="fabric_monitor",
            config=cfg,
            bus=bus,
            store=await stack_.enter_async_context(own_store(stack)),
            metrics=ServiceMetrics("fabric_monitor"),
        )
        monitor = Service(kit, await monitor_bootstrap(kit, load_topology=lambda: topologies[0]))
        await monitor.start()
        stack_.push_async_callback(monitor.stop)
        from_seq = await pool_stream_next(bus)
        for i in range(1, len(node_ids) + 1):
            agent_store = await stack_.enter_async_context(own_store(stack))
            await stack_.enter_async_context(running_agent(bus, agent_store, nodes=1, node_prefix=prefix, first_node=i))
        await stack_.enter_async_context(running_allocator(bus, await stack_.enter_async_context(own_store(stack))))
        service, sched = await stack_.enter_async_context(
            running_scheduler(bus, store, from_seq, leader_key=f"sched-{prefix}", **scheduler)
        )
        await until_leading(sched, node_ids)

        async def fabric_in_force() -> bool:
            about = sched.fabric.about
            return about is not None and about.name == fabric.name and about.hosts == len(node_ids)

        await eventually(fabric_in_force, what="the published fabric in force at the scheduler")
        yield FabricCluster(service, sched, monitor, node_ids, topologies)


async def submit(c: FabricCluster, hosts: int, gpus_per_host: int, constraint: str, level: int) -> str:
    j = job_id()
    body = {
        "id": j,
        "tenant": "t",
        "hosts": hosts,
        "gpus_per_host": gpus_per_host,
        "topology": {"constraint": constraint, "level": level},
        "workload": LONG,
    }
    status, view = await call(c.service, "POST", "/v1/jobs", body)
    assert status == 201, view
    return j


async def until_state(c: FabricCluster, j: str, *states: str) -> dict[str, Any]:
    async def reached() -> bool:
        return (await job_state(c.service, j))["state"] in states

    await eventually(reached, what=f"job {j} {' or '.join(states)}")
    return await job_state(c.service, j)


async def until_reason(c: FabricCluster, j: str, text: str) -> dict[str, Any]:
    async def said() -> bool:
        return text in (await job_state(c.service, j))["reason"]

    await eventually(said, what=f"job {j} waiting with a reason naming {text!r}")
    return await job_state(c.service, j)


async def cancel_and_release(c: FabricCluster, j: str) -> None:
    """Cancel `j` and wait until the scheduler's ledger replica no longer shows its allocation."""
    allocation = (await job_state(c.service, j))["allocation_id"]
    status, _ = await call(c.service, "DELETE", f"/v1/jobs/{j}")
    assert status == 200

    async def released() -> bool:
        return allocation not in c.sched.feed.ledger.allocations

    await eventually(released, what=f"job {j}'s allocation released")


async def test_gangs_land_within_their_required_tier_and_one_that_cannot_waits_naming_it(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with fabric_cluster(bus, store, stack) as c:
        leaf = await submit(c, 2, 8, "required", 1)
        spine = await submit(c, 4, 8, "required", 2)
        placed = {j: await until_state(c, j, "scheduled", "running") for j in (leaf, spine)}
        for j, level in ((leaf, 1), (spine, 2)):
            placement = placed[j]["placement"]
            hosts = placement["ranks"]
            assert c.tier_of(hosts) <= level and placement["tier"] == c.tier_of(hosts), placement
            assert placement["fabric_version"] == c.sched.fabric.about.version  # type: ignore[union-attr]
        assert not set(placed[leaf]["nodes"]) & set(placed[spine]["nodes"])
        # 2 hosts are left, in two tier-1 groups or one: a 3-host tier-1 gang can never fit (groups hold 2)
        never = await submit(c, 3, 8, "required", 1)
        why = await until_reason(c, never, "leaf group (tier 1)")
        assert why["state"] == "queued", why


async def test_sharp_trees_are_reserved_for_a_gang_and_a_second_one_is_told_why_until_they_are_released(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    # The subnet runs 2 trees: the first 2-rail gang takes both.
    async with fabric_cluster(bus, store, stack, sharp_limits=SharpLimits(max_trees=2)) as c:
        first = await submit(c, 2, 8, "required", 1)
        one = (await until_state(c, first, "scheduled", "running"))["placement"]
        assert one["sharp"] is True and one["sharp_tree"]["trees"] == 2, one
        assert one["nccl_env"] == {"NCCL_COLLNET_ENABLE": "1", "SHARP_COLL_ENABLE_SAT": "1"}
        second = await submit(c, 2, 8, "required", 1)
        two = (await until_state(c, second, "scheduled", "running"))["placement"]
        assert two["sharp"] is False and two["nccl_env"] == {} and two["sharp_tree"] is None, two
        assert "runs 2 SHARP trees of at most 2" in two["sharp_reason"], two
        status, _ = await call(c.service, "DELETE", f"/v1/jobs/{first}")
        assert status == 200
        third = await submit(c, 2, 8, "required", 1)
        again = (await until_state(c, third, "scheduled", "running"))["placement"]
        assert again["sharp"] is True, again  # the first job's trees were released with it


async def test_a_degraded_leaf_uplink_moves_the_next_gang_and_a_new_version_is_followed_live(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with fabric_cluster(bus, store, stack) as c:
        # The same gang on the same free pool lands on the same hosts (checked twice); then their leaf degrades.
        probe = await submit(c, 2, 8, "preferred", 1)
        where = (await until_state(c, probe, "scheduled", "running"))["placement"]["ranks"]
        await cancel_and_release(c, probe)
        again = await submit(c, 2, 8, "preferred", 1)
        assert (await until_state(c, again, "scheduled", "running"))["placement"]["ranks"] == where
        await cancel_and_release(c, again)
        # degrade the uplink of the rail-0 leaf of the group the probe landed in
        index = c.index
        leaf = index.leaf_of(where[0], 0)
        uplink = next(
            lk.link_id
            for lk in c.topologies[0].links
            if leaf in (lk.a.guid, lk.b.guid) and {lk.a.guid, lk.b.guid} <= {s.guid for s in c.topologies[0].switches}
        )
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{c.monitor.http_url}/v1/sim/faults", json={"link_id": uplink, "kind": "errors", "value": 50}
            ) as r,
        ):
            assert r.status == 202, await r.text()

        async def seen() -> bool:
            return c.sched.fabric_feed.link_health().get(leaf) == "degraded"

        await eventually(seen, what="the scheduler seeing the leaf's uplink degraded")
        moved = await submit(c, 2, 8, "preferred", 1)
        hosts = (await until_state(c, moved, "scheduled", "running"))["placement"]["ranks"]
        assert not set(hosts) & set(where), (hosts, where)

        # a new version without one core switch: followed without a restart, and placements say so
        old = c.topologies[0]
        gone = next(s for s in old.switches if index.switch_tier(s.guid) == 3)
        c.topologies[0] = build_topology(
            name=old.name,
            hosts=old.hosts,
            cas=old.cas,
            switches=[s for s in old.switches if s.guid != gone.guid],
            links=[lk for lk in old.links if gone.guid not in (lk.a.guid, lk.b.guid)],
        )

        async def followed() -> bool:
            about = c.sched.fabric.about
            return about is not None and about.switches == len(old.switches) - 1

        await eventually(followed, what="the new topology version in force at the scheduler")
        version = c.sched.fabric.about.version  # type: ignore[union-attr]
        assert version is not None and version >= 2
        after = await submit(c, 2, 8, "required", 1)
        placement = (await until_state(c, after, "scheduled", "running"))["placement"]
        assert placement["fabric_version"] == version and c.tier_of(placement["ranks"]) == 1
