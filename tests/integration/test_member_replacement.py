"""A gang loses one node: with `on_member_failure: replace` only the failed member is replaced (same
allocation, the surviving node gets no event, the job completes), after a SIGKILLed agent or an XID 79
drill; with no host to take the member the gang restarts and says why; with `restart` the gang
restarts whole. Real NATS and Postgres, the scheduler, the pool allocator, the failover controller,
node agents in-process and one agent process that is SIGKILLed."""

from __future__ import annotations

import datetime as dt
import signal
from contextlib import AsyncExitStack
from typing import Any

import aiohttp

from ibpool_proto import decode
from ibpool_proto.health import RequeueRequested
from ibpool_proto.job import JobRequeued, JobScheduled, JobStarted
from ibpool_proto.pool import AllocationGranted, AllocationReleased, AllocationRevoked, ReplaceGangMember
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store
from tests.integration.agent_support import QUIET_GPUS, QUIET_GPUS_ENV, agent_process, running_agent, unique_prefix
from tests.integration.helpers import eventually, own_store, stream_messages
from tests.integration.test_failover_controller import stop_process
from tests.integration.test_scheduler import (
    call,
    cluster,
    job_events,
    job_id,
    job_state,
    running_controller,
    until_leading,
)


async def pool_events(bus: Bus, kind: type, node_id: str, allocation_id: str) -> list[Any]:
    msgs = await stream_messages(bus.js, "IBPOOL_POOL", kind.subject(node_id))
    return [e for e in (decode(m.data) for m in msgs) if e.allocation_id == allocation_id]


async def running_replace_gang(service: Any, runtime_s: float) -> tuple[str, dict[str, Any]]:
    """Submit a 2 x 8 GPU gang declared `replace`; its id and view once it runs on both nodes."""
    j = job_id()
    body = {"id": j, "tenant": "t", "hosts": 2, "gpus_per_host": 8, "on_member_failure": "replace"}
    body["workload"] = {"simulated_runtime_s": runtime_s}
    assert (await call(service, "POST", "/v1/jobs", body))[0] == 201

    async def running() -> bool:
        return (await job_state(service, j))["state"] == "running"

    await eventually(running, what="the gang running on both nodes")
    return j, await job_state(service, j)


async def gang_loses_a_node(bus: Bus, store: Store, stack: StackInfo, declared: str) -> dict[str, Any]:
    """A 2 x 8 GPU gang on `kept` (in-process agent) and `doomed` (an agent process); a spare node
    joins; the doomed agent is SIGKILLed. Returns what the test checks."""
    async with (
        cluster(bus, store, stack, nodes=1, agent=QUIET_GPUS) as (service, sched, _allocator, (kept,)),
        own_store(stack) as fc_store,
        running_controller(bus, fc_store),
        AsyncExitStack() as spare_agent,
    ):
        # Named to sort after `kept`: rank 0 (the gang's rendezvous) stays on the kept node; losing
        # rank 0 restarts a gang whatever it declared.
        doomed_prefix = f"{kept.rsplit('-', 1)[0]}z"
        doomed = f"{doomed_prefix}-001"
        doomed_agent = agent_process(stack, doomed_prefix, extra_env=QUIET_GPUS_ENV)
        try:
            await until_leading(sched, [kept, doomed])
            j = job_id()
            body = {
                "id": j,
                "tenant": "t",
                "hosts": 2,
                "gpus_per_host": 8,
                "on_member_failure": declared,
                "workload": {"simulated_runtime_s": 4},
            }
            status, view = await call(service, "POST", "/v1/jobs", body)
            assert status == 201 and view["on_member_failure"] == declared, view

            async def started_on_both() -> bool:
                started = {e.node_id for e in await job_events(bus, j, JobStarted)}
                return started == {kept, doomed}

            await eventually(started_on_both, what="the gang started on both nodes")
            before = await job_state(service, j)
            assert before["nodes"] == [kept, doomed], before
            # A spare node joins (in-process, as the kept one), then the doomed agent is SIGKILLed.
            spare_prefix = unique_prefix()
            spare = f"{spare_prefix}-001"
            spare_store = await spare_agent.enter_async_context(own_store(stack))
            await spare_agent.enter_async_context(
                running_agent(bus, spare_store, nodes=1, node_prefix=spare_prefix, **QUIET_GPUS)
            )
            await until_leading(sched, [kept, doomed, spare])
            killed_at = dt.datetime.now(dt.UTC)
            await stop_process(doomed_agent, signal.SIGKILL)

            async def completed() -> bool:
                return (await job_state(service, j))["state"] == "completed"

            await eventually(completed, timeout_s=40, what="the gang completed after losing a node")
            after = await job_state(service, j)
            alloc = before["allocation_id"]

            async def released() -> bool:
                return bool(await pool_events(bus, AllocationReleased, kept, after["allocation_id"]))

            await eventually(released, what="the finished gang's allocation released")
            return {
                "killed_at": killed_at,
                "kept": kept,
                "doomed": doomed,
                "spare": spare,
                "before": before,
                "after": after,
                "kept_granted": await pool_events(bus, AllocationGranted, kept, alloc),
                "kept_revoked": await pool_events(bus, AllocationRevoked, kept, alloc),
                "doomed_revoked": await pool_events(bus, AllocationRevoked, doomed, alloc),
                "kept_released": await pool_events(bus, AllocationReleased, kept, alloc),
                "doomed_released": await pool_events(bus, AllocationReleased, doomed, alloc),
                "spare_granted": await pool_events(bus, AllocationGranted, spare, alloc),
                "replacements": [
                    decode(m.data)
                    for m in await stream_messages(bus.js, "IBPOOL_POOL", ReplaceGangMember.subject(alloc))
                ],
                "requeued": await job_events(bus, j, JobRequeued),
                "requeue_requested": [
                    decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_HEALTH", RequeueRequested.subject(j))
                ],
                "scheduled": await job_events(bus, j, JobScheduled),
                "started": await job_events(bus, j, JobStarted),
            }
        finally:
            await stop_process(doomed_agent, signal.SIGKILL)


