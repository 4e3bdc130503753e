"""The outbox relay on real Postgres and NATS: one relay per schema holds its lock, a commit of any
replica wakes it (LISTEN/NOTIFY), and another replica's relay takes over when the holder stops."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import asyncpg
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from ibpool_proto.job import CancelJob
from ibpool_runtime.bus import ATOMIC_BATCH_MIN, Bus, OutgoingMessage, outgoing
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.outbox import OutboxRelay
from ibpool_runtime.store import Store
from ibpool_runtime.streams import StreamSpec
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


async def test_a_relay_cancelled_while_letting_go_lends_no_session_state_to_the_pool(
    bus: Bus, stack: StackInfo
) -> None:
    """The holder's session has the relay lock, `synchronous_commit` off and an idle timeout; a
    give-back cancelled before it undid them closes the connection instead of pooling it with them."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    async with own_store(stack, schema) as store:
        relay = OutboxRelay(store, bus, poll_s=30.0)
        assert await relay._holder() is not None
        letting_go = asyncio.create_task(relay._let_go())
        await asyncio.sleep(0)  # it has started undoing the session (UNLISTEN sent) ...
        letting_go.cancel()  # ... and is cancelled before it finished
        with contextlib.suppress(asyncio.CancelledError):
            await letting_go
        # No session keeps the relay's lock: a connection of its own (not the pool's, whose sessions
        # could take it again as their own) gets it.
        outside = await asyncpg.connect(stack.postgres_dsn)
        try:
            assert await outside.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", relay._lock_key)
            await outside.execute("SELECT pg_advisory_unlock_all()")
        finally:
            await outside.close()
        other = OutboxRelay(store, bus, poll_s=30.0)
        assert await other._holder() is not None
        await other._let_go()


async def test_a_round_deletes_what_the_previous_one_published_and_an_idle_relay_soon_after(
    bus: Bus, stack: StackInfo
) -> None:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    async with own_store(stack, schema) as store:
        relay = OutboxRelay(store, bus, poll_s=30.0, linger_s=0.3)
        first, second = (f"round-{uuid.uuid4().hex[:8]}" for _ in range(2))
        await commit_event(store, first)
        assert await relay.publish_pending() == 1
        assert await store.outbox_lag() == 1  # published, deleted by the next round's statement
        await commit_event(store, second)
        assert await relay.publish_pending() == 1  # the second only: the first is not read again
        assert await store.outbox_lag() == 1
        assert await relay.publish_pending() == 0
        assert await store.outbox_lag() == 0
        assert await _published_once(bus, first) and await _published_once(bus, second)

        # Running, with no commit after it: the round after `linger_s` deletes (the poll is 30 s away).
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        third = f"round-{uuid.uuid4().hex[:8]}"
        await commit_event(store, third)
        began = time.monotonic()
        await eventually(lambda: _counted(relay, 3), what="the third published")
        await eventually(lambda: _lag_is(store, 0), what="the third deleted")
        assert time.monotonic() - began < 10
        stop.set()
        await task
        assert await _published_once(bus, third)


async def _lag_is(store: Store, n: int) -> bool:
    return await store.outbox_lag() == n


async def _holds(relay: OutboxRelay) -> bool:
    return relay._conn is not None


async def _counted(relay: OutboxRelay, n: int) -> bool:
    return relay.published == n


async def _published_once(bus: Bus, job: str) -> bool:
    return await published(bus, job) == 1


def cancels(tag: str, n: int) -> list[OutgoingMessage]:
    return [
        outgoing(CancelJob(source="test", key=f"{tag}-{i:03d}", job_id=f"{tag}-{i:03d}", reason="batch"))
        for i in range(n)
    ]


async def stored(bus: Bus, tag: str) -> list[Msg]:
    msgs = await stream_messages(bus.js, "IBPOOL_JOB", CancelJob.subject_pattern())
    return [m for m in msgs if m.subject.rsplit(".", 1)[-1].startswith(f"{tag}-")]


async def test_a_large_batch_is_stored_as_one_atomic_batch_and_its_repeat_adds_nothing(bus: Bus) -> None:
    assert {"IBPOOL_JOB", "IBPOOL_POOL"} <= bus.atomic_streams, "ensure_streams turned atomic batches on"
    tag = f"atomic-{uuid.uuid4().hex[:8]}"
    batch = cancels(tag, ATOMIC_BATCH_MIN + 4)
    await bus.publish_batch(batch)
    msgs = await stored(bus, tag)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [m.headers["Nats-Msg-Id"] for m in batch], "in order"
    assert len({m.headers["Nats-Batch-Id"] for m in msgs}) == 1, "one atomic batch"
    # A relay that published and stopped before deleting its rows publishes them again: the server
    # refuses the atomic batch (ids it holds), and one by one JetStream drops every copy.
    more = f"more-{uuid.uuid4().hex[:8]}"
    await bus.publish_batch([*batch, *cancels(more, 2)])
    assert len(await stored(bus, tag)) == len(batch)
    assert len(await stored(bus, more)) == 2


async def test_a_small_batch_and_a_stream_without_atomic_batches_are_published_one_by_one(bus: Bus) -> None:
    tag = f"small-{uuid.uuid4().hex[:8]}"
    await bus.publish_batch(cancels(tag, ATOMIC_BATCH_MIN - 1))
    msgs = await stored(bus, tag)
    assert len(msgs) == ATOMIC_BATCH_MIN - 1 and not any("Nats-Batch-Id" in (m.headers or {}) for m in msgs)
    plain = Bus(bus.nc, bus.js)  # a bus that did not see the streams allow atomic batches
    tag = f"plain-{uuid.uuid4().hex[:8]}"
    await plain.publish_batch(cancels(tag, ATOMIC_BATCH_MIN + 4))
    msgs = await stored(bus, tag)
    assert len(msgs) == ATOMIC_BATCH_MIN + 4 and not any("Nats-Batch-Id" in (m.headers or {}) for m in msgs)


async def test_a_stream_made_before_atomic_batches_gets_them_from_ensure_streams(bus: Bus) -> None:
    name = f"T_OLD_{uuid.uuid4().hex[:8].upper()}"
    spec = StreamSpec(name, (f"{name.lower()}.>",), 600.0, description="made before atomic batches")
    await bus.js.add_stream(
        StreamConfig(name=name, subjects=list(spec.subjects), max_age=600.0, description=spec.description)
    )
    try:
        assert not (await bus.js.stream_info(name)).config.allow_atomic
        await bus.ensure_streams(specs=[spec])
        assert (await bus.js.stream_info(name)).config.allow_atomic and name in bus.atomic_streams
    finally:
        await bus.js.delete_stream(name)
