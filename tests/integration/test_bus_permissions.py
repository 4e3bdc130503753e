"""Per-service NATS users on a real nats-server: each may publish only its own subjects.

A private nats-server runs with the authorization block `ibpool_runtime.bus_permissions` renders.
The admin creates the streams; a node agent's credentials cannot publish an AllocationGranted (the
server refuses it and nothing is stored), the pool allocator's can; a service user starts against
the streams in place but may not create or change them. With the node agent's credentials, no
reply meant for another user can be read, no consumer deleted, and no other service's durable
consumer fetched from, acked on or reconfigured.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.msg import Msg

from ibpool_pool_allocator.bootstrap import bootstrap
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_pool_allocator.service import PoolAllocator
from ibpool_proto import ALL_MESSAGES
from ibpool_proto.job import JobExited, JobExitedV2, JobStarted
from ibpool_proto.message import new_id
from ibpool_proto.node import NodeDeregistered, NodeHeartbeat, TelemetryReported
from ibpool_proto.pool import (
    AllocationGranted,
    Enforcement,
    PoolNodeUpdated,
    RequestAllocation,
    ResourceRequest,
    WorkloadSpec,
)
from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus, BusUnavailable, StreamSetupError, outgoing
from ibpool_runtime.bus_permissions import PUBLISHES, agent_grant, permissions, render_authorization
from ibpool_runtime.ledger_replica import LEDGER_BUCKET, LedgerReplica
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store
from ibpool_runtime.streams import StreamSpec
from proto.tests.message_strategies import sample
from tests.integration.agent_support import running_agent, unique_prefix
from tests.integration.helpers import eventually, job_news, own_store, stream_messages

SUBSCRIBER = Path(__file__).resolve().parents[2] / "examples" / "subscriber.py"
# Two node agents enrolled with users of their own, one node each (bus_permissions.agent_permissions).
ENROLLED_PREFIX = f"enrolled{secrets.token_hex(3)}"
AGENTS = {"agent-a": agent_grant(ENROLLED_PREFIX, 1, 1), "agent-b": agent_grant(ENROLLED_PREFIX, 2, 1)}
USERS = ("admin", "node_agent", "pool_allocator", "operator", "subscriber", "scheduler", "failover_controller", *AGENTS)


@pytest.fixture
async def secured() -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A nats-server with one user per entry of USERS (AGENTS each allowed only its own node); yields
    its address and the passwords."""
    state = Path(tempfile.mkdtemp(prefix="ibpool-test-auth-"))
    passwords = {u: secrets.token_urlsafe(16) for u in USERS}
    proc, url, _ = devstack.start_nats(state, extra_config=render_authorization(passwords, AGENTS))
    try:
        yield url.removeprefix("nats://"), passwords
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(state, ignore_errors=True)


async def connect(address: str, passwords: dict[str, str], user: str) -> Bus:
    return await Bus.connect(f"nats://{user}:{passwords[user]}@{address}", name=f"test-{user}", attempts=2)


def request_for(job: str, gpus: int, workload: WorkloadSpec | None = None) -> RequestAllocation:
    """An operator's request for `gpus` whole GPUs on one host for `job`."""
    return RequestAllocation(
        source="operator",
        key=job,
        job_id=job,
        tenant="t",
        queue="default",
        request=ResourceRequest(kind="whole", gpus_per_host=gpus),
        workload=workload,
    )


def granted(node_id: str) -> AllocationGranted:
    return AllocationGranted(
        source="forged",
        key=node_id,
        allocation_id="a-forged",
        job_id="j-forged",
        node_id=node_id,
        kind="whole",
        assignments=[],
        enforcement=Enforcement(),
        lease_expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5),
        ledger_version=1,
    )


