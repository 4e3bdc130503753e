"""The scheduler's placement plugins, fair share and per-queue policies against real NATS and Postgres,
with the pool allocator and simulated node agents in-process: a job avoids a busy node by its
telemetry; a job lands where its dataset is; a tenant over its fair share waits behind one under it;
each queue is ordered by its own policy, and GET /v1/queues says which."""

from __future__ import annotations

from ibpool_proto.job import JobScheduled
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store
from ibpool_scheduler.config import QueueConfig
from tests.integration.helpers import eventually
from tests.integration.test_scheduler import call, cluster, job_events, job_id, job_state

HOLDING = ("scheduled", "running", "completed")


async def submit(service: object, body: dict[str, object]) -> str:
    j = job_id()
    status, view = await call(service, "POST", "/v1/jobs", {"id": j, **body})  # type: ignore[arg-type]
    assert status == 201, view
    return j


async def until_state(service: object, j: str, states: tuple[str, ...], what: str) -> dict[str, object]:
    async def reached() -> bool:
        return (await job_state(service, j))["state"] in states  # type: ignore[arg-type]

    await eventually(reached, what=what)
    return await job_state(service, j)  # type: ignore[arg-type]


async def test_a_compute_heavy_job_avoids_the_node_its_telemetry_shows_busy(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with cluster(bus, store, stack, nodes=2) as (service, sched, _allocator, node_ids):
        busy = await submit(service, {"tenant": "t", "gpus": 4, "workload": {"simulated_runtime_s": 120}})
        view = await until_state(service, busy, ("running",), "the first job running")
        (hot,) = view["nodes"]  # type: ignore[misc]
        (cool,) = [n for n in node_ids if n != hot]

        async def hot_seen() -> bool:
            seen = sched.telemetry(sched.clock.now()).get(hot)
            return seen is not None and seen.gpu_util > 0.4

        await eventually(hot_seen, what="the busy node's telemetry reaching the scheduler")
        # Best fit alone would put 2 GPUs beside the running job (fewest free GPUs left); the load
        # plugin sends it to the idle node.
        second = await submit(service, {"tenant": "t", "gpus": 2, "workload": {"simulated_runtime_s": 120}})
        placed = await until_state(service, second, HOLDING, "the second job placed")
        assert placed["nodes"] == [cool], (placed, hot)
        for j in (busy, second):
            await call(service, "DELETE", f"/v1/jobs/{j}")


async def test_a_job_lands_on_the_node_that_holds_its_dataset(bus: Bus, store: Store, stack: StackInfo) -> None:
    async with cluster(bus, store, stack, nodes=3) as (service, _sched, _allocator, node_ids):
        holder = node_ids[2]
        status, body = await call(service, "PUT", "/v1/datasets/imagenet-1k", {"nodes": [holder]})
        assert status == 200 and body["nodes"] == [holder], body
        status, registry = await call(service, "GET", "/v1/datasets")
        assert registry["imagenet-1k"] == [holder]
        status, err = await call(service, "PUT", "/v1/datasets/imagenet-1k", {"nodes": "all"})
        assert status == 400 and err["path"] == "$.nodes", err

        j = await submit(
            service,
            {"tenant": "t", "gpus": 2, "dataset": "imagenet-1k", "workload": {"simulated_runtime_s": 60}},
        )
        placed = await until_state(service, j, HOLDING, "the job with a dataset placed")
        assert placed["nodes"] == [holder], placed
        # (on idle, equal nodes without the dataset it would take the first one by name: see the unit tests)
        await call(service, "DELETE", f"/v1/jobs/{j}")


async def test_a_tenant_over_its_fair_share_waits_behind_a_tenant_under_it(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with cluster(bus, store, stack, nodes=1, policy="priority") as (service, _sched, _allocator, _nodes):
        first = await submit(service, {"tenant": "heavy", "gpus": 8, "workload": {"simulated_runtime_s": 3}})
        await until_state(service, first, ("running",), "the heavy tenant's first job running")
        # Submitted while the node is full: the heavy tenant's second job first, then the light tenant's.
        again = await submit(service, {"tenant": "heavy", "gpus": 8, "workload": {"simulated_runtime_s": 60}})
        light = await submit(service, {"tenant": "light", "gpus": 8, "workload": {"simulated_runtime_s": 60}})
        await until_state(service, light, HOLDING, "the light tenant's job placed")
        waiting = await job_state(service, again)
        assert waiting["state"] == "queued", waiting
        _, queues = await call(service, "GET", "/v1/queues")
        assert queues["fairshare"]["light"] > queues["fairshare"]["heavy"], queues
        (scheduled,) = await job_events(bus, light, JobScheduled)
        assert scheduled.job_id == light
        for j in (again, light):
            await call(service, "DELETE", f"/v1/jobs/{j}")


async def test_each_queue_has_its_own_policy(bus: Bus, store: Store, stack: StackInfo) -> None:
    policies = {"short-first": QueueConfig(policy="sjf"), "strict": QueueConfig(policy="fifo", backfill="none")}
    async with cluster(bus, store, stack, nodes=1, policy="fifo", queue_policies=policies) as (
        service,
        _sched,
        _allocator,
        _nodes,
    ):
        _, queues = await call(service, "GET", "/v1/queues")
        by_queue = {q["queue"]: q for q in queues["queues"]}
        assert (by_queue["short-first"]["policy"], by_queue["short-first"]["backfill"]) == ("sjf", "easy")
        assert (by_queue["strict"]["policy"], by_queue["strict"]["backfill"]) == ("fifo", "none")

        blocker = await submit(
            service, {"tenant": "t", "queue": "short-first", "gpus": 8, "workload": {"simulated_runtime_s": 3}}
        )
        await until_state(service, blocker, ("running",), "the blocker running")
        long = await submit(
            service,
            {
                "tenant": "t",
                "queue": "short-first",
                "gpus": 8,
                "time_limit_s": 3600,
                "workload": {"simulated_runtime_s": 60},
            },
        )
        short = await submit(
            service,
            {
                "tenant": "t",
                "queue": "short-first",
                "gpus": 8,
                "time_limit_s": 600,
                "workload": {"simulated_runtime_s": 60},
            },
        )
        # sjf in this queue: the shorter limit goes first although submitted later
        await until_state(service, short, HOLDING, "the short job placed first")
        assert (await job_state(service, long))["state"] == "queued"
        _, queues = await call(service, "GET", "/v1/queues")
        by_queue = {q["queue"]: q for q in queues["queues"]}
        assert by_queue["short-first"]["queued"] == 1 and by_queue["short-first"]["policy"] == "sjf"
        for j in (long, short):
            await call(service, "DELETE", f"/v1/jobs/{j}")
