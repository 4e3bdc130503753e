"""The node agent against real NATS and Postgres: registration, heartbeats, grants, exits, its API."""

from __future__ import annotations

import aiohttp
import msgspec

from ibpool_proto import decode
from ibpool_proto.job import JobExited, JobStarted
from ibpool_proto.node import NodeHeartbeat, NodeRegistered, TelemetryReported
from ibpool_proto.pool import AllocationRevoked, Enforcement
from ibpool_runtime.bus import Bus
from ibpool_runtime.store import Store
from tests.integration.agent_support import grant, running_agent
from tests.integration.helpers import eventually, stream_messages


async def events_on(bus: Bus, stream: str, subject: str) -> list:
    return [decode(m.data) for m in await stream_messages(bus.js, stream, subject)]


async def test_agent_registers_heartbeats_and_reports_telemetry(bus: Bus, store: Store) -> None:
    async with running_agent(bus, store, nodes=3) as svc:
        nodes = svc.kit.config.node_prefix

        ids = [f"{nodes}-001", f"{nodes}-002", f"{nodes}-003"]

        async def beating() -> bool:
            for n in ids:
                if not await events_on(bus, "IBPOOL_NODE", NodeHeartbeat.subject(n)):
                    return False
            return True

        await eventually(beating, what="three nodes heartbeating")
        regs = [r for n in ids for r in await events_on(bus, "IBPOOL_NODE", NodeRegistered.subject(n))]
        assert sorted(r.node_id for r in regs) == ids
        assert all(len(r.gpus) == 8 and r.backend == "simulated" for r in regs)

        async def telemetry() -> bool:
            return bool(await events_on(bus, "IBPOOL_NODE", TelemetryReported.subject(f"{nodes}-001")))

        await eventually(telemetry, what="telemetry")
        sample = (await events_on(bus, "IBPOOL_NODE", TelemetryReported.subject(f"{nodes}-001")))[0]
        assert len(sample.gpus) == 8
        assert sample.host is not None and 0.0 < sample.host.cpu_pct <= 100.0 and sample.host.memory_used_mib > 0


async def test_grant_starts_work_which_exits_and_revoke_stops_it(bus: Bus, store: Store) -> None:
    async with running_agent(bus, store) as svc:
        node = f"{svc.kit.config.node_prefix}-001"
        short = grant(node, [0, 1], runtime_s=0.3)
        long = grant(node, [2], runtime_s=600)
        oom = grant(node, [3], runtime_s=600, memory_mib=30_000, limit_mib=20_000)
        bad = grant(node, [9])
        for g in (short, long, oom, bad):
            await bus.publish(g)
        await bus.publish(short)  # a duplicate publish: dropped by JetStream, and by the inbox if not

        async def exited(job: str, n: int = 1) -> bool:
            return len(await events_on(bus, "IBPOOL_JOB", JobExited.subject(job))) == n

        await eventually(lambda: exited(short.job_id), what="short job exited")
        await eventually(lambda: exited(oom.job_id), what="oom job killed")
        await eventually(lambda: exited(bad.job_id), what="bad grant refused")
        [e_short] = await events_on(bus, "IBPOOL_JOB", JobExited.subject(short.job_id))
        [e_oom] = await events_on(bus, "IBPOOL_JOB", JobExited.subject(oom.job_id))
        [e_bad] = await events_on(bus, "IBPOOL_JOB", JobExited.subject(bad.job_id))
        assert (e_short.reason, e_short.exit_code) == ("completed", 0)
        assert (e_oom.reason, e_oom.exit_code) == ("oom", 137) and "20000" in e_oom.detail
        assert e_bad.reason == "failed" and "[9]" in e_bad.detail
        assert len(await events_on(bus, "IBPOOL_JOB", JobStarted.subject(short.job_id))) == 1
        assert not await events_on(bus, "IBPOOL_JOB", JobStarted.subject(bad.job_id))

        # the long job runs until revoked
        assert not await events_on(bus, "IBPOOL_JOB", JobExited.subject(long.job_id))
        await bus.publish(
            AllocationRevoked(
                source="test",
                key=node,
                allocation_id=long.allocation_id,
                job_id=long.job_id,
                node_id=node,
                ledger_version=2,
                reason="preempted",
            )
        )
        await eventually(lambda: exited(long.job_id), what="revoked job stopped")
        [e_long] = await events_on(bus, "IBPOOL_JOB", JobExited.subject(long.job_id))
        assert e_long.reason == "revoked" and e_long.detail == "preempted"

        # the API shows the node and nothing left running
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{svc.http_url}/v1/nodes/{node}") as r:
                assert r.status == 200
                body = msgspec.json.decode(await r.read())
                assert body["node_id"] == node and len(body["gpus"]) == 8 and body["running"] == []
            async with http.get(f"{svc.http_url}/v1/agent") as r:
                reasons = msgspec.json.decode(await r.read())["exits_by_reason"]
                assert reasons == {"completed": 1, "oom": 1, "revoked": 1}