async def test_a_replace_gang_gets_one_new_member_in_the_same_allocation_and_completes(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    seen = await gang_loses_a_node(bus, store, stack, "replace")
    kept, doomed, spare, before, after = (seen[k] for k in ("kept", "doomed", "spare", "before", "after"))
    alloc = before["allocation_id"]
    assert after["allocation_id"] == alloc and after["attempt"] == 0 and after["replacements"] == 1
    # The new host took the lost member's rank.
    assert after["nodes"] == [spare if h == doomed else h for h in before["nodes"]]
    # The surviving node: its one grant, no revocation (its release came after the job completed).
    assert len(seen["kept_granted"]) == 1 and seen["kept_revoked"] == []
    # The failed member: revoked once; the spare: one grant into the same allocation, in its rank.
    assert len(seen["doomed_revoked"]) == 1
    (granted,) = seen["spare_granted"]
    assert granted.replaces == doomed and granted.kind == "gang" and granted.on_member_failure == "replace"
    assert granted.nodes == after["nodes"] and granted.fencing_term is not None
    # From the SIGKILL to the new member's grant: heartbeats missed for fail_after_s (1 s here), the
    # verdict, the revocation, a cycle, the allocator's commit.
    took_s = (granted.occurred_at - seen["killed_at"]).total_seconds()
    print(f"SIGKILL to replacement grant: {took_s:.2f} s")
    assert 0 < took_s < 10, took_s
    (cmd,) = seen["replacements"]
    assert cmd.failed_node_id == doomed and granted.command_id == cmd.id and cmd.fencing_term == granted.fencing_term
    # A first hardware hit is retried at once (no retry_after_s): the replacement is proposed on
    # whichever the scheduler handled first, the controller's requeue or the allocator's revocation.
    (asked,) = seen["requeue_requested"]
    assert asked.retry_after_s == 0.0 and asked.node_id == doomed
    assert "not before" not in cmd.reason
    assert cmd.reason.startswith(
        (
            f"replacing the member on {doomed}: allocation revoked",
            f"replacing the member on {doomed}: requeue requested",
        )
    ), cmd.reason
    assert seen["requeued"] == [] and len(seen["scheduled"]) == 1
    assert [e.node_id for e in seen["started"]].count(spare) == 1
    assert [e.node_id for e in seen["started"]].count(kept) == 1, "the surviving member was not restarted"


async def test_a_restart_gang_that_loses_a_node_restarts_whole(bus: Bus, store: Store, stack: StackInfo) -> None:
    seen = await gang_loses_a_node(bus, store, stack, "restart")
    kept, doomed, spare, before, after = (seen[k] for k in ("kept", "doomed", "spare", "before", "after"))
    assert after["allocation_id"] != before["allocation_id"] and after["attempt"] == 1
    assert set(after["nodes"]) == {kept, spare} and after["replacements"] == 0
    # Every member's share of the first allocation ended once: revoked by the allocator on NodeFailed,
    # or released by the scheduler's requeue when the controller's RequeueRequested was handled first.
    for member in ("kept", "doomed"):
        ended = seen[f"{member}_revoked"] + seen[f"{member}_released"]
        assert len(ended) == 1, (member, ended)
    assert seen["spare_granted"] == [] and seen["replacements"] == []
    (requeued,) = seen["requeued"]
    assert requeued.allocation_id == before["allocation_id"] and doomed in requeued.reason
    assert len(seen["scheduled"]) == 2
    assert [e.node_id for e in seen["started"]].count(kept) == 2, "the surviving member restarted with the gang"


async def test_a_replace_gang_with_no_host_to_take_the_member_restarts_and_says_why(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with (
        cluster(bus, store, stack, nodes=1, agent=QUIET_GPUS) as (service, sched, _allocator, (kept,)),
        own_store(stack) as fc_store,
        running_controller(bus, fc_store),
    ):
        # Named to sort after `kept`: rank 0 (the gang's rendezvous) stays on the kept node; losing
        # rank 0 restarts a gang whatever it declared.
        doomed_prefix = f"{kept.rsplit('-', 1)[0]}z"
        doomed = f"{doomed_prefix}-001"
        doomed_agent = agent_process(stack, doomed_prefix, extra_env=QUIET_GPUS_ENV)
        try:
            await until_leading(sched, [kept, doomed])
            j, before = await running_replace_gang(service, runtime_s=60)
            await stop_process(doomed_agent, signal.SIGKILL)

            async def requeued() -> bool:
                return bool(await job_events(bus, j, JobRequeued))

            await eventually(requeued, timeout_s=20, what="the gang restarted")
            (ev,) = await job_events(bus, j, JobRequeued)
            assert ev.allocation_id == before["allocation_id"] and ev.attempt == 1
            assert ev.reason.startswith(f"member on {doomed} lost and no host fits its replacement"), ev.reason
            assert "no ready host outside the gang has 8 free GPUs" in ev.reason

            async def survivor_released() -> bool:
                return bool(await pool_events(bus, AllocationReleased, kept, before["allocation_id"]))

            await eventually(survivor_released, what="the surviving member's share released")
            assert await pool_events(bus, AllocationRevoked, kept, before["allocation_id"]) == []
            await call(service, "DELETE", f"/v1/jobs/{j}")
        finally:
            await stop_process(doomed_agent, signal.SIGKILL)


async def test_an_xid_79_drill_on_a_replace_gang_member_replaces_only_that_member(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with (
        cluster(bus, store, stack, nodes=1, agent=QUIET_GPUS) as (service, sched, _allocator, (kept,)),
        own_store(stack) as fc_store,
        running_controller(bus, fc_store),
        AsyncExitStack() as agents,
    ):
        prefix = kept.rsplit("-", 1)[0]
        doomed, spare = f"{prefix}-002", f"{prefix}-003"
        doomed_store = await agents.enter_async_context(own_store(stack))
        doomed_agent = await agents.enter_async_context(
            running_agent(
                bus, doomed_store, nodes=1, node_prefix=prefix, first_node=2, fault_injection=True, **QUIET_GPUS
            )
        )
        await until_leading(sched, [kept, doomed])
        j, before = await running_replace_gang(service, runtime_s=4)
        spare_store = await agents.enter_async_context(own_store(stack))
        await agents.enter_async_context(
            running_agent(bus, spare_store, nodes=1, node_prefix=prefix, first_node=3, **QUIET_GPUS)
        )
        await until_leading(sched, [kept, doomed, spare])
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{doomed_agent.http_url}/v1/nodes/{doomed}/gpus/3/xid", json={"code": 79}) as r,
        ):
            assert r.status == 202, await r.text()

        async def completed() -> bool:
            return (await job_state(service, j))["state"] == "completed"

        await eventually(completed, timeout_s=30, what="the gang completed after the XID")
        after = await job_state(service, j)
        alloc = before["allocation_id"]
        assert after["allocation_id"] == alloc and after["attempt"] == 0 and after["replacements"] == 1
        assert after["nodes"] == [spare if h == doomed else h for h in before["nodes"]]
        assert await job_events(bus, j, JobRequeued) == []
        assert await pool_events(bus, AllocationRevoked, kept, alloc) == []
        assert len(await pool_events(bus, AllocationGranted, kept, alloc)) == 1
        (granted,) = await pool_events(bus, AllocationGranted, spare, alloc)
        assert granted.replaces == doomed