async def test_only_the_allocator_may_publish_a_grant(secured: tuple[str, dict[str, str]]) -> None:
    address, passwords = secured
    admin = await connect(address, passwords, "admin")
    agent = await connect(address, passwords, "node_agent")
    allocator = await connect(address, passwords, "pool_allocator")
    try:
        await admin.ensure_streams()
        await agent.ensure_streams()  # in place as declared: nothing to change, so allowed
        ack = await agent.publish(NodeDeregistered(source="t", key="n1", node_id="n1", reason="test"))
        assert ack.stream == "IBPOOL_NODE"

        forged = outgoing(granted("n1"))
        with pytest.raises(nats.errors.TimeoutError):  # the server refuses it: no ack ever comes
            await agent.js.publish(forged.subject, forged.body, headers=forged.headers, timeout=1.0)
        assert await stream_messages(admin.js, "IBPOOL_POOL", AllocationGranted.subject("n1")) == []

        real = granted("n2")
        assert (await allocator.publish(real)).stream == "IBPOOL_POOL"
        [stored] = await stream_messages(admin.js, "IBPOOL_POOL", AllocationGranted.subject("n2"))
        assert stored.headers["ce-id"] == real.id
    finally:
        for b in (admin, agent, allocator):
            await b.close()


async def test_heartbeats_go_live_to_who_may_read_them_and_are_not_stored(secured: tuple[str, dict[str, str]]) -> None:
    address, passwords = secured
    admin = await connect(address, passwords, "admin")
    agent = await connect(address, passwords, "node_agent")
    readers = {u: await connect(address, passwords, u) for u in ("failover_controller", "scheduler")}
    got: dict[str, list[str]] = {u: [] for u in readers}
    try:
        await admin.ensure_streams()
        for user, bus in readers.items():

            async def on_beat(m: Msg, user: str = user) -> None:
                got[user].append(m.subject)

            await bus.nc.subscribe(NodeHeartbeat.subject_pattern(), cb=on_beat)
            await bus.nc.flush()
        await agent.publish_unacked(NodeHeartbeat(source="t", key="n1", node_id="n1", seq=1, interval_s=1.0))
        await agent.nc.flush()

        async def delivered() -> bool:
            return bool(got["failover_controller"])

        await eventually(delivered, timeout_s=5, what="the heartbeat reached the failover controller's user")
        assert got["failover_controller"] == [NodeHeartbeat.subject("n1")]
        assert got["scheduler"] == []  # its user may not subscribe there: the server sends it nothing
        info = await admin.js.stream_info("IBPOOL_NODE")
        assert info.state.messages == 0 and "ibpool.node.>" not in info.config.subjects
    finally:
        for b in (admin, agent, *readers.values()):
            await b.close()


async def test_a_service_user_may_not_create_or_change_streams(secured: tuple[str, dict[str, str]]) -> None:
    address, passwords = secured
    admin = await connect(address, passwords, "admin")
    agent = await connect(address, passwords, "node_agent")
    try:
        with pytest.raises(StreamSetupError, match="cannot create stream IBPOOL_NODE"):
            await agent.ensure_streams()
        # The admin created it with other settings than declared: the agent may not bring it in line.
        await admin.ensure_streams(specs=[StreamSpec("IBPOOL_NODE", ("ibpool.node.>",), 3600.0)])
        with pytest.raises(StreamSetupError, match="cannot bring stream IBPOOL_NODE to its declared settings"):
            await agent.ensure_streams()
        await admin.ensure_streams()
        await agent.ensure_streams()
    finally:
        await admin.close()
        await agent.close()


def test_every_published_message_has_exactly_one_owner_among_the_services() -> None:
    services = [u for u in PUBLISHES if u not in ("operator", "subscriber")]
    owners: dict[str, list[str]] = {}
    for s in services:
        for m in PUBLISHES[s]:
            owners.setdefault(m.ce_type(), []).append(s)
    assert {t: o for t, o in owners.items() if len(o) > 1} == {}
    anyone = {m.ce_type() for user in PUBLISHES.values() for m in user}
    assert {m.ce_type() for m in ALL_MESSAGES} - anyone == set(), "a message nobody may publish"
    assert "ibpool.pool.allocation.granted.*" in permissions("pool_allocator")["publish"]["allow"]
    assert "ibpool.pool.allocation.granted.*" not in permissions("node_agent")["publish"]["allow"]
    # Its own replies, and the heartbeats, which are not stored and so are read live.
    assert permissions("subscriber")["subscribe"]["allow"] == ["_INBOX_subscriber.>", "ibpool.node.heartbeat.sent.*"]
    assert not any("CONSUMER.DELETE" in p for u in PUBLISHES for p in permissions(u)["publish"]["allow"])


