"""The failover controller against real NATS and Postgres, with a real node agent process and the pool allocator.

Short windows (beats every 0.2 s, failed after 1 s, back after a 1 s stable window) keep it fast;
the killed-agent test allows beats 2 s apart (`SLOW_BEATS`) and the XID and operator tests more
(`LENIENT`), as a loaded machine handles a live agent's beats late.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec

from ibpool_core.fabric.model import Ca, Host, Link, PortRef, Switch, Topology, build_topology
from ibpool_fabric_monitor.bootstrap import bootstrap as fabric_monitor_bootstrap
from ibpool_fabric_monitor.config import FabricMonitorConfig
from ibpool_failover_controller import state as fc_state
from ibpool_failover_controller.bootstrap import bootstrap as controller_bootstrap
from ibpool_failover_controller.config import FailoverControllerConfig
from ibpool_pool_allocator.bootstrap import bootstrap as allocator_bootstrap
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_proto import decode
from ibpool_proto.health import (
    Cordoned,
    DrainRequested,
    GpuFailed,
    NodeFailed,
    NodeRecovered,
    NodeSuspected,
    RequeueRequested,
    Uncordoned,
)
from ibpool_proto.job import JobStarted
from ibpool_proto.node import GpuInfo, GpuSample, NodeHeartbeat, NodeRegistered, TelemetryReported
from ibpool_proto.pool import AllocationGranted, AllocationRevoked, Enforcement, GpuAssignment
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo, free_port
from ibpool_runtime.leader import Leadership
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store
from tests.integration.agent_support import agent_process, unique_prefix
from tests.integration.helpers import eventually, own_store, stream_messages

FAST = {
    "instance": "test",
    "tick_interval_s": 0.1,
    "suspect_after_intervals": 2.5,
    "fail_after_s": 1.0,
    "clear_after_beats": 3,
    "stable_window_s": 1.0,
    # Nodes of earlier tests that were killed without deregistering are replayed from the stream and
    # fail too: the split-brain guard is tested in the unit tests, not here.
    "max_failed_fraction": 1.0,
    "consumer_batch": 256,
    "leader_ttl_s": 1.0,
}

# For tests where only XIDs and operators act: beats handled late on a loaded machine must not make
# the node suspect or fail it meanwhile.
LENIENT = {"suspect_after_intervals": 25.0, "fail_after_s": 10.0}
# For tests where a killed agent must be noticed: beats may come up to 2 s apart (CI saw a 0.5 s gap
# from a live agent on a loaded machine) and the verdict still comes within seconds.
SLOW_BEATS = {"suspect_after_intervals": 10.0, "fail_after_s": 3.0}


@asynccontextmanager
async def running(name: str, kit: Kit[Any], build: Any) -> AsyncIterator[Service[Any]]:
    service = Service(kit, await build(kit))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


def controller_kit(bus: Bus, store: Store, **overrides: Any) -> Kit[FailoverControllerConfig]:
    unique = f"fc-{uuid.uuid4().hex[:8]}"
    cfg = FailoverControllerConfig(**{**FAST, "durable_prefix": unique, "leader_key": unique, **overrides})
    return Kit(name="failover_controller", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("fc"))


def allocator_kit(bus: Bus, store: Store) -> Kit[PoolAllocatorConfig]:
    cfg = PoolAllocatorConfig(instance="test", expiry_interval_s=0.2, durable_prefix=f"pa-{uuid.uuid4().hex[:8]}")
    return Kit(name="pool_allocator", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("pa"))


async def health_events(bus: Bus, kind: type, key: str) -> list[Any]:
    return [decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_HEALTH", kind.subject(key))]


async def get_json(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return r.status, msgspec.json.decode(await r.read())


async def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    for _ in range(200):
        if proc.poll() is not None:
            return
        await asyncio.sleep(0.05)
    proc.kill()


async def test_killed_agent_is_suspected_then_failed_its_grant_revoked_and_it_recovers_after_restart(
    stack: StackInfo, bus: Bus, store: Store
) -> None:
    prefix = unique_prefix()
    node = f"{prefix}-001"
    extra = {"IBPOOL_NODE_AGENT_GPUS_PER_NODE": "2"}
    async with (
        own_store(stack) as allocator_store,
        running("pool_allocator", allocator_kit(bus, allocator_store), allocator_bootstrap) as allocator,
        running("failover_controller", controller_kit(bus, store, **SLOW_BEATS), controller_bootstrap) as controller,
    ):
        agent = agent_process(stack, prefix, extra_env=extra)
        try:
            grant: dict[str, Any] = {}
            job_id = f"job-{prefix}"
            tries = itertools.count()

            async def granted() -> bool:
                # The allocator may place on a node of an earlier test that was killed and is not yet
                # failed; such a grant is released, and each try is a job of its own so that the one on
                # this node has a requeue history of its own (the controller counts hits per job).
                nonlocal job_id
                job_id = f"job-{prefix}-{next(tries)}"
                body = {"job_id": job_id, "tenant": "t", "queue": "q", "request": {"kind": "whole", "gpus": 2}}
                body["workload"] = {"simulated_runtime_s": 600}
                async with aiohttp.ClientSession() as http:
                    async with http.post(f"{allocator.http_url}/v1/allocations", json=body) as r:
                        if r.status != 201:
                            return False
                        grant.update(await r.json())
                    if grant["grants"][0]["node_id"] == node:
                        return True
                    async with http.delete(f"{allocator.http_url}/v1/allocations/{grant['allocation_id']}"):
                        return False

            await eventually(granted, what="a grant on the agent's node")
            allocation_id = grant["allocation_id"]

            async def started() -> bool:
                msgs = await stream_messages(bus.js, "IBPOOL_JOB", JobStarted.subject(node))
                return any(decode(m.data).job_id == job_id for m in msgs)

            await eventually(started, what="the job started on the agent")

            async def known_healthy() -> bool:
                status, body = await get_json(f"{controller.http_url}/health/nodes/{node}")
                return status == 200 and body["status"] == "healthy"

            await eventually(known_healthy, what="the controller sees the node healthy")
            assert not await health_events(bus, NodeSuspected, node)

            await stop_process(agent, signal.SIGKILL)

            async def failed() -> bool:
                return bool(await health_events(bus, NodeFailed, node))

            await eventually(failed, timeout_s=15, what="NodeFailed after the agent was killed")
            [suspected] = await health_events(bus, NodeSuspected, node)
            [failed_event] = await health_events(bus, NodeFailed, node)
            assert suspected.occurred_at <= failed_event.occurred_at
            assert "no heartbeat" in failed_event.reason
            assert [c.scope for c in await health_events(bus, Cordoned, node)] == ["node"]
            assert len(await health_events(bus, DrainRequested, node)) == 1
            [requeue] = await health_events(bus, RequeueRequested, job_id)
            assert (requeue.allocation_id, requeue.attempt, requeue.node_id) == (allocation_id, 1, node)

            async def revoked() -> bool:
                msgs = await stream_messages(bus.js, "IBPOOL_POOL", AllocationRevoked.subject(node))
                return any(decode(m.data).allocation_id == allocation_id for m in msgs)

            await eventually(revoked, what="the pool allocator revoked the failed node's allocation")

            status, body = await get_json(f"{controller.http_url}/health/nodes/{node}")
            assert status == 200 and body["status"] == "failed" and body["cordoned"] is True

            # The agent comes back: heartbeats for the stable window -> recovered and uncordoned.
            agent = agent_process(stack, prefix, extra_env=extra)

            async def recovered() -> bool:
                return bool(await health_events(bus, NodeRecovered, node))

            await eventually(recovered, timeout_s=20, what="NodeRecovered after the agent restarted")
            assert [u.scope for u in await health_events(bus, Uncordoned, node)] == ["node"]
            assert len(await health_events(bus, NodeFailed, node)) == 1, "failed once, no flapping verdicts"

            status, body = await get_json(f"{controller.http_url}/health/verdicts?key={node}&limit=20")
            assert status == 200
            assert [v["type"] for v in reversed(body)] == [
                "NodeSuspected",
                "NodeFailed",
                "Cordoned",
                "DrainRequested",
                "NodeRecovered",
                "Uncordoned",
            ]
        finally:
            await stop_process(agent)


def registration(node: str) -> NodeRegistered:
    gpus = [GpuInfo(index=i, uuid=f"GPU-{node}-{i}", model="H100-80GB", memory_mib=81_920) for i in range(4)]
    return NodeRegistered(
        source="test", key=node, node_id=node, hostname=node, cpu_milli=1000, memory_mib=1000, gpus=gpus, backend="test"
    )


def sample(node: str, gpu: int, xids: list[int]) -> TelemetryReported:
    gpus = [
        GpuSample(
            index=i,
            uuid=f"GPU-{node}-{i}",
            utilization_pct=0.0,
            memory_used_mib=0,
            temperature_c=40.0,
            power_w=100.0,
            xids=xids if i == gpu else [],
        )
        for i in range(4)
    ]
    return TelemetryReported(source="test", key=node, node_id=node, gpus=gpus)


async def test_xid_on_one_gpu_cordons_only_that_gpu_and_requeues_only_its_work(bus: Bus, store: Store) -> None:
    node = f"{unique_prefix()}-x"
    stop = asyncio.Event()

    async def beat() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            await bus.publish_unacked(NodeHeartbeat(source="test", key=node, node_id=node, seq=seq, interval_s=0.2))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    beating = asyncio.create_task(beat())
    try:
        kit = controller_kit(bus, store, **LENIENT)  # heartbeats are not what this test is about
        async with running("failover_controller", kit, controller_bootstrap) as controller:
            await bus.publish(registration(node))
            holders = {}
            for gpu in (1, 2):
                g = AllocationGranted(
                    source="test",
                    key=node,
                    allocation_id=f"a{gpu}-{node}",
                    job_id=f"j{gpu}-{node}",
                    node_id=node,
                    kind="whole",
                    assignments=[GpuAssignment(node_id=node, gpu_index=gpu)],
                    enforcement=Enforcement(),
                    lease_expires_at=registration(node).occurred_at.replace(year=2100),
                    ledger_version=1,
                )
                holders[gpu] = g
                await bus.publish(g)

            async def known() -> bool:
                status, _ = await get_json(f"{controller.http_url}/health/nodes/{node}")
                return status == 200

            await eventually(known, what="the node known to the controller")
            await asyncio.sleep(0.5)  # the grants reach the controller's picture
            await bus.publish(sample(node, 1, [48]))
            await bus.publish(sample(node, 3, [13]))  # an application error: no action

            async def gpu_failed() -> bool:
                return bool(await health_events(bus, GpuFailed, node))

            await eventually(gpu_failed, what="GpuFailed for GPU 1")
            await asyncio.sleep(0.5)
            [failed] = await health_events(bus, GpuFailed, node)
            assert (failed.gpu_index, failed.xid) == (1, 48)
            assert [(c.scope, c.gpu_index) for c in await health_events(bus, Cordoned, node)] == [("gpu", 1)]
            assert await health_events(bus, RequeueRequested, f"j1-{node}")
            assert not await health_events(bus, RequeueRequested, f"j2-{node}")
            assert not await health_events(bus, NodeFailed, node)
            status, body = await get_json(f"{controller.http_url}/health/nodes/{node}")
            assert body["status"] == "healthy"
            assert [(g["index"], g["failed"]) for g in body["gpus"]] == [(1, True)]
            status, _ = await get_json(f"{controller.http_url}/health/nodes?status=sick")
            assert status == 400
    finally:
        stop.set()
        await beating


async def test_two_replicas_elect_one_decider_and_the_standby_takes_over_when_it_stops(bus: Bus, store: Store) -> None:
    key = f"fc-{uuid.uuid4().hex[:8]}"
    kits = [controller_kit(bus, store, durable_prefix=key, leader_key=key, instance=f"r{i}") for i in (1, 2)]
    async with running("a", kits[0], controller_bootstrap) as a, running("b", kits[1], controller_bootstrap) as b:

        async def cluster(service: Service[Any]) -> dict[str, Any]:
            _, body = await get_json(f"{service.http_url}/health/cluster")
            return dict(body)

        async def one_decides() -> bool:
            views = [await cluster(s) for s in (a, b)]
            return sorted(v["deciding"] for v in views) == [False, True]

        await eventually(one_decides, what="exactly one replica deciding")
        views = [await cluster(s) for s in (a, b)]
        leader, standby = (a, b) if views[0]["deciding"] else (b, a)
        old_term = max(v["leader_term"] or 0 for v in views)
        await leader.stop()

        async def took_over() -> bool:
            v = await cluster(standby)
            return bool(v["deciding"]) and (v["leader_term"] or 0) > old_term

        await eventually(took_over, timeout_s=10, what="the standby deciding with a higher term")
        new_term = (await cluster(standby))["leader_term"]
        async with store.pool.acquire() as conn:
            assert not await fc_state.fence(conn, old_term), "the deposed leader's term is refused"
            assert await fc_state.fence(conn, new_term)


async def test_a_leader_that_stops_renewing_is_replaced_after_the_ttl(bus: Bus) -> None:
    key = f"fc-{uuid.uuid4().hex[:8]}"
    first = Leadership(bus, key, "first", ttl_s=1.0)
    second = Leadership(bus, key, "second", ttl_s=1.0)
    assert await first.campaign_once() and first.term is not None
    assert not await second.campaign_once()
    await asyncio.sleep(first.ttl_s + 1.0)  # first never renews

    async def won() -> bool:
        return await second.campaign_once()

    await eventually(won, timeout_s=10, what="the second instance wins after the TTL")
    assert second.term is not None and second.term > first.term
    assert not await first.campaign_once(), "the old holder's renewal fails"
    assert not first.is_leader
    await second.resign()


async def test_runs_as_its_own_process_serves_its_api_and_stops_cleanly_on_sigterm(stack: StackInfo) -> None:
    port = free_port()
    key = f"fc-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "IBPOOL_NATS_URL": stack.nats_url,
        "IBPOOL_POSTGRES_DSN": stack.postgres_dsn,
        "IBPOOL_FAILOVER_CONTROLLER_HTTP_PORT": str(port),
        "IBPOOL_FAILOVER_CONTROLLER_INSTANCE": key,
        "IBPOOL_FAILOVER_CONTROLLER_DURABLE_PREFIX": key,
        "IBPOOL_FAILOVER_CONTROLLER_LEADER_KEY": key,
        "IBPOOL_FAILOVER_CONTROLLER_MAX_FAILED_FRACTION": "1.0",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ibpool_failover_controller",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:

        async def deciding() -> bool:
            try:
                status, body = await get_json(f"http://127.0.0.1:{port}/health/cluster")
            except aiohttp.ClientError:
                return False
            return status == 200 and body["deciding"] is True

        await eventually(deciding, timeout_s=30, what="the controller process deciding")
        status, body = await get_json(f"http://127.0.0.1:{port}/readyz")
        assert status == 200 and body["ready"] is True
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, out.decode(errors="replace")[-2000:]


async def test_bad_xid_overrides_stop_the_process_with_a_message(stack: StackInfo) -> None:
    env = {
        **os.environ,
        "IBPOOL_NATS_URL": stack.nats_url,
        "IBPOOL_POSTGRES_DSN": stack.postgres_dsn,
        "IBPOOL_FAILOVER_CONTROLLER_XID_OVERRIDES": "13=explode",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ibpool_failover_controller",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2
    assert b"xid_overrides item '13=explode'" in out


def unique_fabric(tag: str) -> tuple[Topology, list[str]]:
    """Two leaves of two hosts under a spine; GUIDs and host names of its own, so no other test's links match."""
    base = int(uuid.uuid4().hex[:8], 16) << 16
    spine, leaf1, leaf2 = (f"0x{base + i:016x}" for i in (1, 2, 3))
    switches = [
        Switch(guid=g, name=f"{tag}-{n}", radix=16) for g, n in ((spine, "spine"), (leaf1, "l1"), (leaf2, "l2"))
    ]
    hosts = [Host(name=f"{tag}-h{i}") for i in range(4)]
    cas = [Ca(guid=f"0x{base + 16 + i:016x}", host=f"{tag}-h{i}", name="mlx5_0", rail=0) for i in range(4)]
    links = [
        Link(a=PortRef(leaf1, 1), b=PortRef(spine, 1)),
        Link(a=PortRef(leaf2, 1), b=PortRef(spine, 2)),
    ] + [Link(a=PortRef(cas[i].guid, 1), b=PortRef(leaf1 if i < 2 else leaf2, 2 + i % 2)) for i in range(4)]
    topology = build_topology(name=tag, hosts=hosts, cas=cas, switches=switches, links=links)
    return topology, [ln.link_id for ln in links]


