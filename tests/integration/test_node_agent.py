"""The node agent against real NATS and Postgres: registration, heartbeats, grants, exits, its API."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import msgspec
import pynvml
from nats.aio.msg import Msg

from ibpool_node_agent.backends import NvmlBackend
from ibpool_proto import decode, decode_as
from ibpool_proto.job import JobExited, JobStarted
from ibpool_proto.node import NodeHeartbeat, NodeRegistered, TelemetryReported
from ibpool_proto.pool import AllocationRevoked, Enforcement, WorkloadSpec
from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus
from ibpool_runtime.store import Store
from services.node_agent.tests.fake_nvml import FakeNvml
from tests.integration.agent_support import grant, running_agent, unique_prefix
from tests.integration.helpers import eventually, job_news, stream_messages


async def events_on(bus: Bus, stream: str, subject: str) -> list:
    return [decode(m.data) for m in await stream_messages(bus.js, stream, subject)]


async def job_events(bus: Bus, kind: type[JobStarted] | type[JobExited], job_id: str) -> list:
    return await job_news(bus.js, kind, job_id)


async def test_agent_registers_heartbeats_and_reports_telemetry(bus: Bus, store: Store) -> None:
    async with running_agent(bus, store, nodes=3) as svc:
        nodes = svc.kit.config.node_prefix

        ids = [f"{nodes}-001", f"{nodes}-002", f"{nodes}-003"]
        # Heartbeats are not stored (core NATS only): read them live.
        beats: set[str] = set()

        async def on_beat(m: Msg) -> None:
            beats.add(decode_as(m.data, NodeHeartbeat).node_id)

        live = await bus.nc.subscribe(NodeHeartbeat.subject_pattern(), cb=on_beat)

        async def beating() -> bool:
            return beats >= set(ids)

        await eventually(beating, what="three nodes heartbeating")
        await live.unsubscribe()
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
            return len(await job_events(bus, JobExited, job)) == n

        await eventually(lambda: exited(short.job_id), what="short job exited")
        await eventually(lambda: exited(oom.job_id), what="oom job killed")
        await eventually(lambda: exited(bad.job_id), what="bad grant refused")
        [e_short] = await job_events(bus, JobExited, short.job_id)
        [e_oom] = await job_events(bus, JobExited, oom.job_id)
        [e_bad] = await job_events(bus, JobExited, bad.job_id)
        assert (e_short.reason, e_short.exit_code) == ("completed", 0)
        assert (e_oom.reason, e_oom.exit_code) == ("oom", 137) and "20000" in e_oom.detail
        assert e_bad.reason == "failed" and "[9]" in e_bad.detail
        assert len(await job_events(bus, JobStarted, short.job_id)) == 1
        assert not await job_events(bus, JobStarted, bad.job_id)

        # the long job runs until revoked
        assert not await job_events(bus, JobExited, long.job_id)
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
        [e_long] = await job_events(bus, JobExited, long.job_id)
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
                "checks": {"bus": True, "store": True, "consumers": True, "dead_letters": True},
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
            return bool(await job_events(bus, JobExited, overlap.job_id))

        await eventually(refused, what="overlapping MIG instance refused")
        [e] = await job_events(bus, JobExited, overlap.job_id)
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
    return bool(await job_events(bus, JobStarted, job_id))


async def test_agent_rides_out_a_bus_outage_and_reannounces(store: Store) -> None:
    """A private nats-server is stopped and started again while the agent runs."""
    state = Path(tempfile.mkdtemp(prefix="ibpool-test-outage-"))
    port = devstack.free_port()
    proc, url, _ = devstack.start_nats(state, port=port)
    bus = await Bus.connect(url, name="outage-test")
    try:
        await bus.ensure_streams()
        async with running_agent(bus, store, nodes=1, telemetry_interval_s=0.1) as svc:
            node = f"{svc.kit.config.node_prefix}-001"
            await eventually(
                lambda: _count(bus, "IBPOOL_NODE", TelemetryReported.subject(node), 1), what="telemetry before"
            )
            stored = await events_on(bus, "IBPOOL_NODE", TelemetryReported.subject(node))
            before = max(s.occurred_at for s in stored)
            proc.terminate()
            proc.wait(timeout=10)
            await eventually(lambda: _true(not bus.connected), what="the agent noticing the outage")

            async def buffering() -> bool:
                return (await _agent_view(svc.http_url))["telemetry_pending"] >= 5

            await eventually(buffering, what="telemetry held while the bus is away")
            held = (await _agent_view(svc.http_url))["telemetry_pending"]
            came_back = datetime.now(UTC)
            proc, _, _ = devstack.start_nats(state, port=port)
            await eventually(lambda: _true(bus.connected), what="reconnect")
            await eventually(
                lambda: _count(bus, "IBPOOL_NODE", NodeRegistered.subject(node), 2), what="node re-announced"
            )

            async def outage_samples() -> list:
                stored = await events_on(bus, "IBPOOL_NODE", TelemetryReported.subject(node))
                return [s for s in stored if before < s.occurred_at < came_back]

            async def delivered() -> bool:
                return len(await outage_samples()) >= held

            await eventually(delivered, what="every sample held during the outage delivered")
            view = await _agent_view(svc.http_url)
            assert view["telemetry_dropped"] == 0 and view["heartbeats_skipped"] > 0
    finally:
        await bus.close()
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(state, ignore_errors=True)


async def _count(bus: Bus, stream: str, subject: str, at_least: int) -> bool:
    return len(await stream_messages(bus.js, stream, subject)) >= at_least


async def _seen(bus: Bus, kind: type[JobStarted] | type[JobExited], job_id: str) -> bool:
    return bool(await job_events(bus, kind, job_id))


async def _true(value: bool) -> bool:
    return value


async def _agent_view(url: str) -> dict:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/agent") as r:
        return msgspec.json.decode(await r.read())


async def test_commands_run_as_processes_with_the_grants_environment(bus: Bus, store: Store, tmp_path: Path) -> None:
    async with running_agent(bus, store, nodes=1, allow_commands=True, work_dir=str(tmp_path), stop_grace_s=2) as svc:
        node = f"{svc.kit.config.node_prefix}-001"
        py = sys.executable
        env = Enforcement(env={"CUDA_VISIBLE_DEVICES": "GPU-test-1", "CUDA_DEVICE_SM_LIMIT": "25"})
        prints_and_fails = grant(node, [1], enforcement=env)
        prints_and_fails = msgspec.structs.replace(
            prints_and_fails,
            workload=WorkloadSpec(
                command=[
                    py,
                    "-c",
                    "import os,sys; print(os.environ['CUDA_VISIBLE_DEVICES'], "
                    "os.environ['CUDA_DEVICE_SM_LIMIT']); sys.exit(3)",
                ]
            ),
        )
        sleeper = msgspec.structs.replace(
            grant(node, [2]), workload=WorkloadSpec(command=[py, "-c", "import time; time.sleep(600)"])
        )
        kills_itself = msgspec.structs.replace(
            grant(node, [3]), workload=WorkloadSpec(command=[py, "-c", "import os,signal; os.kill(os.getpid(), 9)"])
        )
        missing = msgspec.structs.replace(grant(node, [4]), workload=WorkloadSpec(command=["/nonexistent/train"]))
        for g in (prints_and_fails, sleeper, kills_itself, missing):
            await bus.publish(g)

        async def exited(job: str) -> bool:
            return bool(await job_events(bus, JobExited, job))

        for g in (prints_and_fails, kills_itself, missing):
            await eventually(lambda g=g: exited(g.job_id), what=f"{g.job_id} exited")
        [e1] = await job_events(bus, JobExited, prints_and_fails.job_id)
        [e2] = await job_events(bus, JobExited, kills_itself.job_id)
        [e3] = await job_events(bus, JobExited, missing.job_id)
        assert (e1.reason, e1.exit_code) == ("failed", 3)
        assert (tmp_path / f"{prints_and_fails.allocation_id}@{node}" / "output.log").read_text().split() == [
            "GPU-test-1",
            "25",
        ]
        assert (e2.reason, e2.exit_code, e2.detail) == ("signal", 137, "killed by SIGKILL")
        assert e3.reason == "failed" and "cannot start '/nonexistent/train'" in e3.detail
        [started] = await job_events(bus, JobStarted, sleeper.job_id)
        assert started.launcher == "process" and started.pid is not None
        os.kill(started.pid, 0)  # running

        await bus.publish(
            AllocationRevoked(
                source="test",
                key=node,
                allocation_id=sleeper.allocation_id,
                job_id=sleeper.job_id,
                node_id=node,
                ledger_version=2,
                reason="preempted",
            )
        )
        await eventually(lambda: exited(sleeper.job_id), what="revoked process stopped")
        [e4] = await job_events(bus, JobExited, sleeper.job_id)
        assert (e4.reason, e4.detail) == ("revoked", "preempted")

        async def process_gone() -> bool:
            try:
                os.kill(started.pid, 0)
            except ProcessLookupError:
                return True
            return False  # asyncio reaps its children, so no zombie lingers

        await eventually(process_gone, what="the revoked process terminated by SIGTERM")


async def test_commands_are_refused_where_the_agent_does_not_allow_them(bus: Bus, store: Store) -> None:
    async with running_agent(bus, store, nodes=1) as svc:
        node = f"{svc.kit.config.node_prefix}-001"
        g = msgspec.structs.replace(grant(node, [0]), workload=WorkloadSpec(command=["/bin/true"]))
        await bus.publish(g)

        async def refused() -> bool:
            return bool(await job_events(bus, JobExited, g.job_id))

        await eventually(refused, what="command refused")
        [e] = await job_events(bus, JobExited, g.job_id)
        assert e.reason == "failed" and "allow_commands" in e.detail
        assert not await job_events(bus, JobStarted, g.job_id)


async def test_a_restarted_agent_adopts_the_processes_still_running(bus: Bus, store: Store, tmp_path: Path) -> None:
    prefix = unique_prefix()
    settings = {"nodes": 1, "node_prefix": prefix, "allow_commands": True, "work_dir": str(tmp_path)}
    node = f"{prefix}-001"
    g = msgspec.structs.replace(
        grant(node, [0]), workload=WorkloadSpec(command=[sys.executable, "-c", "import time; time.sleep(600)"])
    )
    async with running_agent(bus, store, **settings):
        await bus.publish(g)
        await eventually(lambda: _seen(bus, JobStarted, g.job_id), what="the process started")
    [started] = await job_events(bus, JobStarted, g.job_id)
    assert started.pid is not None
    os.kill(started.pid, 0)  # the agent stopped; its work did not
    async with running_agent(bus, store, **settings):
        await asyncio.sleep(0.5)
        assert not await job_events(bus, JobExited, g.job_id)  # adopted, still running
        os.kill(started.pid, signal.SIGKILL)
        await eventually(lambda: _seen(bus, JobExited, g.job_id), what="the adopted process's end seen")
        [e] = await job_events(bus, JobExited, g.job_id)
        assert e.reason == "lost" and "restarted" in e.detail


async def test_gang_members_on_two_nodes_of_one_agent_each_run_and_exit(bus: Bus, store: Store) -> None:
    async with running_agent(bus, store, nodes=2) as svc:
        prefix = svc.kit.config.node_prefix
        first = grant(f"{prefix}-001", [0, 1], runtime_s=0.3)
        second = msgspec.structs.replace(
            grant(f"{prefix}-002", [0, 1], runtime_s=0.3), allocation_id=first.allocation_id, job_id=first.job_id
        )
        for g in (first, second):
            await bus.publish(g)

        async def both_exited() -> bool:
            return len(await job_events(bus, JobExited, first.job_id)) == 2

        await eventually(both_exited, what="both gang members exited")
        exits = await job_events(bus, JobExited, first.job_id)
        assert sorted(e.node_id for e in exits) == [f"{prefix}-001", f"{prefix}-002"]
        assert all(e.reason == "completed" for e in exits)


async def test_an_agent_hosting_more_nodes_than_its_filters_reads_every_grant_and_runs_only_its_own(
    bus: Bus, store: Store
) -> None:
    async with running_agent(bus, store, nodes=2, max_node_filters=1) as svc:
        prefix = svc.kit.config.node_prefix
        ours = grant(f"{prefix}-002", [0], runtime_s=0.2)
        theirs = grant(f"{prefix}-009", [0], runtime_s=0.2)  # a node of another agent
        for g in (theirs, ours):
            await bus.publish(g)

        async def ours_exited() -> bool:
            return bool(await job_events(bus, JobExited, ours.job_id))

        await eventually(ours_exited, what="the grant on a hosted node ran and exited")
        assert await job_events(bus, JobStarted, theirs.job_id) == []


async def test_workloads_that_exited_before_the_retention_are_deleted(bus: Bus, store: Store, tmp_path: Path) -> None:
    # The agent's table of workloads must not grow with every allocation it ever ran: a restarted
    # agent (and a running one every 10 minutes) deletes those that exited before the retention,
    # with their work directories (output.log).
    prefix = unique_prefix()
    settings = {"node_prefix": prefix, "workload_retention_s": 3600, "work_dir": str(tmp_path)}
    async with running_agent(bus, store, **settings) as svc:
        node = f"{prefix}-001"
        done, kept = grant(node, [0], runtime_s=0.2), grant(node, [1], runtime_s=0.2)
        for g in (done, kept):
            await bus.publish(g)

        async def both_exited() -> bool:
            return await store.pool.fetchval("SELECT count(*) FROM workloads WHERE exited_at IS NOT NULL") == 2

        await eventually(both_exited, what="both workloads exited")
        await store.pool.execute(
            "UPDATE workloads SET exited_at = now() - interval '2 hours' WHERE allocation_id = $1", done.allocation_id
        )
        assert svc.kit.config.workload_retention_s == 3600
    # As a launched process leaves it (these two were simulated): a directory with its output.
    dirs = {g.allocation_id: tmp_path / f"{g.allocation_id}@{node}" for g in (done, kept)}
    for d in dirs.values():
        d.mkdir()
        (d / "output.log").write_text("step 1\n")
    async with running_agent(bus, store, **settings) as svc:

        async def pruned() -> bool:
            return await store.pool.fetchval("SELECT count(*) FROM workloads") == 1

        await eventually(pruned, what="the old workload deleted at the agent's start")
        assert await store.pool.fetchval("SELECT allocation_id FROM workloads") == kept.allocation_id

        async def dir_removed() -> bool:
            return not dirs[done.allocation_id].exists()

        await eventually(dir_removed, what="the old workload's directory deleted with it")
        assert (dirs[kept.allocation_id] / "output.log").read_text() == "step 1\n"
        async with aiohttp.ClientSession() as http, http.get(f"{svc.http_url}/v1/agent") as r:
            assert msgspec.json.decode(await r.read())["exits_by_reason"] == {"completed": 1}


async def test_the_nvml_backend_runs_the_agents_loops_and_an_xid_is_published_between_samples(
    bus: Bus, store: Store
) -> None:
    """The service with NvmlBackend (through the NVML stand-in): registration, telemetry with measured
    host figures, an XID published as it happens (not at the next sample), a failing read counted."""
    nvml = FakeNvml(gpus=2)
    nvml.gpus[1].util, nvml.gpus[1].temperature = 80, 66
    node = f"{unique_prefix()}-gpu"
    backend = NvmlBackend(node, nvml=nvml)
    async with (
        running_agent(bus, store, backends=[backend], telemetry_interval_s=600.0) as svc,
        aiohttp.ClientSession() as http,
    ):

        async def samples() -> list[TelemetryReported]:
            return await events_on(bus, "IBPOOL_NODE", TelemetryReported.subject(node))

        async def registered() -> bool:
            return bool(await events_on(bus, "IBPOOL_NODE", NodeRegistered.subject(node)))

        await eventually(registered, what="the NVML node registered")
        [reg] = await events_on(bus, "IBPOOL_NODE", NodeRegistered.subject(node))
        assert reg.backend == "nvml" and [g.uuid for g in reg.gpus] == ["GPU-fake-0", "GPU-fake-1"]

        async def sampled(count: int) -> bool:
            return len(await samples()) >= count

        await eventually(lambda: sampled(1), what="the first telemetry sample")
        [first] = await samples()
        assert (first.gpus[1].utilization_pct, first.gpus[1].temperature_c) == (80.0, 66.0)
        assert first.host is not None and first.host.memory_used_mib > 0  # this machine, measured
        assert all(g.xids == [] for g in first.gpus)

        # The next sample is 600 s away: only the XID watcher can bring this one now.
        nvml.raise_xid(1, 79)
        await eventually(lambda: sampled(2), timeout_s=10.0, what="the XID published between samples")
        second = (await samples())[1]
        assert [g.xids for g in second.gpus] == [[], [79]]

        nvml.failing["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_GPU_IS_LOST
        nvml.raise_xid(0, 13)
        await eventually(lambda: sampled(3), timeout_s=10.0, what="a sample with a failing read")
        third = (await samples())[2]
        assert [g.xids for g in third.gpus] == [[13], []] and [g.temperature_c for g in third.gpus] == [0.0, 0.0]
        async with http.get(f"{svc.http_url}/metrics") as r:
            text = await r.text()
        line = f'ibpool_node_agent_read_failures_total{{kind="temperature",node_id="{node}"}} 2.0'
        assert line in text, [x for x in text.splitlines() if "read_failures" in x]
