"""Service processes: crash between commit and publish, graceful SIGTERM, and clear start-up failures."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import asyncpg
from nats.js.errors import NotFoundError

from ibpool_node_agent.backends import store_schema
from ibpool_node_agent.config import NodeAgentConfig
from ibpool_proto import decode
from ibpool_proto.job import JobStarted
from ibpool_proto.node import NodeDeregistered, NodeRegistered
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from tests.integration.agent_support import agent_process, grant, unique_prefix
from tests.integration.helpers import eventually, job_news, stream_messages


async def wait_exit(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> int:
    for _ in range(int(timeout_s / 0.05)):
        if proc.poll() is not None:
            return proc.returncode
        await asyncio.sleep(0.05)
    proc.kill()
    raise AssertionError("process did not exit")


def output(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    return proc.stdout.read().decode(errors="replace")


async def registered(bus: Bus, node: str) -> list:
    return await stream_messages(bus.js, "IBPOOL_NODE", NodeRegistered.subject(node))


async def test_sigkill_after_commit_before_publish_then_restart_publishes_exactly_once(
    stack: StackInfo, bus: Bus
) -> None:
    prefix = unique_prefix()
    node = f"{prefix}-001"
    crashed = agent_process(stack, prefix, faults="outbox.before_publish")
    assert await wait_exit(crashed) == -signal.SIGKILL, output(crashed)

    conn = await asyncpg.connect(stack.postgres_dsn)
    try:
        schema = store_schema(NodeAgentConfig(node_prefix=prefix, nodes=1))  # the agent's own
        rows = await conn.fetch(
            f'SELECT event_id FROM "{schema}".outbox WHERE subject = $1', NodeRegistered.subject(node)
        )
    finally:
        await conn.close()
    assert len(rows) == 1, "the registration was committed to the outbox before the crash"
    event_id = rows[0]["event_id"]
    assert await registered(bus, node) == [], "and not published"

    restarted = agent_process(stack, prefix)
    try:

        async def published() -> bool:
            return any(m.headers["ce-id"] == event_id for m in await registered(bus, node))

        await eventually(published, what="the committed registration is published after restart")
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert await wait_exit(restarted) == 0, output(restarted)
    copies = [m for m in await registered(bus, node) if m.headers["ce-id"] == event_id]
    assert len(copies) == 1
    assert decode(copies[0].data).id == event_id


async def test_sigterm_during_a_handler_finishes_it_acks_and_exits_zero(stack: StackInfo, bus: Bus) -> None:
    prefix = unique_prefix()
    node = f"{prefix}-001"
    durable = f"node-agent-{prefix}-1-1"
    proc = agent_process(stack, prefix, faults="handler.delay_s=2")
    try:
        await eventually(lambda: _has(registered(bus, node)), what="agent registered")
        g = grant(node, [0], runtime_s=600)
        await bus.publish(g)

        async def in_flight() -> bool:
            try:
                info = await bus.js.consumer_info("IBPOOL_POOL", durable)
            except NotFoundError:
                return False
            return info.num_ack_pending == 1

        await eventually(in_flight, what="the grant is being handled")
        proc.send_signal(signal.SIGTERM)
        assert await wait_exit(proc) == 0, output(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    info = await bus.js.consumer_info("IBPOOL_POOL", durable)
    assert (info.num_ack_pending, info.num_redelivered, info.num_pending) == (0, 0, 0)
    started = await job_news(bus.js, JobStarted, g.job_id)
    assert len(started) == 1, "the handler's event left through the outbox before exit"
    gone = await stream_messages(bus.js, "IBPOOL_NODE", NodeDeregistered.subject(node))
    assert len(gone) == 1


async def _has(coro) -> bool:  # type: ignore[no-untyped-def]
    return bool(await coro)


async def test_bad_config_fails_at_start_naming_the_field(stack: StackInfo) -> None:
    proc = agent_process(stack, unique_prefix(), extra_env={"IBPOOL_NODE_AGENT_HEARTBEAT_INTERVAL_S": "soon"})
    assert await wait_exit(proc) == 2
    text = output(proc)
    assert "heartbeat_interval_s" in text and "IBPOOL_NODE_AGENT_HEARTBEAT_INTERVAL_S" in text, text


async def test_unreachable_nats_exits_nonzero_with_a_clear_message(stack: StackInfo) -> None:
    proc = agent_process(
        stack,
        unique_prefix(),
        extra_env={
            "IBPOOL_NATS_URL": "nats://127.0.0.1:9",
            "IBPOOL_NODE_AGENT_CONNECT_ATTEMPTS": "2",
            "IBPOOL_NODE_AGENT_CONNECT_BACKOFF_S": "0.1",
        },
    )
    assert await wait_exit(proc) == 1
    assert "cannot reach NATS at nats://127.0.0.1:9 after 2 attempts" in output(proc)


async def test_unreachable_postgres_exits_nonzero_with_a_clear_message(stack: StackInfo) -> None:
    proc = agent_process(
        stack,
        unique_prefix(),
        extra_env={
            "IBPOOL_POSTGRES_DSN": "postgresql://postgres:secret@127.0.0.1:9/postgres",
            "IBPOOL_NODE_AGENT_CONNECT_ATTEMPTS": "2",
            "IBPOOL_NODE_AGENT_CONNECT_BACKOFF_S": "0.1",
        },
    )
    assert await wait_exit(proc) == 1
    text = output(proc)
    assert "cannot reach Postgres at postgresql://postgres:***@127.0.0.1:9/postgres after 2 attempts" in text
    assert "secret" not in text