async def test_service_endpoints_health_ready_metrics_and_404(bus: Bus, store: Store) -> None:
    async with running_agent(bus, store) as svc, aiohttp.ClientSession() as http:
        async with http.get(f"{svc.http_url}/healthz") as r:
            assert r.status == 200
        async with http.get(f"{svc.http_url}/readyz") as r:
            body = await r.json()
            assert r.status == 200 and body == {
                "ready": True,
                "checks": {"bus": True, "store": True, "consumers": True},
            }
        async with http.get(f"{svc.http_url}/metrics") as r:
            text = await r.text()
            assert "ibpool_outbox_lag" in text and "ibpool_consumer_pending" in text
            assert "ibpool_handler_seconds_bucket" in text or "ibpool_handler_seconds" in text
        async with http.get(f"{svc.http_url}/no/such/route") as r:
            assert r.status == 404
            assert (await r.json())["error"] == "not found"
        async with http.get(f"{svc.http_url}/v1/nodes/nope") as r:
            assert r.status == 404


async def test_mig_and_fraction_limits_are_put_in_force_and_taken_back(bus: Bus, store: Store) -> None:
    async with running_agent(bus, store, nodes=1, gpu_model="NVIDIA A100-SXM4-80GB") as svc:
        node = f"{svc.kit.config.node_prefix}-001"
        left = grant(node, [0], runtime_s=600, enforcement=Enforcement(mig_instances=["0:3g.40gb@0"]))
        right = grant(node, [0], runtime_s=600, enforcement=Enforcement(mig_instances=["0:3g.40gb@4"]))
        overlap = grant(node, [0], runtime_s=600, enforcement=Enforcement(mig_instances=["0:1g.10gb@0"]))
        mps = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_DEVICE_SM_LIMIT": "25"}
        fraction = grant(node, [1], runtime_s=600, enforcement=Enforcement(env=mps, memory_limit_mib=20_000))
        for g in (left, right, fraction):
            await bus.publish(g)
        for g in (left, right, fraction):
            await eventually(lambda g=g: _started(bus, g.job_id), what=f"{g.job_id} started with its limits in force")
        await bus.publish(overlap)

        async def refused() -> bool:
            return bool(await events_on(bus, "IBPOOL_JOB", JobExited.subject(overlap.job_id)))

        await eventually(refused, what="overlapping MIG instance refused")
        [e] = await events_on(bus, "IBPOOL_JOB", JobExited.subject(overlap.job_id))
        assert e.reason == "failed" and "overlaps" in e.detail and "1g.10gb" in e.detail

        async def in_force() -> dict[str, dict]:
            async with aiohttp.ClientSession() as http, http.get(f"{svc.http_url}/v1/nodes/{node}") as r:
                return {a["allocation_id"]: a for a in msgspec.json.decode(await r.read())["enforcement"]}

        applied = await in_force()
        assert set(applied) == {left.allocation_id, right.allocation_id, fraction.allocation_id}
        assert applied[left.allocation_id]["mig_instances"] == ["0:3g.40gb@0"]
        [device] = applied[left.allocation_id]["mig_devices"]
        assert device.startswith("MIG-") and applied[left.allocation_id]["env"]["CUDA_VISIBLE_DEVICES"] == device
        assert applied[fraction.allocation_id]["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"

        # Revoking the left instance frees its slices: the 1g.10gb at slice 0 now fits.
        await bus.publish(
            AllocationRevoked(
                source="test",
                key=node,
                allocation_id=left.allocation_id,
                job_id=left.job_id,
                node_id=node,
                ledger_version=2,
                reason="preempted",
            )
        )

        async def left_gone() -> bool:
            return left.allocation_id not in await in_force()

        await eventually(left_gone, what="revoked MIG instance destroyed")
        again = grant(node, [0], runtime_s=600, enforcement=Enforcement(mig_instances=["0:1g.10gb@0"]))
        await bus.publish(again)
        await eventually(lambda: _started(bus, again.job_id), what="1g.10gb placed where the 3g was")
        assert (await in_force())[again.allocation_id]["mig_instances"] == ["0:1g.10gb@0"]


async def _started(bus: Bus, job_id: str) -> bool:
    return bool(await events_on(bus, "IBPOOL_JOB", JobStarted.subject(job_id)))
