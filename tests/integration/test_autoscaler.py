"""The autoscaler against real NATS and Postgres, with the scheduler, the pool allocator and a simulated node
agent in-process: a load ramp published as metric events scales a deployment up (replica jobs submitted,
scheduled, started on the agent), the load drop scales it down after the stabilisation window (replica jobs
cancelled), and a restart of the autoscaler neither submits a replica twice nor forgets one. Batch elasticity:
an elastic training job grows into the idle GPUs, shrinks so that a higher-priority job starts, and grows back
after it finished."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any

from ibpool_autoscaler.bootstrap import bootstrap as autoscaler_bootstrap
from ibpool_autoscaler.config import AutoscalerConfig
from ibpool_proto import decode
from ibpool_proto.job import CancelJob, JobFinished, JobStarted, SubmitJob
from ibpool_proto.scale import DeploymentMetricsReported, ElasticJobResized, ScaleDecided
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store
from tests.integration.agent_support import running_agent, unique_prefix
from tests.integration.helpers import eventually, own_store, stream_messages
from tests.integration.test_scheduler import (
    call,
    cluster,
    job_state,
    pool_stream_next,
    running_allocator,
    running_scheduler,
    until_leading,
)

AUTOSCALER_DURABLES = "autoscaler-test"
SCALE_DOWN_WINDOW_S = 3.0


@asynccontextmanager
async def running_autoscaler(
    bus: Bus, store: Store, leader_key: str, pool_from_seq: int | None = None
) -> AsyncIterator[Service[AutoscalerConfig]]:
    cfg = AutoscalerConfig(
        instance="test",
        durable_prefix=AUTOSCALER_DURABLES,
        interval_s=0.25,
        leader_key=leader_key,
        leader_ttl_s=1.0,
    )
    kit = Kit(name="autoscaler", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("autoscaler"))
    if pool_from_seq is None:
        # Not the ledger snapshot another test's allocator left in the shared bus: only what comes next.
        pool_from_seq = (await bus.js.stream_info("IBPOOL_POOL")).state.last_seq + 1
    service = Service(kit, await autoscaler_bootstrap(kit, pool_from_seq=pool_from_seq))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


class LoadReporter:
    """What an ingress would do: report the deployment's request rate every `period_s`."""

    def __init__(self, bus: Bus, deployment: str, period_s: float = 0.2) -> None:
        self.bus, self.deployment, self.period_s = bus, deployment, period_s
        self.requests_per_s = 0.0

    async def run(self) -> None:
        while True:
            await self.bus.publish(
                DeploymentMetricsReported(
                    source="load-test",
                    key=self.deployment,
                    deployment=self.deployment,
                    requests_per_s=self.requests_per_s,
                )
            )
            await asyncio.sleep(self.period_s)


async def deployment(service: Service[Any], name: str) -> dict[str, Any]:
    status, view = await call(service, "GET", f"/v1/deployments/{name}")
    assert status == 200, view
    return dict(view)


