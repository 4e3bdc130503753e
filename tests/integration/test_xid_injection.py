"""An XID 79 injected into a simulated GPU of a running node agent, against real NATS and Postgres with the
scheduler, the pool allocator and the failover controller in-process: the agent reports it at once, the
controller fails and cordons the node (79: the GPU fell off the bus, the machine needs a reboot), and the
job there is requeued and granted again on the other node."""

from __future__ import annotations

from contextlib import AsyncExitStack

import aiohttp

from ibpool_proto.health import Cordoned, NodeFailed
from ibpool_proto.job import JobRequeued
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store
from tests.integration.agent_support import running_agent
from tests.integration.helpers import eventually, own_store
from tests.integration.test_failover_controller import health_events
from tests.integration.test_scheduler import (
    call,
    cluster,
    job_events,
    job_id,
    job_state,
    running_controller,
    until_leading,
)


async def post(url: str, body: object) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
        return r.status, await r.json()


async def test_injected_xid_79_fails_the_node_and_its_job_is_granted_elsewhere(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    async with (
        cluster(bus, store, stack, nodes=1) as (service, sched, _allocator, (kept,)),
        own_store(stack) as fc_store,
        running_controller(bus, fc_store),
        AsyncExitStack() as doomed_agent,
    ):
        doomed = f"{kept.rsplit('-', 1)[0]}-002"
        agent_store = await doomed_agent.enter_async_context(own_store(stack))
        agent = await doomed_agent.enter_async_context(
            running_agent(
                bus, agent_store, nodes=1, node_prefix=doomed.rsplit("-", 1)[0], first_node=2, fault_injection=True
            )
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

        xid_url = f"{agent.http_url}/v1/nodes/{doomed}/gpus"
        status, err = await post(f"{xid_url}/8/xid", {"code": 79})
        assert status == 409 and "no GPU 8" in str(err["detail"]), err
        status, err = await post(f"{xid_url}/3/xid", {"code": 0})
        assert status == 400 and err["path"] == "$.code", err
        assert not await health_events(bus, NodeFailed, doomed)
        status, ok = await post(f"{xid_url}/3/xid", {"code": 79})
        assert status == 202 and ok["xid"] == 79, ok

        async def moved() -> bool:
            now = await job_state(service, j)
            return now["state"] in ("scheduled", "running") and now["nodes"] == [kept]

        # The agent is still beating: only the XID in its telemetry can fail the node.
        await eventually(moved, timeout_s=10, what="the job granted again on the other node")
        [failed] = await health_events(bus, NodeFailed, doomed)
        assert "79" in failed.reason, failed.reason
        assert "node" in [c.scope for c in await health_events(bus, Cordoned, doomed)]
        after = await job_state(service, j)
        assert after["attempt"] == 1 and after["allocation_id"] != before["allocation_id"]
        assert len(await job_events(bus, j, JobRequeued)) == 1
        await call(service, "DELETE", f"/v1/jobs/{j}")
