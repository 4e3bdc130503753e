"""Liveness through nats-server's connection advisories, with real agent processes.

The controller reads the servers' client connect/disconnect advisories as the system account's user
(`connection_events_url`). A SIGKILLed agent's connection closes at once: its nodes are failed after
the reconnect grace even with a heartbeat window far longer than the test. A SIGSTOPped agent keeps
its connection: the heartbeat rule fails it. A nats-server restart drops every connection at once:
the agents reconnect and nobody is failed, and so when the server drops (kicks) every agent's
connection while the controller stays connected and sees them all close. A partition between a share of
the agents and the server (a relay that stops passing bytes, closing nothing) is seen only by the
heartbeat rule: past the split-brain guard nobody is failed, within it the cut-off node is.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ibpool_failover_controller.bootstrap import bootstrap as controller_bootstrap
from ibpool_proto.health import ClusterDegraded, NodeFailed, NodeRecovered
from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus
from ibpool_runtime.bus_permissions import render_system_account
from ibpool_runtime.connection_events import open_connections
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store
from tests.integration.agent_support import QUIET_GPUS_ENV, agent_process, unique_prefix
from tests.integration.helpers import eventually
from tests.integration.test_failover_controller import controller_kit, get_json, health_events, running, stop_process

# Heartbeats alone would take 60 s to fail a node here: anything faster is the connection's doing.
NO_HEARTBEAT_VERDICT = {"suspect_after_intervals": 300.0, "fail_after_s": 60.0}


async def healthy(url: str, node: str) -> bool:
    status, body = await get_json(f"{url}/health/nodes/{node}")
    return status == 200 and body["status"] == "healthy"


async def all_healthy(
    url: str, nodes: Iterable[str], timeout_s: float = 30.0, what: str = "every node healthy"
) -> None:
    """Wait until the controller at `url` calls every one of `nodes` healthy."""

    async def check() -> bool:
        return all([await healthy(url, n) for n in nodes])

    await eventually(check, timeout_s=timeout_s, what=what)


async def test_a_killed_agent_is_failed_through_its_closed_connection_within_the_grace(
    stack: StackInfo, bus: Bus, store: Store
) -> None:
    prefix = unique_prefix()
    nodes = [f"{prefix}-001", f"{prefix}-002"]
    kit = controller_kit(bus, store, connection_events_url=stack.system_nats_url, **NO_HEARTBEAT_VERDICT)
    async with running("failover_controller", kit, controller_bootstrap) as controller:
        agent = agent_process(stack, prefix, nodes=2, extra_env=QUIET_GPUS_ENV)
        try:
            await all_healthy(controller.http_url, nodes)
            killed = time.monotonic()
            await stop_process(agent, signal.SIGKILL)

            async def both_failed() -> bool:
                return all([await health_events(bus, NodeFailed, n) for n in nodes])

            await eventually(both_failed, timeout_s=15, what="NodeFailed for both nodes of the killed agent")
            took = time.monotonic() - killed
            for node in nodes:
                [failed] = await health_events(bus, NodeFailed, node)
                assert "bus connection closed" in failed.reason, failed.reason
            # The grace is 1 s; the heartbeat window here is 60 s.
            assert took < 15, took
        finally:
            await stop_process(agent)


async def test_a_hung_agent_keeps_its_connection_and_the_heartbeat_rule_fails_it(
    stack: StackInfo, bus: Bus, store: Store
) -> None:
    prefix = unique_prefix()
    node = f"{prefix}-001"
    kit = controller_kit(
        bus, store, connection_events_url=stack.system_nats_url, suspect_after_intervals=10.0, fail_after_s=3.0
    )
    async with running("failover_controller", kit, controller_bootstrap) as controller:
        agent = agent_process(stack, prefix, extra_env=QUIET_GPUS_ENV)
        try:
            await eventually(lambda: healthy(controller.http_url, node), what="the node healthy")
            agent.send_signal(signal.SIGSTOP)

            async def failed() -> bool:
                return bool(await health_events(bus, NodeFailed, node))

            await eventually(failed, timeout_s=20, what="NodeFailed for the stopped agent's node")
            [event] = await health_events(bus, NodeFailed, node)
            assert "no heartbeat" in event.reason, event.reason
            assert changes(kit, "closed") == 0  # the server still held the hung agent's connection
        finally:
            agent.send_signal(signal.SIGCONT)
            await stop_process(agent)


def changes(kit: Any, change: str) -> float:
    """ibpool_failover_connection_changes_total{change} of the controller."""
    value = kit.metrics.registry.get_sample_value("ibpool_failover_connection_changes_total", {"change": change})
    return float(value or 0.0)


class OwnNats:
    """A nats-server of the test's own (it is restarted, or cut off), with the system account, a bus
    to it with the streams in place, and the agent processes started on it; all ended after."""

    password = "system-pw"

    def __init__(self) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="ibpool-test-nats-"))
        self.port = devstack.free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.system_url = f"nats://system:{self.password}@127.0.0.1:{self.port}"
        self.agents: list[subprocess.Popen[bytes]] = []
        self.server = self.start()

    def start(self) -> subprocess.Popen[bytes]:
        proc, _, _ = devstack.start_nats(self.state, port=self.port, extra_config=render_system_account(self.password))
        return proc

    async def __aenter__(self) -> OwnNats:
        self.bus = await Bus.connect(self.url, name="test")
        await self.bus.ensure_streams()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for agent in self.agents:
            await stop_process(agent)
        await self.bus.close()
        if self.server.poll() is None:
            self.server.terminate()
            self.server.wait(timeout=15)
        shutil.rmtree(self.state, ignore_errors=True)


async def test_a_nats_server_restart_drops_every_connection_and_nobody_is_failed(
    stack: StackInfo, store: Store
) -> None:
    async with OwnNats() as own:
        bus = own.bus
        prefixes = [unique_prefix() for _ in range(3)]
        nodes = [f"{p}-00{k}" for p in prefixes for k in (1, 2)]
        kit = controller_kit(
            bus, store, connection_events_url=own.system_url, suspect_after_intervals=10.0, fail_after_s=6.0
        )
        async with running("failover_controller", kit, controller_bootstrap) as controller:
            env = {**QUIET_GPUS_ENV, "IBPOOL_NATS_URL": own.url}
            own.agents += [agent_process(stack, p, nodes=2, extra_env=env) for p in prefixes]
            await all_healthy(controller.http_url, nodes)
            # The server drops every agent's connection at once (the system account's KICK): each
            # agent reconnects within the grace, and nobody is failed.
            system = await Bus.connect(own.system_url, name="test-kicker")
            try:
                agent_conns = [c for c in await open_connections(system) if c.name.startswith("node_agent/")]
                assert len({c.name for c in agent_conns}) == 3, agent_conns
                for c in agent_conns:
                    await system.nc.request(f"$SYS.REQ.SERVER.{c.server_id}.KICK", f'{{"cid": {c.client_id}}}'.encode())
            finally:
                await system.close()

            async def reconnected() -> bool:
                return changes(kit, "opened") >= 3

            await eventually(reconnected, timeout_s=10, what="the agents reconnected")
            assert changes(kit, "closed") >= 3
            await asyncio.sleep(2.0)
            for node in nodes:
                assert not await health_events(bus, NodeFailed, node), node
            # The server goes away for 2 s (twice the reconnect grace) and comes back on its store.
            own.server.send_signal(signal.SIGTERM)
            own.server.wait(timeout=15)
            await asyncio.sleep(2.0)
            own.server = own.start()

            await all_healthy(controller.http_url, nodes, what="every node healthy after the restart")
            await asyncio.sleep(3.0)  # a verdict that was coming would be out by now
            for node in nodes:
                assert not await health_events(bus, NodeFailed, node), node
                assert await healthy(controller.http_url, node)
            # Every node was cut off at once: if anything was judged, it was the cluster (the guard).
            degraded = await health_events(bus, ClusterDegraded, "cluster")
            assert all(set(d.node_ids) <= set(nodes) for d in degraded)
            recovered = {e.node_id for n in nodes for e in await health_events(bus, NodeRecovered, n)}
            assert recovered <= set(nodes)


class Partition:
    """A TCP relay between some clients and nats-server that can be cut: while cut, nothing passes
    either way and no socket closes (as when a switch between them fails), so neither end notices
    until its pings go unanswered (nats-server and nats-py ping every 2 minutes)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.open = asyncio.Event()
        self.open.set()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Partition:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        self.open.set()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    await self.open.wait()  # cut: hold everything, close nothing
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_a_partition_of_a_share_of_the_agents_fails_none_past_the_guard_and_a_small_one_is_failed(
    stack: StackInfo, store: Store
) -> None:
    async with OwnNats() as own:
        bus = own.bus
        prefixes = [unique_prefix() for _ in range(5)]
        nodes = {p: f"{p}-001" for p in prefixes}
        kit = controller_kit(
            bus,
            store,
            connection_events_url=own.system_url,
            suspect_after_intervals=10.0,
            fail_after_s=3.0,
            max_failed_fraction=0.2,  # 1 of these 5 nodes may be failed at once
        )
        async with (
            running("failover_controller", kit, controller_bootstrap) as controller,
            Partition(own.port) as far,
            Partition(own.port) as near,
        ):
            # Agents 0 and 1 sit behind one switch, agent 2 behind another, 3 and 4 direct.
            via = {prefixes[0]: far.port, prefixes[1]: far.port, prefixes[2]: near.port}
            for p in prefixes:
                env = {**QUIET_GPUS_ENV, "IBPOOL_NATS_URL": f"nats://127.0.0.1:{via.get(p, own.port)}"}
                own.agents.append(agent_process(stack, p, extra_env=env))
            await all_healthy(controller.http_url, nodes.values())

            # 2 of 5 cut off for 6 s (twice the fail window): more than may fail at once.
            far.open.clear()
            await asyncio.sleep(6.0)
            far.open.set()

            await all_healthy(
                controller.http_url, nodes.values(), timeout_s=30, what="the partitioned nodes healthy again"
            )
            for node in nodes.values():
                assert not await health_events(bus, NodeFailed, node), node
            [degraded] = await health_events(bus, ClusterDegraded, "cluster")
            assert sorted(degraded.node_ids) == sorted([nodes[prefixes[0]], nodes[prefixes[1]]])
            assert changes(kit, "closed") == 0  # no connection closed: only heartbeats could tell

            # 1 of 5 cut off: within what may fail, so the heartbeat rule fails it.
            near.open.clear()

            async def failed() -> bool:
                return bool(await health_events(bus, NodeFailed, nodes[prefixes[2]]))

            await eventually(failed, timeout_s=20, what="the one partitioned node failed")
            [event] = await health_events(bus, NodeFailed, nodes[prefixes[2]])
            assert "no heartbeat" in event.reason
            near.open.set()
            for p in (prefixes[0], prefixes[1], prefixes[3], prefixes[4]):
                assert not await health_events(bus, NodeFailed, nodes[p]), p
