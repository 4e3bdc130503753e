"""Small helpers the integration tests share: waiting for a condition, reading a stream."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import asyncpg
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from ibpool_proto import decode
from ibpool_proto.job import JobExited, JobStarted
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} did not hold within {timeout_s}s")


async def stream_messages(js: JetStreamContext, stream: str, subject: str, limit: int = 10_000) -> list:
    """Every message stored in `stream` on `subject` (an ephemeral ordered read, no acks)."""
    sub = await js.pull_subscribe(
        subject,
        stream=stream,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, inactive_threshold=5.0),
    )
    out: list = []
    try:
        # Read what was stored when we looked, not what keeps arriving (heartbeats never stop).
        wanted = min(limit, (await sub.consumer_info()).num_pending)
        while len(out) < wanted:
            batch = await sub.fetch(min(256, wanted - len(out)), timeout=5)
            for m in batch:
                await m.ack()
            out.extend(batch)
    finally:
        await sub.unsubscribe()
    return out


async def job_news(js: JetStreamContext, kind: type[JobStarted] | type[JobExited], job_id: str) -> list:
    """A job's starts or exits as agents report them (keyed by node since their v2, so read them all)."""
    messages = await stream_messages(js, "IBPOOL_JOB", kind.subject_pattern())
    return [e for e in (decode(m.data) for m in messages) if isinstance(e, kind) and e.job_id == job_id]


@asynccontextmanager
async def own_store(stack: StackInfo, schema: str | None = None) -> AsyncIterator[Store]:
    """A migrated store in a fresh schema (each service owns its own, as in production), dropped after."""
    schema = schema or f"t_{uuid.uuid4().hex[:12]}"
    s = await Store.connect(stack.postgres_dsn, schema)
    await s.migrate()
    try:
        yield s
    finally:
        await s.close()
        conn = await asyncpg.connect(stack.postgres_dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


def promtool() -> str | None:
    """Prometheus's own tool (Debian's `prometheus` package); `.ci/run` installs it and requires it
    (IBPOOL_REQUIRE_PROMTOOL=1: missing fails the test instead of leaving it to skip)."""
    found = shutil.which("promtool")
    if found is None and os.environ.get("IBPOOL_REQUIRE_PROMTOOL") == "1":
        pytest.fail("promtool is not installed (Debian's prometheus package), and IBPOOL_REQUIRE_PROMTOOL=1")
    return found


async def promtool_check_metrics(tool: str, text: bytes) -> tuple[int, str]:
    """`promtool check metrics` over `text`: its exit status and what it said."""
    proc = await asyncio.create_subprocess_exec(
        tool,
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate(text)
    assert proc.returncode is not None
    return proc.returncode, out.decode()