async def test_link_faults_from_the_fabric_monitor_cordon_a_rail_or_a_leaf_once_and_lift_it(
    stack: StackInfo, bus: Bus, store: Store
) -> None:
    tag = unique_prefix()
    topology, links = unique_fabric(tag)
    uplink_l2, cable_h1 = links[1], links[3]
    monitor_cfg = FabricMonitorConfig(
        instance="test", poll_interval_s=0.1, flap_changes=3, flap_window_s=5, clear_after_s=0.5
    )
    async with own_store(stack) as monitor_store:
        monitor_kit = Kit(
            name="fabric_monitor", config=monitor_cfg, bus=bus, store=monitor_store, metrics=ServiceMetrics("fm")
        )

        async def monitor_bootstrap(kit: Kit[FabricMonitorConfig]) -> Any:
            return await fabric_monitor_bootstrap(kit, load_topology=lambda: topology)

        async with (
            running("failover_controller", controller_kit(bus, store), controller_bootstrap) as controller,
            running("fabric_monitor", monitor_kit, monitor_bootstrap) as monitor,
            aiohttp.ClientSession() as http,
        ):

            async def link_map_loaded() -> bool:
                _, body = await get_json(f"{controller.http_url}/health/cluster")
                return bool(body["topology_version"] >= 1)

            await eventually(link_map_loaded, what="the controller fetched the published topology")

            async def inject(link_id: str, kind: str) -> None:
                async with http.post(f"{monitor.http_url}/v1/sim/faults", json={"link_id": link_id, "kind": kind}) as r:
                    assert r.status == 202, await r.text()

            async def clear(link_id: str) -> None:
                async with http.delete(f"{monitor.http_url}/v1/sim/faults/{link_id}") as r:
                    assert r.status == 200

            h1 = f"{tag}-h1"
            await inject(cable_h1, "down")

            async def rail_cordoned() -> bool:
                return bool(await health_events(bus, Cordoned, h1))

            await eventually(rail_cordoned, what="h1's rail cordoned")
            await clear(cable_h1)

            async def rail_lifted() -> bool:
                return bool(await health_events(bus, Uncordoned, h1))

            await eventually(rail_lifted, what="h1's rail uncordoned")
            assert [(c.scope, c.rail) for c in await health_events(bus, Cordoned, h1)] == [("rail", 0)]
            assert [(u.scope, u.rail) for u in await health_events(bus, Uncordoned, h1)] == [("rail", 0)]

            await inject(uplink_l2, "flapping")
            hosts_l2 = [f"{tag}-h2", f"{tag}-h3"]

            async def leaf_cordoned() -> bool:
                return all([await health_events(bus, Cordoned, h) for h in hosts_l2])

            await eventually(leaf_cordoned, what="the hosts of leaf 2 cordoned for multi-node work")
            await asyncio.sleep(1.0)  # the link keeps flapping: still one cordon per host, no storm
            for h in hosts_l2:
                assert [c.scope for c in await health_events(bus, Cordoned, h)] == ["leaf"]
            assert not await health_events(bus, Cordoned, f"{tag}-h0"), "leaf 1 is untouched"
            await clear(uplink_l2)

            async def leaf_lifted() -> bool:
                return all([await health_events(bus, Uncordoned, h) for h in hosts_l2])

            await eventually(leaf_lifted, timeout_s=15, what="the leaf cordon lifted after the link recovered")
            assert not await health_events(bus, NodeFailed, h1), "fabric hosts without an agent are not judged"
