"""The scheduler against real NATS and Postgres, with the pool allocator and simulated node agents in-process:
submit -> queued -> proposed -> granted -> started -> finished; gangs; competition for the last GPUs;
requeue after a node failure; leader failover between two replicas; a deposed leader fenced."""

from __future__ import annotations

import datetime as dt
import urllib.parse
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import msgspec
import pytest

from ibpool_failover_controller.bootstrap import bootstrap as controller_bootstrap
from ibpool_failover_controller.config import FailoverControllerConfig
from ibpool_pool_allocator.bootstrap import bootstrap as allocator_bootstrap
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_proto import decode
from ibpool_proto.health import NodeFailed, RequeueRequested
from ibpool_proto.job import (
    CancelJob,
    JobExited,
    JobFinished,
    JobQueued,
    JobRequeued,
    JobScheduled,
    JobSpec,
    JobStarted,
    SubmitJob,
)
from ibpool_proto.pool import (
    AllocationGranted,
    AllocationRejected,
    AllocationReleased,
    GpuAssignment,
    ProposePlacement,
    ResourceRequest,
)
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store
from ibpool_scheduler import state as sched_state
from ibpool_scheduler.bootstrap import bootstrap as scheduler_bootstrap
from ibpool_scheduler.config import SchedulerConfig
from ibpool_scheduler.service import Scheduler
from tests.integration.agent_support import running_agent, unique_prefix
from tests.integration.helpers import eventually, job_news, own_store, stream_messages

# One durable name per service for every test: each test sees only what was published after the last one stopped.
ALLOCATOR_DURABLES = "pool-allocator-test"
SCHEDULER_DURABLES = "scheduler-test"


@asynccontextmanager
async def running_allocator(bus: Bus, store: Store) -> AsyncIterator[Service[PoolAllocatorConfig]]:
    cfg = PoolAllocatorConfig(instance="test", expiry_interval_s=0.2, durable_prefix=ALLOCATOR_DURABLES)
    kit = Kit(name="pool_allocator", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("pool_allocator"))
    service = Service(kit, await allocator_bootstrap(kit))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


@asynccontextmanager
async def running_scheduler(
    bus: Bus, store: Store, from_seq: int, **overrides: Any
) -> AsyncIterator[tuple[Service[SchedulerConfig], Scheduler]]:
    cfg = SchedulerConfig(
        **{
            "instance": "test",
            "durable_prefix": SCHEDULER_DURABLES,
            "leader_ttl_s": 1.0,
            "cycle_interval_s": 0.2,
            "policy": "fifo",
            **overrides,
        }
    )
    kit = Kit(name="scheduler", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("scheduler"))
    spec = await scheduler_bootstrap(kit, pool_from_seq=from_seq)
    scheduler = spec.tasks[0].__self__  # type: ignore[attr-defined]
    service = Service(kit, spec)
    await service.start()
    try:
        yield service, scheduler
    finally:
        await service.stop()


JSON = {"Content-Type": "application/json"}


async def pool_stream_next(bus: Bus) -> int:
    """The sequence the next pool message gets: where a ledger replica of a fresh allocator starts."""
    info = await bus.js.stream_info("IBPOOL_POOL")
    return info.state.last_seq + 1


async def call(service: Service[Any], method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = msgspec.json.encode(body) if body is not None else None
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, f"{service.http_url}{path}", data=data, headers=JSON) as r,
    ):
        return r.status, await r.json()


async def job_state(service: Service[Any], job_id: str) -> dict[str, Any]:
    status, view = await call(service, "GET", f"/v1/jobs/{job_id}")
    assert status == 200, view
    return dict(view)


