"""The outbox relay on real Postgres and NATS: one relay per schema holds its lock, a commit of any
replica wakes it (LISTEN/NOTIFY), and another replica's relay takes over when the holder stops."""

from __future__ import annotations

import asyncio
import time
import uuid

from ibpool_proto.job import CancelJob
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.outbox import OutboxRelay
from ibpool_runtime.store import Store
from tests.integration.helpers import eventually, own_store, stream_messages


async def commit_event(store: Store, job: str) -> None:
    async with store.transaction() as tx:
        await tx.outbox(CancelJob(source="test", key=job, job_id=job, reason="relay test"))


async def published(bus: Bus, job: str) -> int:
    return len(await stream_messages(bus.js, "IBPOOL_JOB", CancelJob.subject(job)))


async def test_one_relay_holds_the_schema_is_woken_by_any_replica_and_is_taken_over(bus: Bus, stack: StackInfo) -> None:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    async with own_store(stack, schema) as store_a:
        store_b = await Store.connect(stack.postgres_dsn, schema)
        try:
            # A polls rarely: only the NOTIFY of B's commit can wake it in time.
            relay_a = OutboxRelay(store_a, bus, poll_s=30.0)
            relay_b = OutboxRelay(store_b, bus, poll_s=0.2)
            stop_a, stop_b = asyncio.Event(), asyncio.Event()
            task_a = asyncio.create_task(relay_a.run(stop_a))
            await eventually(lambda: _holds(relay_a), what="relay A holding the schema's lock")
            task_b = asyncio.create_task(relay_b.run(stop_b))
            await asyncio.sleep(0.5)  # B tried: the lock is A's
            assert not await _holds(relay_b)

            first = f"relay-{uuid.uuid4().hex[:8]}"
            began = time.monotonic()
            await commit_event(store_b, first)  # B's commit wakes B, which may not publish, and A by NOTIFY
            await eventually(lambda: _counted(relay_a, 1), what="B's event published by A")
            assert time.monotonic() - began < 10, "woken by the notification, not by A's 30 s poll"
            assert await _published_once(bus, first) and relay_b.published == 0

            stop_a.set()
            await task_a  # A lets the lock go; B takes it at its next try
            second = f"relay-{uuid.uuid4().hex[:8]}"
            await commit_event(store_a, second)
            await eventually(lambda: _counted(relay_b, 1), what="A's event published by B")
            assert await _published_once(bus, second) and relay_a.published == 1
            stop_b.set()
            await task_b
            assert await store_a.outbox_lag() == 0
        finally:
            await store_b.close()


async def test_a_frozen_holder_loses_the_lock_and_another_relay_publishes(bus: Bus, stack: StackInfo) -> None:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    async with own_store(stack, schema) as store_a:
        store_b = await Store.connect(stack.postgres_dsn, schema)
        try:
            # A takes the lock and then never reads again, as a paused process would not.
            frozen = OutboxRelay(store_a, bus, poll_s=0.1, hold_idle_s=1.0)
            assert await frozen._holder() is not None
            relay_b = OutboxRelay(store_b, bus, poll_s=0.2)
            stop_b = asyncio.Event()
            task_b = asyncio.create_task(relay_b.run(stop_b))
            job = f"relay-{uuid.uuid4().hex[:8]}"
            began = time.monotonic()
            await commit_event(store_b, job)
            await eventually(lambda: _counted(relay_b, 1), what="B publishing once A's session was ended")
            took = time.monotonic() - began
            assert 0.8 < took < 10, took  # not before A's idle limit, and soon after it
            assert await _published_once(bus, job)
            stop_b.set()
            await task_b
            await frozen._let_go(broken=True)
        finally:
            await store_b.close()


async def _holds(relay: OutboxRelay) -> bool:
    return relay._conn is not None


async def _counted(relay: OutboxRelay, n: int) -> bool:
    return relay.published == n


async def _published_once(bus: Bus, job: str) -> bool:
    return await published(bus, job) == 1