async def scale_events(bus: Bus, name: str) -> list[ScaleDecided]:
    out = [decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_SCALE", ScaleDecided.subject(name))]
    return sorted((e for e in out if isinstance(e, ScaleDecided)), key=lambda e: e.occurred_at)


async def submitted(bus: Bus, name: str) -> list[str]:
    msgs = [decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_JOB", SubmitJob.subject_pattern())]
    return [m.job_id for m in msgs if isinstance(m, SubmitJob) and m.job_id.startswith(f"{name}-r")]


def deployment_body(tenant: str = "inference") -> dict[str, Any]:
    return {
        "tenant": tenant,
        "min_replicas": 1,
        "max_replicas": 4,
        "gpus": 1,
        "targets": {"requests_per_s": 10},
        "policy": "reactive",
        # Short windows for the test; the HPA's defaults are minutes.
        "reactive": {
            "metric_window_s": 1.0,
            "scale_down_window_s": SCALE_DOWN_WINDOW_S,
            "down_percent": 100.0,
            "down_period_s": 1.0,
        },
    }


async def test_load_ramp_scales_up_then_down_after_the_window(bus: Bus, store: Store, stack: StackInfo) -> None:
    name = f"chat-{uuid.uuid4().hex[:6]}"
    async with (
        cluster(bus, store, stack, nodes=1) as (scheduler, _sched, _allocator, _nodes),
        own_store(stack) as autoscaler_store,
        running_autoscaler(bus, autoscaler_store, f"autoscaler-{name}") as autoscaler,
    ):
        status, err = await call(autoscaler, "PUT", f"/v1/deployments/{name}", {**deployment_body(), "gpus": 0})
        assert status == 400 and err["path"] == "$.gpus", err
        status, err = await call(autoscaler, "PUT", f"/v1/deployments/{name}", {**deployment_body(), "min_replicas": 9})
        assert status == 422 and err["path"] == "$.min_replicas", err
        status, view = await call(autoscaler, "PUT", f"/v1/deployments/{name}", deployment_body())
        assert status == 201 and view["spec"]["max_replicas"] == 4, view

        async def ready(n: int) -> bool:
            r = (await deployment(autoscaler, name))["replicas"]
            return bool(r["ready"] == n and r["starting"] == 0 and r["wanted"] == n)

        await eventually(lambda: ready(1), what="the minimum replica ready")
        reporter = LoadReporter(bus, name)
        reporting = asyncio.create_task(reporter.run())
        try:
            reporter.requests_per_s = 5.0
            await asyncio.sleep(0.5)
            for rps in (15.0, 25.0, 35.0):  # 35 req/s at 10 per replica: 4 replicas
                reporter.requests_per_s = rps
                await asyncio.sleep(0.4)
            await eventually(lambda: ready(4), what="4 replicas ready")
            view = await deployment(autoscaler, name)
            jobs = [r["job_id"] for r in view["replica_jobs"]]
            assert sorted(jobs) == sorted(f"{name}-r{i}" for i in range(1, 5))

            async def all_running() -> bool:
                # The scheduler hears JobStarted through its own consumer, maybe after the autoscaler did.
                return all([(await job_state(scheduler, j))["state"] == "running" for j in jobs])

            await eventually(all_running, what="the 4 replica jobs running at the scheduler")
            assert view["last_decision"]["reason"]

            reporter.requests_per_s = 5.0
            await eventually(lambda: ready(1), timeout_s=20, what="scaled back down to 1 replica")
        finally:
            reporting.cancel()
            with suppress(asyncio.CancelledError):
                await reporting

        events = await scale_events(bus, name)
        ups = [e for e in events if e.target_replicas > e.current_replicas]
        downs = [e for e in events if e.target_replicas < e.current_replicas]
        assert ups and max(e.target_replicas for e in ups) == 4 and all(e.reason for e in ups)
        assert downs and downs[-1].target_replicas == 1
        # Scaling down waits out the stabilisation window after the last recommendation of 4 replicas
        # (the last up decision or later), never earlier.
        assert (downs[0].occurred_at - ups[-1].occurred_at).total_seconds() >= SCALE_DOWN_WINDOW_S
        (survivor,) = (await deployment(autoscaler, name))["replica_jobs"]
        removed = sorted(set(jobs) - {survivor["job_id"]})
        assert len(removed) == 3

        async def cancelled() -> bool:
            states = [(await job_state(scheduler, j))["state"] for j in removed]
            return states == ["cancelled"] * len(removed)

        await eventually(cancelled, what="the removed replicas cancelled at the scheduler")
        # Each replica job was submitted once, and only the removed ones cancelled.
        assert sorted(await submitted(bus, name)) == sorted(jobs)

        status, gone = await call(autoscaler, "DELETE", f"/v1/deployments/{name}")
        assert status == 200 and gone["cancelled"] == [survivor["job_id"]], gone

        async def all_finished() -> bool:
            msgs = await stream_messages(bus.js, "IBPOOL_JOB", JobFinished.subject_pattern())
            done = {e.job_id for e in map(decode, (m.data for m in msgs)) if isinstance(e, JobFinished)}
            return set(jobs) <= done

        await eventually(all_finished, what="every replica job finished")
        status, _ = await call(autoscaler, "GET", f"/v1/deployments/{name}")
        assert status == 404


async def test_restart_resumes_without_submitting_twice(bus: Bus, store: Store, stack: StackInfo) -> None:
    name = f"embed-{uuid.uuid4().hex[:6]}"
    async with (
        cluster(bus, store, stack, nodes=1) as (_scheduler, _sched, _allocator, _nodes),
        own_store(stack) as autoscaler_store,
    ):
        reporter = LoadReporter(bus, name)
        reporter.requests_per_s = 25.0  # 3 replicas
        reporting = asyncio.create_task(reporter.run())
        try:
            async with running_autoscaler(bus, autoscaler_store, f"autoscaler-{name}") as first:
                status, _ = await call(first, "PUT", f"/v1/deployments/{name}", deployment_body())
                assert status == 201

                async def three_submitted() -> bool:
                    return len((await deployment(first, name))["replica_jobs"]) == 3

                await eventually(three_submitted, what="3 replicas submitted")
            # The second instance takes over (the first resigned its leadership) from the stored state.
            async with running_autoscaler(bus, autoscaler_store, f"autoscaler-{name}") as second:

                async def three_ready() -> bool:
                    r = (await deployment(second, name))["replicas"]
                    return bool(r["ready"] == 3)

                await eventually(three_ready, what="3 replicas ready after the restart")
                await asyncio.sleep(1.0)  # a few more decisions of the new instance
                assert (await deployment(second, name))["replicas"]["ready"] == 3
        finally:
            reporting.cancel()
            with suppress(asyncio.CancelledError):
                await reporting
        ids = await submitted(bus, name)
        assert sorted(ids) == [f"{name}-r{i}" for i in (1, 2, 3)]
        msgs = await stream_messages(bus.js, "IBPOOL_JOB", JobStarted.subject_pattern())
        started = {e.job_id for e in map(decode, (m.data for m in msgs)) if isinstance(e, JobStarted)}
        assert set(ids) <= started
        cancels = await stream_messages(bus.js, "IBPOOL_JOB", CancelJob.subject_pattern())
        assert not [m for m in map(decode, (c.data for c in cancels)) if getattr(m, "job_id", "").startswith(name)]


async def elastic_job(service: Service[Any], name: str) -> dict[str, Any]:
    status, view = await call(service, "GET", f"/v1/elastic-jobs/{name}")
    assert status == 200, view
    return dict(view)


async def resizes(bus: Bus, name: str) -> list[ElasticJobResized]:
    out = [decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_SCALE", ElasticJobResized.subject(name))]
    return sorted((e for e in out if isinstance(e, ElasticJobResized)), key=lambda e: e.occurred_at)


async def test_elastic_job_grows_into_idle_gpus_shrinks_for_higher_priority_work_and_grows_back(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    name = f"train-{uuid.uuid4().hex[:6]}"
    urgent = f"urgent-{uuid.uuid4().hex[:6]}"
    async with (
        # One node of 8 GPUs; the scheduler orders by priority and never preempts: room is made by shrinking.
        cluster(bus, store, stack, nodes=1, policy="priority") as (scheduler, sched, _allocator, _nodes),
        own_store(stack) as autoscaler_store,
        running_autoscaler(bus, autoscaler_store, f"autoscaler-{name}", sched.feed.from_seq) as autoscaler,
    ):
        body = {"tenant": "research", "min_workers": 2, "max_workers": 8, "gpus_per_worker": 1, "priority": 0}
        status, err = await call(autoscaler, "PUT", f"/v1/elastic-jobs/{name}", {**body, "min_workers": 9})
        assert status == 422 and err["path"] == "$.min_workers", err
        status, err = await call(autoscaler, "PUT", f"/v1/elastic-jobs/{name}", {**body, "gpus_per_worker": 0})
        assert status == 400 and err["path"] == "$.gpus_per_worker", err
        status, view = await call(autoscaler, "PUT", f"/v1/elastic-jobs/{name}", body)
        assert status == 201 and view["spec"]["max_workers"] == 8, view

        async def running_workers(n: int) -> bool:
            w = (await elastic_job(autoscaler, name))["workers"]
            return bool(w == {"queued": 0, "running": n})

        await eventually(lambda: running_workers(8), what="the elastic job grown to 8 workers on 8 idle GPUs")
        first = [w["job_id"] for w in (await elastic_job(autoscaler, name))["worker_jobs"]]
        assert first == [f"{name}-w{i}" for i in range(1, 9)]

        async def at_scheduler(jobs: list[str], wanted: str) -> bool:
            return all([(await job_state(scheduler, j))["state"] == wanted for j in jobs])

        await eventually(lambda: at_scheduler(first, "running"), what="the 8 workers running at the scheduler")

        job = {"id": urgent, "tenant": "eval", "gpus": 4, "priority": 10, "workload": {"simulated_runtime_s": 3}}
        status, queued = await call(scheduler, "POST", "/v1/jobs", job)
        assert status == 201 and queued["state"] == "queued", queued

        async def urgent_started() -> bool:
            return (await job_state(scheduler, urgent))["state"] in ("running", "completed")

        await eventually(urgent_started, what="the higher-priority job started")
        view = await elastic_job(autoscaler, name)
        assert [w["job_id"] for w in view["worker_jobs"]] == first[:4], "the 4 newest workers gave way"
        await eventually(lambda: at_scheduler(first[4:], "cancelled"), what="the 4 newest workers cancelled")
        assert view["last_resize"]["workers_to"] == 4 and urgent in view["last_resize"]["reason"]

        async def urgent_done() -> bool:
            return (await job_state(scheduler, urgent))["state"] == "completed"

        await eventually(urgent_done, what="the higher-priority job completed")
        await eventually(lambda: running_workers(8), what="the elastic job grown back to 8 workers")

        events = await resizes(bus, name)
        assert [(e.workers_from, e.workers_to) for e in events] == [(0, 8), (8, 4), (4, 8)], events
        grown, shrunk, regrown = events
        assert grown.submitted == first and shrunk.cancelled == list(reversed(first[4:]))
        assert "shrunk for higher-priority " + urgent in shrunk.reason and "grown into 4 idle GPUs" in regrown.reason
        # Each worker job was submitted once, under a fresh number: none granted twice.
        mine = [j for j in await submitted_jobs(bus) if j.startswith(f"{name}-w")]
        assert sorted(mine) == sorted(set(mine)) and len(mine) == 12

        status, gone = await call(autoscaler, "DELETE", f"/v1/elastic-jobs/{name}")
        assert status == 200 and sorted(gone["cancelled"]) == sorted(first[:4] + regrown.submitted), gone
        await eventually(lambda: at_scheduler(gone["cancelled"], "cancelled"), what="every worker cancelled")
        status, _ = await call(autoscaler, "GET", f"/v1/elastic-jobs/{name}")
        assert status == 404


async def submitted_jobs(bus: Bus) -> list[str]:
    msgs = [decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_JOB", SubmitJob.subject_pattern())]
    return [m.job_id for m in msgs if isinstance(m, SubmitJob)]


LEAF = "ibpool.io/leaf"


@asynccontextmanager
async def leaf_cluster(
    bus: Bus, store: Store, stack: StackInfo, leaves: list[str], gpus: list[int]
) -> AsyncIterator[tuple[Service[Any], list[str]]]:
    """One agent per node (a gang needs one per member), node i under leaf `leaves[i]` with `gpus[i]`
    GPUs; the allocator and a leading scheduler that sees every node's leaf label."""
    prefix = unique_prefix()
    node_ids = [f"{prefix}-{i:03d}" for i in range(1, len(leaves) + 1)]
    async with AsyncExitStack() as stack_:
        from_seq = await pool_stream_next(bus)
        for i, (leaf, count) in enumerate(zip(leaves, gpus, strict=True), start=1):
            agent_store = await stack_.enter_async_context(own_store(stack))
            await stack_.enter_async_context(
                running_agent(
                    bus, agent_store, nodes=1, node_prefix=prefix, first_node=i, labels={LEAF: leaf},
                    gpus_per_node=count,
                )
            )  # fmt: skip
        await stack_.enter_async_context(running_allocator(bus, await stack_.enter_async_context(own_store(stack))))
        service, sched = await stack_.enter_async_context(
            running_scheduler(bus, store, from_seq, leader_key=f"sched-{prefix}")
        )
        await until_leading(sched, node_ids)

        async def labelled() -> bool:
            nodes = sched.feed.ledger.nodes
            return all(nodes[n].labels.get(LEAF) == leaf for n, leaf in zip(node_ids, leaves, strict=True))

        await eventually(labelled, what="every node's leaf label in the scheduler's ledger replica")
        yield service, node_ids


async def test_a_replica_spanning_two_hosts_is_placed_under_one_leaf_and_ready_once_both_started(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    name = f"tp-{uuid.uuid4().hex[:6]}"
    # leaf a: nodes 1 and 2 (8 GPUs each); leaf b: node 3 (4 GPUs). A blocker of 8 GPUs takes a leaf-a
    # node: the hosts with room for a 4-GPU member are then one under each leaf, and the replica waits
    # rather than span both.
    async with (
        leaf_cluster(bus, store, stack, ["a", "a", "b"], [8, 8, 4]) as (scheduler, node_ids),
        own_store(stack) as autoscaler_store,
        running_autoscaler(bus, autoscaler_store, f"autoscaler-{name}") as autoscaler,
    ):
        n1, n2, n3 = node_ids
        blocker = f"block-{name}"
        body = {"id": blocker, "tenant": "t", "gpus": 8, "workload": {"simulated_runtime_s": 600}}
        assert (await call(scheduler, "POST", "/v1/jobs", body))[0] == 201

        async def blocking() -> bool:
            job = await job_state(scheduler, blocker)
            return bool(job["state"] == "running" and job["nodes"] in ([n1], [n2]))

        await eventually(blocking, what="the blocker running on a leaf-a node")
        if (await job_state(scheduler, blocker))["nodes"] == [n1]:
            n1, n2 = n2, n1  # name the blocked one n2
        spec = {**deployment_body(), "min_replicas": 1, "max_replicas": 1, "gpus": 4, "hosts": 2}
        status, view = await call(autoscaler, "PUT", f"/v1/deployments/{name}", spec)
        assert status == 201 and view["spec"]["hosts"] == 2, view
        status, err = await call(autoscaler, "PUT", f"/v1/deployments/{name}", {**spec, "gpus": None, "fraction": 0.5})
        assert status == 422 and err["path"] == "$.hosts", err

        async def submitted_replica() -> bool:
            return bool((await deployment(autoscaler, name))["replica_jobs"])

        await eventually(submitted_replica, what="the replica submitted")
        replica = (await deployment(autoscaler, name))["replica_jobs"][0]["job_id"]

        async def queued_at_scheduler() -> bool:
            status, job = await call(scheduler, "GET", f"/v1/jobs/{replica}")
            return status == 200 and job["state"] == "queued" and bool(job["reason"])

        await eventually(queued_at_scheduler, what="the replica queued at the scheduler")
        await asyncio.sleep(1.0)  # several cycles: it must not be placed on n1 + n3 (two leaves)
        job = await job_state(scheduler, replica)
        assert job["state"] == "queued" and "under 1 leaves" in job["reason"], job
        assert (await deployment(autoscaler, name))["replicas"]["ready"] == 0

        await call(scheduler, "DELETE", f"/v1/jobs/{blocker}")

        async def ready() -> bool:
            r = (await deployment(autoscaler, name))["replicas"]
            return bool(r["ready"] == 1 and r["starting"] == 0)

        await eventually(ready, what="the replica ready on both hosts")
        [member] = (await deployment(autoscaler, name))["replica_jobs"]
        assert sorted(member["nodes"]) == sorted([n1, n2]) and member["hosts"] == 2, member
        assert sorted(member["started"]) == sorted([n1, n2]), member
        placed = await job_state(scheduler, replica)
        assert sorted(placed["nodes"]) == sorted([n1, n2]) and len(placed["assignments"]) == 8, placed
        status, gone = await call(autoscaler, "DELETE", f"/v1/deployments/{name}")
        assert status == 200 and gone["cancelled"] == [replica], gone
        assert n3 not in placed["nodes"]