@pytest.mark.parametrize("agent_user", ["node_agent", "agent-a"])
async def test_allocator_and_agent_work_with_only_their_own_permissions(
    secured: tuple[str, dict[str, str]], stack: devstack.StackInfo, store: Store, agent_user: str
) -> None:
    """Request -> grant -> job started and exited, each service on its own restricted user; the agent
    on the shared agents' user, or enrolled with a user of its own allowed only its node."""
    address, passwords = secured
    admin = await connect(address, passwords, "admin")
    await admin.ensure_streams()
    agent_bus = await connect(address, passwords, agent_user)
    allocator_bus = await connect(address, passwords, "pool_allocator")
    operator = await connect(address, passwords, "operator")
    prefix = unique_prefix() if agent_user == "node_agent" else ENROLLED_PREFIX
    cfg = PoolAllocatorConfig(instance="secured", expiry_interval_s=0.5)
    kit = Kit(name="pool_allocator", config=cfg, bus=allocator_bus, store=store, metrics=ServiceMetrics("pa"))
    spec = await bootstrap(kit)
    pool_allocator: PoolAllocator = spec.tasks[0].__self__  # type: ignore[attr-defined]
    allocator = Service(kit, spec)
    scheduler_bus = await connect(address, passwords, "scheduler")
    try:
        async with own_store(stack) as agent_store, running_agent(agent_bus, agent_store, nodes=1, node_prefix=prefix):
            await allocator.start()
            node = f"{prefix}-001"

            async def in_pool() -> bool:
                return bool(await stream_messages(admin.js, "IBPOOL_POOL", PoolNodeUpdated.subject(node)))

            await eventually(in_pool, what="the agent's node in the allocator's ledger")
            job = f"job-{prefix}"
            ask = request_for(job, 2, WorkloadSpec(simulated_runtime_s=0.2))
            await operator.publish(ask)

            async def ran() -> bool:
                return bool(await job_news(admin.js, JobExited, job))

            await eventually(ran, what="granted, started and exited under restricted users")
            assert await job_news(admin.js, JobStarted, job)
            assert await stream_messages(admin.js, "IBPOOL_DLQ", "ibpool.dlq.>") == []
            # The allocator publishes its ledger snapshot; the scheduler's ledger replica reads it.
            # This call publishes it, unless the allocator's own snapshot loop just did (then: None).
            await pool_allocator.snapshot_once()
            assert pool_allocator.published_at == pool_allocator.position
            replica = LedgerReplica(scheduler_bus)
            ledger, start = await replica.start_point("IBPOOL_POOL")
            assert start is not None and ledger.nodes == pool_allocator.ledger.nodes
            with pytest.raises(nats.errors.TimeoutError):  # not the scheduler's to write
                await scheduler_bus.js.publish(f"$O.{LEDGER_BUCKET}.C.forged", b"x", timeout=1.0)
    finally:
        await allocator.stop()
        for b in (admin, agent_bus, allocator_bus, operator, scheduler_bus):
            await b.close()


