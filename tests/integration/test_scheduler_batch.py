"""Batched proposals against real NATS and Postgres: one ProposePlacements command carries a cycle's
placements; the pool allocator answers each as if it came alone, and fences the batch by its term."""

from __future__ import annotations

import uuid

from ibpool_proto import decode
from ibpool_proto.pool import (
    AllocationGranted,
    AllocationRejected,
    GpuAssignment,
    PlacementItem,
    ProposePlacement,
    ProposePlacements,
)
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store
from tests.integration.helpers import eventually, stream_messages
from tests.integration.test_scheduler import call, cluster, job_id, job_state, pool_of


async def answers(bus: Bus, job: str) -> list[AllocationGranted | AllocationRejected]:
    out = []
    for t in (AllocationGranted, AllocationRejected):
        for m in await stream_messages(bus.js, "IBPOOL_POOL", t.subject_pattern()):
            ev = decode(m.data)
            if isinstance(ev, AllocationGranted | AllocationRejected) and ev.job_id == job:
                out.append(ev)
    return out


def item(job: str, node: str, gpus: range) -> PlacementItem:
    return PlacementItem(
        id=str(uuid.uuid4()),
        job_id=job,
        tenant="t",
        queue="q",
        assignments=[GpuAssignment(node_id=node, gpu_index=g) for g in gpus],
        lease_s=60,
    )


async def test_a_batch_is_answered_placement_by_placement_and_fenced_as_a_whole(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with pool_of(bus, stack, nodes=1) as pool:
        (node,) = pool.node_ids
        group = f"g-{pool.prefix}"

        async def version() -> int:
            _, view = await call(pool.allocator, "GET", "/v1/pool")
            return int(view["ledger_version"])

        async def registered() -> bool:
            return await version() > 0

        await eventually(registered, what="the node in the allocator's ledger")
        a, b, c = job_id(), job_id(), job_id()
        batch = ProposePlacements(
            source="test",
            key=group,
            ledger_version=await version(),
            scheduler_group=group,
            fencing_term=5,
            placements=[item(a, node, range(0, 4)), item(b, node, range(4, 8)), item(c, node, range(0, 1))],
        )
        await bus.publish(batch)

        async def all_answered() -> bool:
            return all([await answers(bus, j) for j in (a, b, c)])

        await eventually(all_answered, what="every placement of the batch answered")
        (ga,), (gb,), (rc,) = [await answers(bus, j) for j in (a, b, c)]
        assert isinstance(ga, AllocationGranted) and ga.allocation_id == batch.placements[0].id
        assert isinstance(gb, AllocationGranted) and ga.fencing_term == 5
        # the third wants a GPU the first got in the same batch: refused as a single proposal would be
        assert isinstance(rc, AllocationRejected) and rc.reason == "conflict", rc
        assert rc.command_id == batch.placements[2].id

        # A batch of an older term of the same group: every placement stale.
        d, e = job_id(), job_id()
        old = ProposePlacements(
            source="test",
            key=group,
            ledger_version=await version(),
            scheduler_group=group,
            fencing_term=4,
            placements=[item(d, node, range(0, 1)), item(e, node, range(1, 2))],
        )
        await bus.publish(old)

        async def stale_answered() -> bool:
            return all([await answers(bus, j) for j in (d, e)])

        await eventually(stale_answered, what="the stale batch answered")
        for j in (d, e):
            (r,) = await answers(bus, j)
            assert isinstance(r, AllocationRejected) and r.reason == "stale" and "fenced" in r.detail, r


async def test_a_cycle_proposes_its_placements_in_one_command(bus: Bus, store: Store, stack: StackInfo) -> None:
    async with cluster(bus, store, stack, nodes=2, cycle_debounce_s=0.3) as (service, sched, _allocator, _nodes):
        jobs = [job_id() for _ in range(4)]
        for j in jobs:
            body = {"id": j, "tenant": "t", "gpus": 2, "workload": {"simulated_runtime_s": 30}}
            assert (await call(service, "POST", "/v1/jobs", body))[0] == 201

        async def all_placed() -> bool:
            return all([(await job_state(service, j))["state"] in ("scheduled", "running") for j in jobs])

        await eventually(all_placed, what="every job granted")
        batches = [
            decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_POOL", ProposePlacements.subject(sched.group))
        ]
        carried = [p.job_id for b in batches if isinstance(b, ProposePlacements) for p in b.placements]
        singles = [j for j in jobs if await stream_messages(bus.js, "IBPOOL_POOL", ProposePlacement.subject(j))]
        assert sorted(carried + singles) == sorted(jobs)  # each proposed exactly once
        assert any(len(b.placements) > 1 for b in batches if isinstance(b, ProposePlacements)), batches
        for b in batches:
            assert isinstance(b, ProposePlacements) and b.fencing_term == sched.leadership.term  # type: ignore[union-attr]
        for j in jobs:
            await call(service, "DELETE", f"/v1/jobs/{j}")