async def job_events(bus: Bus, job_id: str, *types: type) -> list[Any]:
    out = []
    for t in types:
        if t in (JobStarted, JobExited):  # agents' news, keyed by node since v2
            out.extend(await job_news(bus.js, t, job_id))
        else:
            out.extend(decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_JOB", t.subject(job_id)))
    return sorted(out, key=lambda e: e.occurred_at)


def job_id() -> str:
    return f"j{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class Pool:
    allocator: Service[PoolAllocatorConfig]
    node_ids: list[str]
    from_seq: int
    prefix: str


@asynccontextmanager
async def pool_of(
    bus: Bus, stack: StackInfo, nodes: int, agent_per_node: bool = False, agent: dict[str, Any] | None = None
) -> AsyncIterator[Pool]:
    """Simulated 8-GPU nodes and a fresh allocator (its ledger replayed from `from_seq`). `agent_per_node`:
    one agent process per node, as gangs need (an agent keeps one workload per allocation id); `agent`:
    overrides of the agents' config."""
    prefix = unique_prefix()
    async with AsyncExitStack() as stack_:
        from_seq = await pool_stream_next(bus)
        for first, count in [(i, 1) for i in range(1, nodes + 1)] if agent_per_node else [(1, nodes)]:
            agent_store = await stack_.enter_async_context(own_store(stack))
            await stack_.enter_async_context(
                running_agent(bus, agent_store, nodes=count, node_prefix=prefix, first_node=first, **(agent or {}))
            )
        allocator_store = await stack_.enter_async_context(own_store(stack))
        allocator = await stack_.enter_async_context(running_allocator(bus, allocator_store))
        yield Pool(
            allocator=allocator,
            node_ids=[f"{prefix}-{i:03d}" for i in range(1, nodes + 1)],
            from_seq=from_seq,
            prefix=prefix,
        )


async def until_leading(sched: Scheduler, node_ids: list[str]) -> None:
    async def ready() -> bool:
        return sched.is_leader and sched.feed.caught_up and set(node_ids) <= set(sched.feed.ledger.nodes)

    await eventually(ready, what="the scheduler leading with every node in its ledger replica")


@asynccontextmanager
async def cluster(
    bus: Bus,
    store: Store,
    stack: StackInfo,
    nodes: int,
    agent_per_node: bool = False,
    agent: dict[str, Any] | None = None,
    **scheduler: Any,
) -> AsyncIterator[tuple[Service[SchedulerConfig], Scheduler, Service[PoolAllocatorConfig], list[str]]]:
    """A pool of `nodes` nodes and one scheduler leading, caught up with them."""
    async with (
        pool_of(bus, stack, nodes, agent_per_node, agent) as pool,
        running_scheduler(bus, store, pool.from_seq, leader_key=f"sched-{pool.prefix}", **scheduler) as (
            service,
            sched,
        ),
    ):
        await until_leading(sched, pool.node_ids)
        yield service, sched, pool.allocator, pool.node_ids


async def test_submitted_job_runs_to_completion_as_one_trace(bus: Bus, store: Store, stack: StackInfo) -> None:
    async with cluster(bus, store, stack, nodes=2) as (service, sched, allocator, node_ids):
        j = job_id()
        tenant = f"t-{j}"  # its own, so that the usage below is this job's alone
        body = {"id": j, "tenant": tenant, "gpus": 2, "workload": {"simulated_runtime_s": 0.3}}
        status, view = await call(service, "POST", "/v1/jobs", body)
        assert status == 201 and view["state"] == "queued", view

        async def completed() -> bool:
            return (await job_state(service, j))["state"] == "completed"

        await eventually(completed, what="the job completed")
        done = await job_state(service, j)
        assert done["nodes"][0] in node_ids and len(done["assignments"]) == 2 and done["exit_code"] == 0
        news = await job_events(bus, j, JobQueued, JobScheduled, JobStarted, JobExited)
        types = [type(e).__name__.removesuffix("V2") for e in news]  # the agents' news is v2 (keyed by node)
        # The agent starts the work and the scheduler marks the job scheduled on the same grant: either first.
        assert types[0] == "JobQueued" and types[-1] == "JobExited"
        assert sorted(types[1:3]) == ["JobScheduled", "JobStarted"]

        async def finished_and_released() -> bool:
            finished = await job_events(bus, j, JobFinished)
            _, held = await call(allocator, "GET", f"/v1/allocations?owner={j}")
            return len(finished) == 1 and held == []

        await eventually(finished_and_released, what="JobFinished and the allocation released")
        # Accounting: its 2 GPUs from the grant to the end, in GPU-hours, under its tenant and queue.
        held_s = dt.datetime.fromisoformat(done["finished_at"]) - dt.datetime.fromisoformat(done["scheduled_at"])
        since = urllib.parse.quote(done["submitted_at"])
        status, used = await call(service, "GET", f"/v1/usage?since={since}&by=tenant")
        assert status == 200, used
        [row] = [r for r in used["rows"] if r["tenant"] == tenant]
        assert row["queue"] is None and row["jobs"] == 1
        assert row["gpu_hours"] == pytest.approx(2 * held_s.total_seconds() / 3600) and row["gpu_hours"] > 0
        status, err = await call(service, "DELETE", f"/v1/jobs/{j}")
        assert status == 409 and "completed" in err["detail"], err
        (proposal,) = [
            decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_POOL", ProposePlacement.subject(j))
        ]
        assert isinstance(proposal, ProposePlacement)
        assert proposal.fencing_term is not None and proposal.scheduler_group == sched.cfg.leader_key


async def test_gang_of_two_hosts_is_placed_whole(bus: Bus, store: Store, stack: StackInfo) -> None:
    async with cluster(bus, store, stack, nodes=3, agent_per_node=True) as (service, _, _allocator, _nodes):
        j = job_id()
        body = {"id": j, "tenant": "t", "hosts": 2, "gpus_per_host": 8, "workload": {"simulated_runtime_s": 0.5}}
        status, _ = await call(service, "POST", "/v1/jobs", body)
        assert status == 201

        async def scheduled() -> bool:
            return (await job_state(service, j))["state"] in ("scheduled", "running", "completed")

        await eventually(scheduled, what="the gang scheduled")
        view = await job_state(service, j)
        assert len(set(view["nodes"])) == 2 and len(view["assignments"]) == 16
        (ev,) = await job_events(bus, j, JobScheduled)
        assert sorted(ev.nodes) == sorted(view["nodes"])

        async def completed() -> bool:
            return (await job_state(service, j))["state"] == "completed"

        await eventually(completed, what="both members exited and the gang completed")


async def test_competitors_for_the_last_gpus_one_runs_one_waits_with_a_reason(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with cluster(bus, store, stack, nodes=1) as (service, _, _allocator, _nodes):
        first, second = job_id(), job_id()
        for j in (first, second):
            body = {"id": j, "tenant": "t", "gpus": 8, "time_limit_s": 3600, "workload": {"simulated_runtime_s": 60}}
            assert (await call(service, "POST", "/v1/jobs", body))[0] == 201

        async def one_runs_one_explained() -> bool:
            states = [await job_state(service, j) for j in (first, second)]
            return [s["state"] for s in states] == ["running", "queued"] and bool(states[1]["reason"])

        await eventually(one_runs_one_explained, what="first running, second waiting with a reason")
        waiting = await job_state(service, second)
        assert waiting["reason"].startswith("waiting for 8 GPUs on one host; earliest estimated start"), waiting
        _, queues = await call(service, "GET", "/v1/queues")
        (q,) = [q for q in queues["queues"] if q["queue"] == "default"]
        assert q["queued"] >= 1 and q["running"] >= 1

        status, cancelled = await call(service, "DELETE", f"/v1/jobs/{first}")
        assert status == 200 and cancelled["state"] == "cancelled"

        async def second_runs() -> bool:
            return (await job_state(service, second))["state"] in ("scheduled", "running")

        await eventually(second_runs, what="the waiting job placed once the GPUs were released")
        status, again = await call(service, "DELETE", f"/v1/jobs/{first}")
        assert status == 200 and again["state"] == "cancelled"  # cancelling again changes nothing
        await call(service, "DELETE", f"/v1/jobs/{second}")


async def test_submit_and_cancel_commands_from_the_bus(bus: Bus, store: Store, stack: StackInfo) -> None:
    async with cluster(bus, store, stack, nodes=1, queues=["batch"]) as (service, _, _allocator, _nodes):
        j, elsewhere = job_id(), job_id()
        spec = JobSpec(name="train", tenant="t", queue="batch", request=ResourceRequest(kind="whole", gpus_per_host=4))
        await bus.publish(SubmitJob(source="test", key=j, job_id=j, spec=spec))
        other = msgspec.structs.replace(spec, queue="interactive")
        await bus.publish(SubmitJob(source="test", key=elsewhere, job_id=elsewhere, spec=other))

        async def placed() -> bool:
            status, view = await call(service, "GET", f"/v1/jobs/{j}")
            return status == 200 and view["state"] in ("scheduled", "running")

        await eventually(placed, what="the job submitted on the bus placed")
        assert (await call(service, "GET", f"/v1/jobs/{elsewhere}"))[0] == 404  # not a queue served here
        await bus.publish(CancelJob(source="test", key=j, job_id=j, reason="changed my mind"))

        async def cancelled() -> bool:
            view = await job_state(service, j)
            return view["state"] == "cancelled" and view["reason"] == "changed my mind"

        await eventually(cancelled, what="the job cancelled from the bus")
        (finished,) = await job_events(bus, j, JobFinished)
        assert finished.state == "cancelled"


@pytest.mark.parametrize("takes", [["jobs"], [], ["jobs", "pool", "health"]], ids=["jobs", "none", "all"])
async def test_submissions_on_the_bus_are_stored_and_planned_in_the_cycles_transaction(
    bus: Bus, store: Store, stack: StackInfo, takes: list[str]
) -> None:
    async with cluster(bus, store, stack, nodes=1, cycle_takes_news=takes) as (service, sched, _alloc, _nodes):
        spec = JobSpec(name="small", tenant="t", request=ResourceRequest(kind="whole", gpus_per_host=1))
        jobs = [job_id() for _ in range(4)]
        flaky = jobs[1]
        accept = sched.accept
        failed: list[str] = []

        async def accept_failing_once(tx: Any, job: str, job_spec: JobSpec) -> Any:
            if job == flaky and not failed:
                failed.append(job)
                raise RuntimeError("the store hiccuped")
            return await accept(tx, job, job_spec)

        sched.accept = accept_failing_once  # type: ignore[method-assign]
        for j in jobs:
            await bus.publish(SubmitJob(source="test", key=j, job_id=j, spec=spec))

        async def all_placed() -> bool:
            views = [await call(service, "GET", f"/v1/jobs/{j}") for j in jobs]
            return all(status == 200 and view["state"] in ("scheduled", "running") for status, view in views)

        await eventually(all_placed, what="every submission placed")
        assert failed == [flaky]

        def in_cycles(kind: str) -> float:
            return float(sched.news_in_cycles.labels(kind)._value.get())

        # The batch whose handler failed was handled apart (the cycle rolled back with it).
        assert in_cycles("SubmitJob") <= len(jobs) - 1
        before = in_cycles("SubmitJob")
        last = job_id()
        jobs.append(last)
        await bus.publish(SubmitJob(source="test", key=last, job_id=last, spec=spec))
        await eventually(all_placed, what="one more submission placed")
        for j in jobs:  # queued once each: nothing of a rolled-back attempt was published
            assert len(await job_events(bus, j, JobQueued)) == 1
        assert in_cycles("SubmitJob") == (before + 1 if "jobs" in takes else 0)
        # The allocator's answers: handled by cycles too when they take the pool's news.
        assert (in_cycles("AllocationGranted") >= 1) == ("pool" in takes)


async def test_bad_bodies_get_400_with_the_path(bus: Bus, store: Store, stack: StackInfo) -> None:
    async with cluster(bus, store, stack, nodes=1) as (service, _, _allocator, _nodes):
        status, err = await call(service, "POST", "/v1/jobs", {"tenant": "t", "hosts": 2, "gpus_per_host": 0})
        assert status == 400 and err["path"] == "$.gpus_per_host", err
        # Fits the schema, but the numbers contradict each other: 422, naming the field.
        status, err = await call(service, "POST", "/v1/jobs", {"tenant": "t", "hosts": 2, "gpus": 3})
        assert status == 422 and err["path"] == "$.gpus_per_host", err
        assert (await call(service, "GET", "/v1/jobs/nope"))[0] == 404
        status, listed = await call(service, "GET", "/v1/jobs?state=bogus")
        assert status == 400 and listed["error"] == "invalid query parameter" and listed["path"] == "?state", listed
        for query, path in [("since=yesterday", "?since"), ("until=2026-01-01T00:00:00", "?until"), ("by=site", "?by")]:
            status, err = await call(service, "GET", f"/v1/usage?{query}")
            assert status == 400 and err["path"] == path, (query, err)
        status, err = await call(service, "GET", "/v1/usage?since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z")
        assert status == 422 and err["path"] == "?since" and "is after" in err["detail"], err


async def test_a_job_id_again_is_the_same_job_or_a_409_naming_what_differs(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with cluster(bus, store, stack, nodes=1) as (service, _, _allocator, _nodes):
        j = job_id()
        body = {"id": j, "tenant": "t", "gpus": 1, "workload": {"simulated_runtime_s": 600}}
        status, first = await call(service, "POST", "/v1/jobs", body)
        assert status == 201, first
        status, again = await call(service, "POST", "/v1/jobs", body)
        assert status == 201 and again["job_id"] == j and again["submitted_at"] == first["submitted_at"], again
        status, err = await call(service, "POST", "/v1/jobs", {**body, "gpus": 2, "tenant": "u"})
        assert status == 409 and err["error"] == "job id taken" and err["path"] == "$.id", err
        assert 'tenant: "t" -> "u"' in err["detail"] and "gpus_per_host: 1 -> 2" in err["detail"], err
        view = await job_state(service, j)
        assert (view["tenant"], view["gpus"]) == ("t", 1)  # the stored job is unchanged
        assert len(await job_events(bus, j, JobQueued)) == 1


async def test_job_on_a_failed_node_is_requeued_and_granted_elsewhere(bus: Bus, store: Store, stack: StackInfo) -> None:
    async with cluster(bus, store, stack, nodes=2) as (service, _, _allocator, node_ids):
        j = job_id()
        body = {"id": j, "tenant": "t", "gpus": 8, "workload": {"simulated_runtime_s": 60}}
        assert (await call(service, "POST", "/v1/jobs", body))[0] == 201

        async def running() -> bool:
            return (await job_state(service, j))["state"] == "running"

        await eventually(running, what="the job running")
        before = await job_state(service, j)
        (failed,) = before["nodes"]
        # What the failover controller does when a node stops: the verdict, and the requeue of its work.
        await bus.publish(NodeFailed(source="test", key=failed, node_id=failed, reason="heartbeats stopped"))
        await bus.publish(
            RequeueRequested(
                source="test",
                key=j,
                job_id=j,
                allocation_id=before["allocation_id"],
                reason=f"node {failed} failed",
                node_id=failed,
            )
        )

        async def elsewhere() -> bool:
            now = await job_state(service, j)
            return now["state"] in ("scheduled", "running") and now["allocation_id"] != before["allocation_id"]

        await eventually(elsewhere, what="the job granted again")
        after = await job_state(service, j)
        assert after["nodes"] != [failed] and after["nodes"][0] in node_ids
        assert after["attempt"] == 1 and after["submitted_at"] == before["submitted_at"]
        requeued = await job_events(bus, j, JobRequeued)
        assert len(requeued) == 1 and requeued[0].attempt == 1
        await call(service, "DELETE", f"/v1/jobs/{j}")


async def test_agent_killed_the_failover_controller_moves_its_job(bus: Bus, store: Store, stack: StackInfo) -> None:
    async with (
        cluster(bus, store, stack, nodes=1) as (service, sched, _allocator, (kept,)),
        own_store(stack) as fc_store,
        running_controller(bus, fc_store),
        AsyncExitStack() as doomed_agent,
    ):
        doomed = f"{kept.rsplit('-', 1)[0]}-002"
        agent_store = await doomed_agent.enter_async_context(own_store(stack))
        await doomed_agent.enter_async_context(
            running_agent(bus, agent_store, nodes=1, node_prefix=doomed.rsplit("-", 1)[0], first_node=2)
        )
        await until_leading(sched, [kept, doomed])
        blocker, j = job_id(), job_id()
        body = {"tenant": "t", "gpus": 8, "workload": {"simulated_runtime_s": 120}}
        for one in (blocker, j):
            assert (await call(service, "POST", "/v1/jobs", {**body, "id": one}))[0] == 201

        async def both_running() -> bool:
            states = [(await job_state(service, one))["state"] for one in (blocker, j)]
            return states == ["running", "running"]

        await eventually(both_running, what="both jobs running, one per node")
        if (await job_state(service, j))["nodes"] != [doomed]:
            blocker, j = j, blocker
        before = await job_state(service, j)
        assert before["nodes"] == [doomed]
        await call(service, "DELETE", f"/v1/jobs/{blocker}")
        await doomed_agent.aclose()  # the node goes silent: the controller fails it, the allocator revokes

        async def moved() -> bool:
            now = await job_state(service, j)
            return now["state"] in ("scheduled", "running") and now["nodes"] == [kept]

        await eventually(moved, what="the job granted again on the surviving node")
        after = await job_state(service, j)
        assert after["attempt"] == 1 and after["allocation_id"] != before["allocation_id"]
        assert len(await job_events(bus, j, JobRequeued)) == 1
        await call(service, "DELETE", f"/v1/jobs/{j}")


@asynccontextmanager
async def running_controller(bus: Bus, store: Store) -> AsyncIterator[Service[FailoverControllerConfig]]:
    unique = f"fc-{uuid.uuid4().hex[:8]}"
    cfg = FailoverControllerConfig(
        instance="test",
        tick_interval_s=0.1,
        suspect_after_intervals=2.5,
        fail_after_s=1.0,
        stable_window_s=1.0,
        # Nodes of earlier tests, killed without deregistering, are replayed and fail too: no split-brain guard.
        max_failed_fraction=1.0,
        consumer_batch=256,
        leader_ttl_s=1.0,
        durable_prefix=unique,
        leader_key=unique,
    )
    kit = Kit(name="failover_controller", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("fc"))
    service = Service(kit, await controller_bootstrap(kit))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def test_leader_failover_loses_no_job_and_schedules_none_twice(bus: Bus, store: Store, stack: StackInfo) -> None:
    async with pool_of(bus, stack, nodes=2) as pool, AsyncExitStack() as first_replica:
        key, allocator, nodes = f"sched-{pool.prefix}", pool.allocator, pool.node_ids
        first, first_sched = await first_replica.enter_async_context(
            running_scheduler(bus, store, pool.from_seq, leader_key=key, instance="first")
        )
        await until_leading(first_sched, nodes)
        async with (
            own_replica_store(stack, store) as second_store,
            running_scheduler(bus, second_store, pool.from_seq, leader_key=key, instance="second") as (
                second,
                second_sched,
            ),
        ):
            assert not second_sched.is_leader
            ids = [job_id() for _ in range(12)]
            body = {"tenant": "t", "gpus": 1, "workload": {"simulated_runtime_s": 120}}
            for j in ids[:6]:
                assert (await call(first, "POST", "/v1/jobs", {**body, "id": j}))[0] == 201
            old_term = first_sched.leadership.term  # type: ignore[union-attr]
            await first_replica.aclose()  # stops and resigns: the standby takes over at once
            for j in ids[6:]:
                assert (await call(second, "POST", "/v1/jobs", {**body, "id": j}))[0] == 201

            async def all_placed() -> bool:
                states = [(await job_state(second, j))["state"] for j in ids]
                return all(s in ("scheduled", "running") for s in states)

            await eventually(all_placed, what="every job placed by one leader or the other")
            assert second_sched.is_leader and second_sched.leadership.term > old_term  # type: ignore[union-attr]
            scheduled = Counter()
            for j in ids:
                scheduled[j] = len(await job_events(bus, j, JobScheduled))
                _, held = await call(allocator, "GET", f"/v1/allocations?owner={j}")
                assert len(held) == 1, (j, held)
            assert set(scheduled.values()) == {1}

            # A deposed leader's late proposal: refused by the allocator's fence and by the store's.
            stale = ProposePlacement(
                source="scheduler/first",
                key="late",
                job_id="late",
                tenant="t",
                queue="default",
                ledger_version=second_sched.feed.ledger.version,
                assignments=[GpuAssignment(node_id=nodes[0], gpu_index=7)],
                scheduler_group=key,
                fencing_term=old_term,
            )
            await bus.publish(stale)

            async def rejected() -> list[Any]:
                msgs = await stream_messages(bus.js, "IBPOOL_POOL", AllocationRejected.subject("late"))
                return [decode(m.data) for m in msgs]

            async def fenced() -> bool:
                return any(r.command_id == stale.id for r in await rejected())

            await eventually(fenced, what="the stale proposal rejected")
            (answer,) = [r for r in await rejected() if r.command_id == stale.id]
            assert answer.reason == "stale" and "fenced" in answer.detail
            async with second_store.transaction() as tx:
                assert await sched_state.lock_cycle(tx.conn, second_store.schema, old_term, durable=False) == "fenced"
            for j in ids:
                await call(second, "DELETE", f"/v1/jobs/{j}")


async def test_one_statement_locks_the_cycle_fences_its_term_and_sets_its_commits_durability(stack: StackInfo) -> None:
    async with own_store(stack) as store:
        await store.migrate(sched_state.MIGRATIONS)

        @asynccontextmanager
        async def cycle_tx() -> AsyncIterator[asyncpg.Connection]:
            # A session whose own setting waits for the disk (the tests' Postgres does not), so that
            # "off" and the setting are told apart.
            conn = await asyncpg.connect(
                stack.postgres_dsn, server_settings={"search_path": store.schema, "synchronous_commit": "on"}
            )
            try:
                async with conn.transaction():
                    yield conn
            finally:
                await conn.close()

        async def fenced_term() -> int | None:
            return await store.pool.fetchval("SELECT term FROM leader_fence")

        async with cycle_tx() as conn:
            assert await sched_state.lock_cycle(conn, store.schema, 5, durable=False) == "locked"
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
            async with cycle_tx() as other:  # a second cycle while the first runs: no lock, no fence
                assert await sched_state.lock_cycle(other, store.schema, 6, durable=True) == "busy"
        assert await fenced_term() == 5
        async with cycle_tx() as conn:  # a deposed leader's term
            assert await sched_state.lock_cycle(conn, store.schema, 4, durable=False) == "fenced"
        assert await fenced_term() == 5
        async with cycle_tx() as conn:  # the same term again, a cycle that must wait for the disk
            assert await sched_state.lock_cycle(conn, store.schema, 5, durable=True) == "locked"
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        async with cycle_tx() as conn:  # ... also on a session that kept "off" from an earlier user
            await conn.execute("SET synchronous_commit = off")  # session-wide, as a leak would be
            assert await sched_state.lock_cycle(conn, store.schema, 5, durable=True) == "locked"
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        async with cycle_tx() as conn:  # no leader election: no fence; durable after all
            assert await sched_state.lock_cycle(conn, store.schema, None, durable=False) == "locked"
            await sched_state.commit_durably(conn)
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        assert await fenced_term() == 5


async def test_deposed_leader_that_has_not_noticed_cannot_commit_a_cycle(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with pool_of(bus, stack, nodes=1) as pool, own_replica_store(stack, store) as second_store:
        key = f"sched-{pool.prefix}"
        async with (
            running_scheduler(bus, store, pool.from_seq, leader_key=key, instance="a") as (_, a),
            running_scheduler(bus, second_store, pool.from_seq, leader_key=key, instance="b") as (b_service, b),
        ):
            await until_leading(a, pool.node_ids)
            old_term = a.leadership.term  # type: ignore[union-attr]
            # A partition as the bus sees it: a's key is gone, b wins the next election.
            await (await bus.js.key_value("ibpool_leaders")).delete(key)
            await until_leading(b, pool.node_ids)

            async def b_scheduled() -> bool:
                return b.cycles > 0

            await eventually(b_scheduled, what="the new leader committed a cycle (and its term)")
            j = job_id()
            # Queued while the new leader runs: the deposed one would propose it if it could commit.
            async with store.transaction() as tx:
                assert not isinstance(await a.accept(tx, j, JobSpec(name="", tenant="t", request=WHOLE_GPU)), str)
            a.leadership.term = old_term  # type: ignore[union-attr]  # it has not noticed yet

            async def a_fenced() -> bool:
                return await a.cycle_once() is None and not a.is_leader

            await eventually(a_fenced, what="the deposed leader's cycle refused by the store's fence")

            async def placed_by_b() -> bool:
                return (await job_state(b_service, j))["state"] in ("scheduled", "running")

            await eventually(placed_by_b, what="the job placed by the new leader")
            proposals = [
                decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_POOL", ProposePlacement.subject(j))
            ]
            assert [p.fencing_term for p in proposals] == [b.leadership.term]  # type: ignore[union-attr]
            await call(b_service, "DELETE", f"/v1/jobs/{j}")


WHOLE_GPU = ResourceRequest(kind="whole", gpus_per_host=1)


@asynccontextmanager
async def own_replica_store(stack: StackInfo, store: Store) -> AsyncIterator[Store]:
    """A second connection pool on the same schema: replicas of one service share its store."""
    second = await Store.connect(stack.postgres_dsn, store.schema)
    try:
        yield second
    finally:
        await second.close()


async def test_a_proposal_whose_cycle_postgres_lost_is_granted_and_given_back(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    # A cycle that only proposes commits without waiting for the disk (state.lock_cycle): a crash of
    # Postgres may lose it after the relay published its proposal. The allocator then grants a
    # proposal the job's row never recorded, and the scheduler gives that grant back. (The job asks
    # for a GPU model the pool does not have, so no cycle of its own races the lost proposal.)
    async with cluster(bus, store, stack, nodes=1) as (service, sched, _allocator, nodes):
        j = job_id()
        body = {"id": j, "tenant": "t", "gpus": 2, "gpu_model": "no-such-gpu"}
        status, _ = await call(service, "POST", "/v1/jobs", body)
        assert status == 201
        lost = ProposePlacement(
            id=f"lost-{j}",
            source="test",
            key=j,
            job_id=j,
            tenant="t",
            queue="default",
            ledger_version=sched.feed.ledger.version,
            assignments=[GpuAssignment(node_id=nodes[0], gpu_index=6), GpuAssignment(node_id=nodes[0], gpu_index=7)],
            lease_s=60.0,
        )
        await bus.publish(lost)

        async def given_back() -> bool:
            released = await stream_messages(bus.js, "IBPOOL_POOL", AllocationReleased.subject(nodes[0]))
            return any(decode(m.data).allocation_id == lost.id for m in released)

        await eventually(given_back, what="the grant of the lost proposal released")
        granted = await stream_messages(bus.js, "IBPOOL_POOL", AllocationGranted.subject(nodes[0]))
        assert any(decode(m.data).allocation_id == lost.id for m in granted)  # it was granted first
        view = await job_state(service, j)
        assert view["state"] == "queued" and view["allocation_id"] is None
        assert not await job_events(bus, j, JobScheduled)


async def test_a_mig_job_is_queued_placed_on_a_mig_capable_gpu_granted_its_instance_and_runs(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with cluster(bus, store, stack, nodes=1) as (service, _sched, _allocator, node_ids):
        j = job_id()
        body = {"id": j, "tenant": "t", "mig": "1g.10gb", "workload": {"simulated_runtime_s": 0.3}}
        status, view = await call(service, "POST", "/v1/jobs", body)
        assert status == 201 and view["mig_profile"] == "1g.10gb" and view["gpus"] == 1, view

        async def completed() -> bool:
            return (await job_state(service, j))["state"] == "completed"

        await eventually(completed, what="the MIG job completed")
        done = await job_state(service, j)
        assert [(a["node_id"], a["mig_profile"]) for a in done["assignments"]] == [(node_ids[0], "1g.10gb")], done
        on_node = await stream_messages(bus.js, "IBPOOL_POOL", AllocationGranted.subject(node_ids[0]))
        [granted] = [e for m in on_node if isinstance(e := decode(m.data), AllocationGranted) and e.job_id == j]
        # The allocator carved the instance and the agent was told to run the job inside it.
        assert (granted.kind, [a.mig_profile for a in granted.assignments]) == ("mig", ["1g.10gb"]), granted
        assert len(granted.enforcement.mig_instances) == 1, granted.enforcement
        status, err = await call(service, "POST", "/v1/jobs", {"tenant": "t", "mig": "1g.10gb", "hosts": 2})
        assert status == 422 and err["path"] == "$.mig", err