async def test_an_enrolled_agent_speaks_only_for_its_own_node(secured: tuple[str, dict[str, str]]) -> None:
    """Agent a's own user reports on its node; news of agent b's node (an XID report, a job's exit, a
    heartbeat) and a read of b's durable are refused by the server, and nothing of it is stored."""
    address, passwords = secured
    admin = await connect(address, passwords, "admin")
    await admin.ensure_streams()
    agent = await connect(address, passwords, "agent-a")
    (mine,), (theirs,) = AGENTS["agent-a"].nodes, AGENTS["agent-b"].nodes
    beats: list[str] = []

    async def on_beat(m: Msg) -> None:
        beats.append(m.subject.rsplit(".", 1)[1])

    await admin.nc.subscribe(NodeHeartbeat.subject_pattern(), cb=on_beat)
    await admin.nc.flush()
    try:
        for node in (mine, theirs):
            telemetry = msgspec.structs.replace(sample(TelemetryReported), key=node, node_id=node, id=new_id())
            exit_ = msgspec.structs.replace(sample(JobExitedV2), key=node, node_id=node, id=new_id())
            for message in (telemetry, exit_):
                out = outgoing(message)
                if node == mine:
                    await agent.js.publish(out.subject, out.body, headers=out.headers, timeout=2)
                else:
                    with pytest.raises(nats.errors.TimeoutError):  # refused: no ack ever comes
                        await agent.js.publish(out.subject, out.body, headers=out.headers, timeout=1)
            beat = msgspec.structs.replace(sample(NodeHeartbeat), key=node, node_id=node, id=new_id())
            await agent.publish_unacked(beat)  # core NATS: the server drops a refused one
        await agent.nc.flush()
        await eventually(lambda: _true(mine in beats), what="agent a's own heartbeat delivered")
        await admin.nc.flush()  # anything the server routed before that is delivered by now
        stored = {(m.subject.rsplit(".", 1)[1]) for m in await stream_messages(admin.js, "IBPOOL_NODE", ">")}
        stored |= {(m.subject.rsplit(".", 1)[1]) for m in await stream_messages(admin.js, "IBPOOL_JOB", ">")}
        assert mine in stored and theirs not in stored and theirs not in beats
        with pytest.raises(nats.errors.TimeoutError):
            await agent.nc.request(
                f"$JS.API.CONSUMER.MSG.NEXT.IBPOOL_POOL.{AGENTS['agent-b'].durable}", b"{}", timeout=1
            )
    finally:
        await admin.close()
        await agent.close()


async def _true(value: bool) -> bool:
    return value


async def test_a_wrong_password_is_refused_and_never_shown(secured: tuple[str, dict[str, str]]) -> None:
    address, _ = secured
    with pytest.raises(BusUnavailable) as e:
        await Bus.connect(f"nats://node_agent:not-the-password@{address}", name="t", attempts=1)
    assert "not-the-password" not in str(e.value) and "node_agent:***@" in str(e.value)


async def test_a_cluster_is_given_as_comma_separated_servers(secured: tuple[str, dict[str, str]]) -> None:
    address, passwords = secured
    pw = passwords["subscriber"]
    dead = f"127.0.0.1:{devstack.free_port()}"
    bus = await Bus.connect(f"nats://subscriber:{pw}@{dead},nats://subscriber:{pw}@{address}", name="t", attempts=2)
    try:
        assert bus.connected
    finally:
        await bus.close()


class ErrorsSeen:
    """The asynchronous errors a raw nats-py connection reports (permission violations come this way)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    async def seen(self, e: Exception) -> None:
        self.errors.append(str(e))


async def test_a_user_reads_only_its_own_inboxes(secured: tuple[str, dict[str, str]]) -> None:
    """The agent's credentials: subscribing to everyone's inboxes or the allocator's is refused, and
    none of the allocator's replies reach it; its own inbox works."""
    address, passwords = secured
    admin = await connect(address, passwords, "admin")
    await admin.ensure_streams()
    allocator = await connect(address, passwords, "pool_allocator")
    seen = ErrorsSeen()
    snoop = await nats.connect(
        f"nats://node_agent:{passwords['node_agent']}@{address}", error_cb=seen.seen, inbox_prefix="_INBOX_node_agent"
    )
    try:
        stolen: list[str] = []

        async def got(msg: object) -> None:
            stolen.append(str(getattr(msg, "subject", "")))

        await snoop.subscribe("_INBOX.>", cb=got)
        await snoop.subscribe("_INBOX_pool_allocator.>", cb=got)
        await snoop.flush()
        for i in range(5):  # each publish is answered on the allocator's inbox
            await allocator.publish(granted(f"n{i}"))
        await asyncio.sleep(0.5)
        assert stolen == []
        violations = [e for e in seen.errors if "permissions violation" in e.lower()]
        assert len(violations) == 2, seen.errors
        # Its own inbox is where its replies come: a JetStream request works.
        assert (await snoop.jetstream().account_info()) is not None
    finally:
        await snoop.close()
        await allocator.close()
        await admin.close()


