"""The scheduler's job gauges against real NATS and Postgres, with the pool allocator and simulated
node agents: jobs per state, waiting jobs per queue and tenant, the oldest wait and the wait
histogram as two jobs compete for one node; only the leader reports its picture of the jobs, and
promtool passes every scrape."""

from __future__ import annotations

import uuid
from typing import Any

from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store
from tests.integration.helpers import eventually
from tests.integration.metrics_support import Scrape, scrape
from tests.integration.test_scheduler import (
    call,
    job_id,
    job_state,
    own_replica_store,
    pool_of,
    running_scheduler,
    until_leading,
)


def waits(s: Scrape, queue: str) -> float:
    return s.value("ibpool_scheduler_wait_seconds_count", queue=queue) or 0.0


async def test_jobs_and_waits_by_state_queue_and_tenant_from_the_leader_only(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    async with (
        pool_of(bus, stack, nodes=1) as pool,
        running_scheduler(bus, store, pool.from_seq, leader_key=f"sched-{pool.prefix}") as (leader, sched),
    ):
        await until_leading(sched, pool.node_ids)
        assert leader.http_url is not None
        url = leader.http_url
        first, second = job_id(), job_id()
        body: dict[str, Any] = {
            "queue": queue,
            "gpus": 8,
            "time_limit_s": 3600,
            "workload": {"simulated_runtime_s": 600},
        }
        assert (await call(leader, "POST", "/v1/jobs", {**body, "id": first, "tenant": "a"}))[0] == 201

        async def running(j: str) -> bool:
            return bool((await job_state(leader, j))["state"] == "running")

        await eventually(lambda: running(first), what="the first job running")
        assert (await call(leader, "POST", "/v1/jobs", {**body, "id": second, "tenant": "b"}))[0] == 201

        async def one_runs_one_waits() -> bool:
            s = await scrape(url)
            return (
                s.value("ibpool_scheduler_jobs", state="running"),
                s.value("ibpool_scheduler_jobs", state="queued"),
            ) == (
                1.0,
                1.0,
            )

        await eventually(one_runs_one_waits, what="one job running and one queued in the gauges")
        s = await scrape(url)
        assert s.value("ibpool_scheduler_jobs", state="proposed") == 0.0
        assert s.value("ibpool_scheduler_jobs", state="scheduled") == 0.0
        assert s.value("ibpool_scheduler_queue_jobs", queue=queue, tenant="b") == 1.0
        assert s.value("ibpool_scheduler_queue_jobs", queue=queue, tenant="a") is None  # granted: not waiting
        oldest = s.value("ibpool_scheduler_oldest_wait_seconds", queue=queue)
        assert oldest is not None and oldest > 0.0
        assert waits(s, queue) == 1.0  # the first job's grant
        assert s.value("ibpool_scheduler_wait_seconds_bucket", queue=queue, le="+Inf") == 1.0
        assert s.value("ibpool_service_leader", service="scheduler") == 1.0

        async with (
            own_replica_store(stack, store) as standby_store,
            running_scheduler(
                bus, standby_store, pool.from_seq, leader_key=f"sched-{pool.prefix}", instance="standby"
            ) as (standby, standby_sched),
        ):
            assert standby.http_url is not None and not standby_sched.is_leader
            s = await scrape(standby.http_url)
            assert s.value("ibpool_service_leader", service="scheduler") == 0.0
            for name in (
                "ibpool_scheduler_jobs",
                "ibpool_scheduler_queue_jobs",
                "ibpool_scheduler_oldest_wait_seconds",
            ):
                assert name not in s.samples, name  # a standby's picture is not kept current

            # The first job ends: the second is granted. Either replica may handle that grant.
            assert (await call(leader, "DELETE", f"/v1/jobs/{first}"))[0] == 200

            standby_url = standby.http_url

            async def second_granted() -> bool:
                return waits(await scrape(url), queue) + waits(await scrape(standby_url), queue) == 2.0

            await eventually(second_granted, what="the second job's wait observed")

        async def none_waits() -> bool:
            s = await scrape(url)
            return (
                s.value("ibpool_scheduler_jobs", state="queued") == 0.0
                and s.samples.get("ibpool_scheduler_queue_jobs") is None
            )

        await eventually(none_waits, what="no job waiting in the gauges")
        s = await scrape(url)
        assert s.value("ibpool_scheduler_oldest_wait_seconds", queue=queue) == 0.0
        live = sum(s.value("ibpool_scheduler_jobs", state=state) or 0.0 for state in ("scheduled", "running"))
        assert live == 1.0  # the cancelled one is no longer live
        assert s.value("ibpool_scheduler_jobs", state="cancelled") is None  # ended jobs are not gauged
