"""The Slurm bridge service against a real Slurm (Debian's slurmctld and a slurmd per node, munge) and
the real bus and store: ibpool's cordons drain and resume Slurm nodes, an operator's drain is left
alone, a restarted bridge changes nothing twice, and a topology the fabric monitor publishes becomes
Slurm's topology.conf."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ibpool_cli.run import ServiceProcess
from ibpool_core.slurm_bridge import SlurmNode, parse_scontrol_nodes
from ibpool_fabric_monitor.bootstrap import bootstrap as fabric_monitor_bootstrap
from ibpool_fabric_monitor.config import FabricMonitorConfig
from ibpool_failover_controller.bootstrap import bootstrap as controller_bootstrap
from ibpool_proto import decode
from ibpool_proto.health import Cordoned, Uncordoned
from ibpool_proto.slurm import SlurmNodeChanged
from ibpool_runtime import slurmstack
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store
from ibpool_slurm_bridge.bootstrap import bootstrap as bridge_bootstrap
from ibpool_slurm_bridge.config import SlurmBridgeConfig
from tests.integration.agent_support import QUIET_GPUS_ENV, agent_process, unique_prefix
from tests.integration.helpers import eventually, own_store, stream_messages
from tests.integration.slurm_support import munge_socket
from tests.integration.test_failover_connections import all_healthy
from tests.integration.test_failover_controller import SLOW_BEATS, controller_kit, running, stop_process

__all__ = ["munge_socket"]


@pytest.fixture
def prefix() -> str:
    return f"sb{uuid.uuid4().hex[:6]}"


@pytest.fixture
def slurm(munge_socket: Path, tmp_path: Path, prefix: str) -> Iterator[slurmstack.Cluster]:
    nodes = [f"{prefix}-{i}" for i in range(1, 5)]
    # a first topology.conf (one switch), so slurmctld runs topology/tree and reads the bridge's later
    first = f"SwitchName=s0 Nodes={','.join(nodes)}\n"
    with slurmstack.cluster(
        tmp_path / "slurm", munge_socket, nodes, topology=first, slurmd=nodes, gpus_per_node=4
    ) as cluster:
        yield cluster


async def nodes_of(slurm: slurmstack.Cluster) -> dict[str, SlurmNode]:
    return parse_scontrol_nodes(await asyncio.to_thread(slurm.scontrol, "show", "node", "--details", "--oneliner"))


@asynccontextmanager
async def bridge(store: Store, bus: Bus, slurm: slurmstack.Cluster, prefix: str, **cfg: Any) -> AsyncIterator[Any]:
    """A bridge on `store`: the same store (and durable) again is the same bridge restarted."""
    config = SlurmBridgeConfig(
        instance="t",
        slurm_conf=str(slurm.conf),
        durable_prefix=f"{prefix}-bridge",
        sync_interval_s=0.5,
        **cfg,
    )
    kit = Kit(name="slurm_bridge", config=config, bus=bus, store=store, metrics=ServiceMetrics("slurm_bridge"))
    service = Service(kit, await bridge_bootstrap(kit))
    await service.start()
    try:
        yield kit
    finally:
        await service.stop()


def actions(kit: Kit[Any]) -> float:
    """scontrol updates the bridge made (drains and resumes)."""
    return sum(
        s.value
        for m in kit.metrics.registry.collect()
        if m.name == "ibpool_slurm_bridge_actions"
        for s in m.samples
        if s.name.endswith("_total")
    )


async def test_cordons_drain_and_resume_slurm_nodes_and_an_operators_drain_is_left_alone(
    store: Store, bus: Bus, slurm: slurmstack.Cluster, prefix: str
) -> None:
    n1, n2, n3, n4 = (f"{prefix}-{i}" for i in range(1, 5))

    async def all_idle() -> bool:
        return all("IDLE" in n.state for n in (await nodes_of(slurm)).values())

    await eventually(all_idle, timeout_s=30, what="every slurmd registered")
    await asyncio.to_thread(slurm.scontrol, "update", f"NodeName={n4}", "State=DRAIN", "Reason=bad DIMM, ticket 4711")

    async with bridge(store, bus, slurm, prefix) as kit:
        await bus.publish(Cordoned(source="test", key=n1, node_id=n1, scope="node", reason="no heartbeat for 3.1 s"))
        await bus.publish(Cordoned(source="test", key=n2, node_id=n2, scope="gpu", gpu_index=5, reason="XID 48"))
        await bus.publish(Cordoned(source="test", key=n4, node_id=n4, scope="node", reason="no heartbeat"))

        async def drained() -> bool:
            nodes = await nodes_of(slurm)
            return nodes[n1].drained and nodes[n2].drained

        await eventually(drained, timeout_s=15, what="the cordoned nodes drained in Slurm")

        async def told(node: str, check: Any) -> bool:
            return any(check(e) for e in await slurm_news(bus, node))

        # what Slurm shows comes back as events: every node once at start, then each change
        await eventually(
            lambda: told(n1, lambda e: e.drained_by_ibpool and "DRAIN" in e.state and e.slurm_node == n1),
            timeout_s=15,
            what=f"SlurmNodeChanged: {n1} drained by ibpool",
        )
        assert await told(n4, lambda e: "DRAIN" in e.state and not e.drained_by_ibpool and e.gpus == 4)
        assert await told(n3, lambda e: e.state == ["IDLE"] and e.gpus == 4 and e.gpus_allocated == 0)
        nodes = await nodes_of(slurm)
        assert nodes[n1].reason == "ibpool: node: no heartbeat for 3.1 s"
        assert nodes[n2].reason == "ibpool: gpu 5: XID 48"
        assert nodes[n4].reason == "bad DIMM, ticket 4711"  # the operator's drain, not drained over
        assert not nodes[n3].drained
        assert actions(kit) == 2

        await bus.publish(Uncordoned(source="test", key=n1, node_id=n1, scope="node"))

        async def resumed() -> bool:
            return not (await nodes_of(slurm))[n1].drained

        await eventually(resumed, timeout_s=15, what=f"{n1} resumed after its cordon was lifted")
        await asyncio.sleep(1.5)  # three more rounds
        assert actions(kit) == 3

    # a restarted bridge reads back from Slurm what it drained: nothing is done twice
    async with bridge(store, bus, slurm, prefix) as kit:
        await asyncio.sleep(2.0)
        assert actions(kit) == 0
        nodes = await nodes_of(slurm)
        assert nodes[n2].drained and nodes[n2].reason == "ibpool: gpu 5: XID 48"
        assert not nodes[n1].drained and nodes[n4].reason == "bad DIMM, ticket 4711"
        await bus.publish(Uncordoned(source="test", key=n4, node_id=n4, scope="node"))
        await bus.publish(Uncordoned(source="test", key=n2, node_id=n2, scope="gpu", gpu_index=5))
        await eventually(lambda: _not_drained(slurm, n2), timeout_s=15, what=f"{n2} resumed")
        nodes = await nodes_of(slurm)
        assert nodes[n4].drained and nodes[n4].reason == "bad DIMM, ticket 4711"  # never resumed by ibpool


async def slurm_news(bus: Bus, node: str) -> list[SlurmNodeChanged]:
    return [decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_SLURM", SlurmNodeChanged.subject(node))]


async def test_the_gpus_slurm_jobs_hold_come_back_as_events(
    store: Store, bus: Bus, slurm: slurmstack.Cluster, prefix: str
) -> None:
    n1 = f"{prefix}-1"

    async def registered() -> bool:
        return all("IDLE" in n.state and n.gpus == 4 for n in (await nodes_of(slurm)).values())

    await eventually(registered, timeout_s=30, what="every slurmd registered with 4 GPUs")
    async with bridge(store, bus, slurm, prefix):
        job = await asyncio.to_thread(
            slurm.run, "sbatch", "-w", n1, "--gres=gpu:3", "-o", "/dev/null", "--wrap", "sleep 120"
        )
        assert job.returncode == 0, job.stderr
        try:

            async def held() -> bool:
                return any(e.gpus_allocated == 3 and e.gpus == 4 for e in await slurm_news(bus, n1))

            await eventually(held, timeout_s=20, what="SlurmNodeChanged: 3 of n1's 4 GPUs held by a Slurm job")
        finally:
            await asyncio.to_thread(slurm.run, "scancel", job.stdout.split()[-1])


async def _not_drained(slurm: slurmstack.Cluster, node: str) -> bool:
    return not (await nodes_of(slurm))[node].drained


async def test_a_published_topology_becomes_slurms_topology_conf(
    stack: StackInfo, bus: Bus, slurm: slurmstack.Cluster, prefix: str
) -> None:
    monitor_cfg = FabricMonitorConfig(
        instance=prefix,
        generate="fat_tree_2tier:hosts=4,radix=4",
        host_name_format=prefix + "-{:d}",
        counter_source="none",
    )
    topology_file = slurm.folder / "topology.conf"
    async with own_store(stack, f"fabric_monitor_{prefix}") as monitor_store:
        monitor_kit = Kit(
            name="fabric_monitor", config=monitor_cfg, bus=bus, store=monitor_store, metrics=ServiceMetrics("fm")
        )
        monitor = Service(monitor_kit, await fabric_monitor_bootstrap(monitor_kit))
        await monitor.start()
        try:
            async with own_store(stack) as store, bridge(store, bus, slurm, prefix, topology_file=str(topology_file)):

                async def taken() -> bool:
                    shown = await asyncio.to_thread(slurm.scontrol, "show", "topology")
                    return "leaf001" in shown and "leaf002" in shown

                await eventually(taken, timeout_s=20, what="Slurm shows the published fabric's leaves")
                text = topology_file.read_text()
                assert "SwitchName=leaf001 Nodes=" in text and "s0" not in text
                previous = (slurm.folder / "topology.conf.previous").read_text()
                assert previous.startswith("SwitchName=s0 ")  # the file it replaced, kept
                shown = await asyncio.to_thread(slurm.scontrol, "show", "topology")
                leaves = [ln for ln in shown.splitlines() if " Level=0 " in ln]
                hosts = await asyncio.to_thread(
                    slurm.scontrol, "show", "hostnames", ",".join(ln.split("Nodes=")[1].split()[0] for ln in leaves)
                )
                assert sorted(hosts.split()) == sorted(f"{prefix}-{i}" for i in range(1, 5))
        finally:
            await monitor.stop()


async def test_a_killed_agents_slurm_node_is_drained_within_seconds_and_resumed_when_it_is_back(
    stack: StackInfo, bus: Bus, store: Store, munge_socket: Path, tmp_path: Path
) -> None:
    """The whole way: a node agent SIGKILLed -> the failover controller fails its node (its bus
    connection closed) -> Cordoned -> the bridge drains the Slurm node with the controller's reason;
    the agent back -> NodeRecovered, Uncordoned -> the bridge resumes it."""
    prefix = unique_prefix()
    nodes = [f"{prefix}-001", f"{prefix}-002"]
    with slurmstack.cluster(tmp_path / "slurm", munge_socket, nodes, slurmd=nodes) as slurm:
        controller = controller_kit(bus, store, connection_events_url=stack.system_nats_url, **SLOW_BEATS)
        async with (
            running("failover_controller", controller, controller_bootstrap) as fc,
            own_store(stack) as bridge_store,
            bridge(bridge_store, bus, slurm, prefix),
        ):
            agent = agent_process(stack, prefix, nodes=2, extra_env=QUIET_GPUS_ENV)
            try:
                await all_healthy(fc.http_url, nodes)
                killed = time.monotonic()
                await stop_process(agent, signal.SIGKILL)

                async def drained() -> bool:
                    shown = await nodes_of(slurm)
                    return all(shown[n].drained for n in nodes)

                await eventually(drained, timeout_s=20, what="both Slurm nodes drained after the agent was killed")
                took = time.monotonic() - killed
                for node in nodes:
                    reason = (await nodes_of(slurm))[node].reason
                    assert reason.startswith("ibpool: node: ") and "bus connection closed" in reason, reason
                assert took < 20, took  # Slurm's own SlurmdTimeout is 300 s by default

                agent = agent_process(stack, prefix, nodes=2, extra_env=QUIET_GPUS_ENV)

                async def resumed() -> bool:
                    shown = await nodes_of(slurm)
                    return not any(shown[n].drained for n in nodes)

                await eventually(resumed, timeout_s=30, what="both Slurm nodes resumed after the agent came back")
            finally:
                await stop_process(agent)


async def test_a_bridge_killed_mid_way_and_started_again_does_each_thing_once(
    stack: StackInfo, bus: Bus, slurm: slurmstack.Cluster, prefix: str, tmp_path: Path
) -> None:
    """The bridge as its own process, SIGKILLed: what it had done stays done, what came while it was
    down is done once it is back, and nothing is done twice (its actions counter, from /metrics)."""
    n1, n2 = f"{prefix}-1", f"{prefix}-2"

    async def all_idle() -> bool:
        return all("IDLE" in n.state for n in (await nodes_of(slurm)).values())

    await eventually(all_idle, timeout_s=30, what="every slurmd registered")
    base = dict(os.environ, IBPOOL_NATS_URL=stack.nats_url, IBPOOL_POSTGRES_DSN=stack.postgres_dsn)

    def process() -> ServiceProcess:  # its store: schema slurm_bridge, kept between the two
        return ServiceProcess.of(
            "slurm_bridge",
            base,
            tmp_path,
            instance=prefix,
            SLURM_CONF=str(slurm.conf),
            DURABLE_PREFIX=f"{prefix}-bridge",
            SYNC_INTERVAL_S="0.5",
        )

    async def actions_of(p: ServiceProcess) -> float:
        async with aiohttp.ClientSession() as http, http.get(f"{p.url}/metrics") as r:
            text = await r.text()
        return sum(
            float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("ibpool_slurm_bridge_actions_total")
        )

    first = process()
    first.start()
    try:
        await bus.publish(Cordoned(source="test", key=n1, node_id=n1, scope="node", reason="no heartbeat"))
        await eventually(lambda: _drained(slurm, n1), timeout_s=20, what=f"{n1} drained")
        first.kill()
        first.wait()
        # while it is down: n1's cordon lifted, n2 cordoned
        await bus.publish(Uncordoned(source="test", key=n1, node_id=n1, scope="node"))
        await bus.publish(Cordoned(source="test", key=n2, node_id=n2, scope="node", reason="XID 79"))
    finally:
        first.terminate()
    again = process()
    again.start()
    try:
        await eventually(lambda: _drained(slurm, n2), timeout_s=20, what=f"{n2} drained by the restarted bridge")
        await eventually(lambda: _not_drained(slurm, n1), timeout_s=20, what=f"{n1} resumed by the restarted bridge")
        await asyncio.sleep(2.0)  # four more rounds
        assert await actions_of(again) == 2  # one resume, one drain: nothing done twice
    finally:
        again.terminate()
        again.wait()


async def _drained(slurm: slurmstack.Cluster, node: str) -> bool:
    return (await nodes_of(slurm))[node].drained