async def test_no_user_deletes_steals_from_or_reconfigures_another_services_durable(
    secured: tuple[str, dict[str, str]],
) -> None:
    address, passwords = secured
    admin = await connect(address, passwords, "admin")
    await admin.ensure_streams()
    durable = "pool-allocator-commands"
    commands = RequestAllocation.subject_pattern()
    await admin.js.add_consumer("IBPOOL_POOL", durable_name=durable, filter_subject=commands, ack_policy="explicit")
    operator = await connect(address, passwords, "operator")
    agent = await connect(address, passwords, "node_agent")
    try:
        ask = request_for(f"job-{unique_prefix()}", 1)
        await operator.publish(ask)
        refused = (nats.errors.TimeoutError, nats.js.errors.APIError, nats.errors.NoRespondersError)
        with pytest.raises(refused):
            await agent.js.delete_consumer("IBPOOL_POOL", durable)
        with pytest.raises(refused):
            await agent.js.consumer_info("IBPOOL_POOL", durable, timeout=1.0)
        with pytest.raises(refused):  # reconfiguring it (e.g. a filter that lets nothing through)
            await agent.js.add_consumer(
                "IBPOOL_POOL",
                durable_name=durable,
                filter_subject="ibpool.pool.nothing",
                ack_policy="explicit",
                timeout=1.0,
            )
        steal = await agent.js.pull_subscribe_bind(durable, stream="IBPOOL_POOL")
        with pytest.raises(nats.errors.TimeoutError):  # a fetch is a request nobody may answer for it
            await steal.fetch(1, timeout=1.0)
        # Untouched: the allocator's consumer is there, with the command still to deliver.
        info = await admin.js.consumer_info("IBPOOL_POOL", durable)
        assert info.config.filter_subject == commands and info.num_pending + info.num_ack_pending == 1
        assert info.num_ack_pending == 0
    finally:
        for b in (admin, operator, agent):
            await b.close()


async def test_the_durables_table_is_what_the_services_subscribe(bus: Bus, store: Store) -> None:
    """`SERVICE_DURABLES` (what no other user may touch) against each service's real subscriptions."""
    from ibpool_autoscaler.bootstrap import bootstrap as autoscaler
    from ibpool_autoscaler.config import AutoscalerConfig
    from ibpool_fabric_monitor.bootstrap import bootstrap as fabric_monitor
    from ibpool_fabric_monitor.config import FabricMonitorConfig
    from ibpool_failover_controller.bootstrap import bootstrap as failover
    from ibpool_failover_controller.config import FailoverControllerConfig
    from ibpool_runtime.bus_permissions import SERVICE_DURABLES
    from ibpool_runtime.fabric_feed import durable_name
    from ibpool_scheduler.bootstrap import bootstrap as scheduler
    from ibpool_scheduler.config import SchedulerConfig
    from ibpool_slurm_bridge.bootstrap import bootstrap as slurm_bridge
    from ibpool_slurm_bridge.config import SlurmBridgeConfig

    built: dict[str, set[str]] = {}
    services: list[tuple[str, Any, Any]] = [
        ("pool_allocator", bootstrap, PoolAllocatorConfig(instance="t")),
        ("scheduler", scheduler, SchedulerConfig(instance="t")),
        ("failover_controller", failover, FailoverControllerConfig(instance="t")),
        ("autoscaler", autoscaler, AutoscalerConfig(instance="t")),
        ("fabric_monitor", fabric_monitor, FabricMonitorConfig(instance="t", counter_source="agents")),
        ("slurm_bridge", slurm_bridge, SlurmBridgeConfig(instance="t")),
    ]
    for name, boot, cfg in services:
        kit = Kit(name=name, config=cfg, bus=bus, store=Store(store.pool, name), metrics=ServiceMetrics(name))
        spec = await boot(kit)
        feed = durable_name(getattr(cfg, "durable_prefix", ""), kit.source)
        built[name] = {s.durable for s in spec.subscriptions if s.durable != feed}
    assert built == {k: set(v) for k, v in SERVICE_DURABLES.items()}


