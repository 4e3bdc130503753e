"""The pool allocator's GPU gauges against real NATS and Postgres: GPUs per model and state, and the
schedulable capacity, as grants, a drain and a GPU failure change the ledger; both replicas report
the same pool; promtool passes every scrape."""

from __future__ import annotations

import msgspec

from ibpool_proto.health import DrainRequested, GpuFailed
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import GpuAssignment
from ibpool_runtime.bus import Bus
from ibpool_runtime.store import Store
from tests.integration.helpers import eventually
from tests.integration.metrics_support import Scrape, scrape
from tests.integration.pool_support import unique
from tests.integration.test_pool_allocator import pool_node, propose, running_allocator

STATES = ("free", "allocated", "cordoned", "draining", "failed")


def node_of(node_id: str, model: str) -> NodeRegistered:
    gpus = [GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model=model, memory_mib=81_920) for i in range(4)]
    return NodeRegistered(
        source="test",
        key=node_id,
        node_id=node_id,
        hostname=node_id,
        cpu_milli=64_000,
        memory_mib=512_000,
        gpus=gpus,
        backend="test",
    )


def gpus(s: Scrape, model: str) -> dict[str, float | None]:
    return {state: s.value("ibpool_pool_gpus", model=model, state=state) for state in STATES}


async def test_gpus_per_state_follow_grants_a_drain_and_a_failed_gpu(bus: Bus, store: Store) -> None:
    model = unique("GPU-")  # a model of this test's own: the pool holds only its nodes
    one, two = unique("n"), unique("n")
    async with (
        running_allocator(bus, store) as (service, allocator),
        running_allocator(bus, store, instance="second") as (second, _),
    ):
        url = service.http_url
        assert url is not None and second.http_url is not None
        for n in (one, two):
            await bus.publish(node_of(n, model))

        async def registered() -> bool:
            return all([await pool_node(service, n) is not None for n in (one, two)])

        await eventually(registered, what="both nodes in the ledger")
        s = await scrape(url)
        assert gpus(s, model) == {"free": 8.0, "allocated": 0.0, "cordoned": 0.0, "draining": 0.0, "failed": 0.0}
        assert s.value("ibpool_pool_capacity_gpus", model=model) == 8.0
        assert s.value("ibpool_service_leader", service="pool_allocator") == 1.0  # no election: every replica

        # A whole GPU on `one`, a quarter of one on `two`.
        version = allocator.ledger.version
        quarter = msgspec.structs.replace(
            propose(unique("j"), two, 0, version), assignments=[GpuAssignment(node_id=two, gpu_index=0, milli=250)]
        )
        for proposal in (propose(unique("j"), one, 0, version), quarter):
            await bus.publish(proposal)

        async def granted() -> bool:
            return (await scrape(url)).value("ibpool_pool_gpus", model=model, state="allocated") == 1.25

        await eventually(granted, what="1.25 GPUs allocated")
        s = await scrape(url)
        assert gpus(s, model) == {"free": 6.75, "allocated": 1.25, "cordoned": 0.0, "draining": 0.0, "failed": 0.0}
        assert s.value("ibpool_pool_capacity_gpus", model=model) == 8.0
        assert s.value("ibpool_pool_capacity_milli", model=model) == 8000.0  # the older gauge, in milli

        # `two` drains (its quarter GPU included: the whole node is draining), a free GPU of `one` fails.
        await bus.publish(DrainRequested(source="test", key=two, node_id=two, reason="maintenance"))
        await bus.publish(GpuFailed(source="test", key=one, node_id=one, gpu_index=3, reason="xid 79", xid=79))

        async def drained_and_failed() -> bool:
            s = await scrape(url)
            return (
                s.value("ibpool_pool_gpus", model=model, state="draining"),
                s.value("ibpool_pool_gpus", model=model, state="failed"),
            ) == (4.0, 1.0)

        await eventually(drained_and_failed, what="4 GPUs draining, 1 failed")
        s = await scrape(url)
        want = {"free": 2.0, "allocated": 1.0, "cordoned": 0.0, "draining": 4.0, "failed": 1.0}
        assert gpus(s, model) == want
        assert s.value("ibpool_pool_capacity_gpus", model=model) == 3.0  # without the draining and failed

        # The other replica reports the same pool once its cache caught up (its lease expiry does that).
        async def same_on_the_other_replica() -> bool:
            assert second.http_url is not None
            return gpus(await scrape(second.http_url), model) == want

        await eventually(same_on_the_other_replica, what="the second replica reporting the same pool")
        other = await scrape(second.http_url)
        assert other.value("ibpool_pool_capacity_gpus", model=model) == 3.0
        assert other.value("ibpool_pool_ledger_version") == s.value("ibpool_pool_ledger_version")