async def test_the_example_subscriber_reads_as_the_subscriber_user(
    secured: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """examples/subscriber.py on the `subscriber` user: its replies come on `_INBOX_subscriber`."""
    address, passwords = secured
    admin = await connect(address, passwords, "admin")
    await admin.ensure_streams()
    allocator = await connect(address, passwords, "pool_allocator")
    node = f"{unique_prefix()}-sub"
    grant = granted(node)
    try:
        await allocator.publish(grant)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SUBSCRIBER),
            "--nats",
            f"nats://subscriber:{passwords['subscriber']}@{address}",
            "--durable",
            "billing-secured",
            "--state",
            str(tmp_path / "state.json"),
            "--key",
            node,
            "--max",
            "1",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()
        assert f"ce-id={grant.id}" in out.decode() and out.decode().startswith("applied ")
    finally:
        await allocator.close()
        await admin.close()


async def test_services_are_found_from_the_bus_with_their_role_on_restricted_users(
    secured: tuple[str, dict[str, str]], stack: devstack.StackInfo, store: Store
) -> None:
    """The pool allocator and the scheduler, each on its own user, answer the NATS service API; the
    operator's user lists them (name, instance, role, HTTP URL); the node agent's cannot answer for
    them, and an `about` request is answered."""
    from ibpool_runtime.discovery import About, about_subject, services
    from ibpool_scheduler.bootstrap import bootstrap as scheduler_bootstrap
    from ibpool_scheduler.config import SchedulerConfig

    address, passwords = secured
    admin = await connect(address, passwords, "admin")
    await admin.ensure_streams()
    prefix = unique_prefix()
    running: list[Service[Any]] = []
    buses = [admin]
    try:
        async with own_store(stack) as sched_store:
            for user, boot, cfg, st in (
                ("pool_allocator", bootstrap, PoolAllocatorConfig(instance=f"{prefix}-pa"), store),
                ("scheduler", scheduler_bootstrap, SchedulerConfig(instance=f"{prefix}-s"), sched_store),
            ):
                bus = await connect(address, passwords, user)
                buses.append(bus)
                kit = Kit(name=user, config=cfg, bus=bus, store=st, metrics=ServiceMetrics(user))
                service = Service(kit, await boot(kit))
                await service.start()
                running.append(service)
            operator = await connect(address, passwords, "operator")
            buses.append(operator)

            async def both_listed() -> bool:
                found = {v.instance: v for v in await services(operator, wait_s=0.5)}
                return {f"pool_allocator/{prefix}-pa", f"scheduler/{prefix}-s"} <= set(found)

            await eventually(both_listed, what="both services on the NATS service API")
            found = {v.instance: v for v in await services(operator, wait_s=0.5)}
            allocator, scheduler = found[f"pool_allocator/{prefix}-pa"], found[f"scheduler/{prefix}-s"]
            assert (allocator.service, allocator.role, allocator.http_url) == (
                "pool_allocator",
                "active",
                running[0].http_url,
            )
            assert scheduler.service == "scheduler" and scheduler.role in ("leader", "standby")
            assert scheduler.http_url == running[1].http_url and scheduler.version
            reply = await operator.nc.request(about_subject("pool_allocator"), b"", timeout=2)
            about = msgspec.json.decode(reply.data, type=About)
            assert about.service == "pool_allocator" and about.http_url == running[0].http_url
            # The operator's CLI, with only the NATS URL.
            cli = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "ibpool_cli",
                "services",
                "--nats-url",
                f"nats://operator:{passwords['operator']}@{address}",
                "--output",
                "json",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(cli.communicate(), timeout=60)
            assert cli.returncode == 0, err.decode()
            listed = {v["instance"]: v for v in msgspec.json.decode(out)}
            assert listed[f"scheduler/{prefix}-s"]["http_url"] == running[1].http_url
            assert listed[f"pool_allocator/{prefix}-pa"]["role"] == "active"
    finally:
        for s in running:
            await s.stop()
        for b in buses:
            await b.close()
