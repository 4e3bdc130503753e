"""Ledger snapshots on real NATS and Postgres: the allocator's log stays bounded, and a ledger replica
starts after the pool stream has dropped the ledger's first events (its 30-day max age).

Without a snapshot, such a replica met an event far past version 1, took it for a gap and replayed
the stream again, forever: a scheduler restarted after a month never scheduled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from ibpool_pool_allocator import service as allocator_service
from ibpool_pool_allocator.service import PoolAllocator
from ibpool_proto.pool import ReleaseAllocation
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.ledger_replica import LEDGER_BUCKET, SNAPSHOT_OBJECT, LedgerReplica, read_object, read_snapshot
from ibpool_runtime.service import StartRefused
from ibpool_runtime.store import Store
from tests.integration.helpers import eventually
from tests.integration.pool_support import unique
from tests.integration.test_pool_allocator import DURABLES, propose, register, running_allocator
from tests.integration.test_scheduler import call, job_id, job_state, pool_of, running_scheduler, until_leading


def release(allocation_id: str) -> ReleaseAllocation:
    return ReleaseAllocation(source="test", key=allocation_id, allocation_id=allocation_id)


async def log_rows(store: Store, where: str = "true", *args: object) -> int:
    return int(await store.pool.fetchval(f"SELECT count(*) FROM ledger_events WHERE {where}", *args))


async def test_a_snapshot_bounds_the_log_and_replicas_and_restarts_start_from_it(
    bus: Bus, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(allocator_service, "LOG_PAGE", 2)  # every catch-up here reads the log page by page
    node = unique("n")
    # b's lease-expiry loop is held back: a tick between the last command and the snapshot would bring
    # b to the log's end before the log is cut, and the catch-up from the snapshot below would not happen.
    async with (
        running_allocator(bus, store) as (service, first),
        running_allocator(bus, store, instance="b", expiry_interval_s=3600.0) as (_, b),
    ):
        version = await register(bus, service, node)
        held = propose(unique("j"), node, 0, version)
        assert (await first.submit(held)).granted
        done = propose(unique("j"), node, 1, first.ledger.version)
        assert (await first.submit(done)).granted
        assert (await b.submit(release(done.id))).events  # b's cache is now at the log's end...
        assert (await first.submit(propose(unique("j"), node, 2, first.ledger.version))).granted  # ...and behind it
        before = await log_rows(store)
        # Counted from here: each allocator's snapshot step at start may already have taken one (a
        # shared durable can hand it nodes registered after an earlier test), and b's expiry tick
        # may be the change that meets the deleted row first.
        rebuilt = b.rebuilds

        at = await first.snapshot_once()
        assert at is not None and at == first.position
        gauge = first.kit.metrics.registry.get_sample_value("ibpool_pool_snapshot_version")
        assert gauge == first.ledger.version  # what operators watch
        assert await first.snapshot_once() is None  # nothing changed since
        # The log before the snapshot is gone; the snapshot's own row stays; one snapshot is kept.
        assert await log_rows(store, "(version, seq) < ($1, $2)", *at) == 0
        assert await log_rows(store) == 1 < before
        assert await store.pool.fetchval("SELECT count(*) FROM ledger_snapshots") == 1

        # b's last event was deleted with the log: on its next change it starts over from the snapshot.
        behind = b.position < at
        assert (await b.submit(propose(unique("j"), node, 3, first.ledger.version))).granted
        assert behind and b.rebuilds > rebuilt, (b.position, at, b.rebuilds, rebuilt)
        assert (await first.submit(release(held.id))).events
        await b.expire_once()  # a change that decides nothing: b catches up
        final = first.ledger
    assert b.ledger == final  # every answer of the past included, not only what is held

    # A restart reads the snapshot and the rows after it, and answers a repeated command as before.
    async with running_allocator(bus, store, instance="c") as (_, restarted):
        assert restarted.ledger == final and restarted.position == first.position
        again = await restarted.submit(held)
        assert again.repeat and again.events and again.events[0].allocation_id == held.id


async def test_a_replica_starts_from_the_snapshot_after_the_stream_dropped_the_ledgers_first_events(
    bus: Bus, store: Store
) -> None:
    node = unique("n")
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def follow(replica: LedgerReplica) -> LedgerReplica:
        tasks.append(asyncio.create_task(replica.run(stop)))
        return replica

    try:
        async with running_allocator(bus, store) as (service, allocator):
            other = unique("n")
            version = await register(bus, service, node, other)
            held = propose(unique("j"), node, 0, version)
            assert (await allocator.submit(held)).granted
            assert (await allocator.submit(propose(unique("j"), node, 1, allocator.ledger.version))).granted

            async def meanwhile() -> None:  # commits racing the snapshot, on another node
                for gpu in range(4):
                    await allocator.submit(propose(unique("j"), other, gpu, allocator.ledger.version))
                    await asyncio.sleep(0)

            taken, _ = await asyncio.gather(allocator.snapshot_once(), meanwhile())
            assert taken is not None
            published = await read_snapshot(bus)
            assert published is not None and published.version <= allocator.ledger.version

            # What 30 days of max age do: the stream keeps none of the events the snapshot holds.
            await bus.js.purge_stream("IBPOOL_POOL", seq=published.stream_seq)
            assert (await bus.js.stream_info("IBPOOL_POOL")).state.first_seq >= published.stream_seq
            assert (await allocator.submit(release(held.id))).events  # a change after the snapshot

            replica = await follow(LedgerReplica(bus))

            async def caught_up() -> bool:
                return replica.caught_up and replica.ledger.version == allocator.ledger.version

            await eventually(caught_up, what="the replica caught up from the snapshot")
            assert replica.replays == 0
            assert replica.ledger.nodes == allocator.ledger.nodes
            assert (
                replica.ledger.allocations == allocator.ledger.allocations and held.id not in replica.ledger.allocations
            )
            assert replica.ledger.past_kept == 0
            # It follows the stream from there.
            later = propose(unique("j"), node, 3, allocator.ledger.version)
            assert (await allocator.submit(later)).granted

            async def followed() -> bool:
                return later.id in replica.ledger.allocations

            await eventually(followed, what="the replica followed a grant after the snapshot")

            # Without a snapshot the same stream cannot be replayed: the first event is a gap, again and again.
            store_ = await bus.js.object_store(LEDGER_BUCKET)
            await store_.delete(SNAPSHOT_OBJECT)
            assert await read_snapshot(bus) is None
            lost = await follow(LedgerReplica(bus))

            async def gaps() -> bool:
                return lost.replays >= 1

            await eventually(gaps, what="a replica without a snapshot meets a gap")
            assert not (lost.caught_up and lost.ledger.version == allocator.ledger.version)
    finally:
        stop.set()
        for t in tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 10)


async def one_grant_snapshotted(bus: Bus, store: Store) -> tuple[int, int]:
    """Run an allocator that registers a node, grants one job and snapshots; the snapshot's position."""
    node = unique("n")
    async with running_allocator(bus, store) as (service, allocator):
        version = await register(bus, service, node)
        assert (await allocator.submit(propose(unique("j"), node, 0, version))).granted
        at = await allocator.snapshot_once()
        assert at is not None
        return at


async def test_a_snapshot_stored_but_never_published_is_published_at_the_next_start(bus: Bus, store: Store) -> None:
    # A crash between storing a snapshot and putting it to the bucket, or a bucket lost with the NATS
    # servers' storage: nothing changes in the ledger, yet the replicas must get the snapshot again.
    at = await one_grant_snapshotted(bus, store)
    await (await bus.js.object_store(LEDGER_BUCKET)).delete(SNAPSHOT_OBJECT)
    assert await read_snapshot(bus) is None
    async with running_allocator(bus, store, instance="again") as (_, restarted):

        async def published() -> bool:
            snapshot = await read_snapshot(bus)
            return snapshot is not None and snapshot.version == restarted.ledger.version

        await eventually(published, what="the stored snapshot published again at start")
        assert restarted.snapshot_at == restarted.published_at == at  # not stored a second time
        assert await store.pool.fetchval("SELECT count(*) FROM ledger_snapshots") == 1


async def test_an_allocator_refuses_to_start_from_a_snapshot_of_a_ledger_format_it_cannot_read(
    bus: Bus, store: Store
) -> None:
    at = await one_grant_snapshotted(bus, store)
    await store.pool.execute("UPDATE ledger_snapshots SET format = 99")
    try:
        commands = f"{DURABLES}-commands"
        before = await bus.js.consumer_info("IBPOOL_POOL", commands)
        with pytest.raises(StartRefused, match=r"ledger format 99; this version reads format 1"):
            async with running_allocator(bus, store, instance="newer"):
                pass
        # Refused before it consumed anything: no command was fetched and failed meanwhile.
        after = await bus.js.consumer_info("IBPOOL_POOL", commands)
        assert after.delivered.consumer_seq == before.delivered.consumer_seq
        assert await store.pool.fetchval("SELECT count(*) FROM ledger_snapshots") == 1
    finally:
        await store.pool.execute("UPDATE ledger_snapshots SET format = 1")
    async with running_allocator(bus, store, instance="again") as (_, again):
        assert again.snapshot_at == at  # the same snapshot, readable again


async def test_a_scheduler_started_after_the_stream_dropped_the_ledgers_first_events_schedules(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    # The end-to-end case of the bug: a scheduler (re)started a month into the cluster's life. It
    # replays no stream from a sequence given by the test, but from the snapshot it finds.
    async with pool_of(bus, stack, 2) as pool:
        allocator: PoolAllocator = pool.allocator.spec.tasks[0].__self__  # type: ignore[attr-defined]

        async def registered() -> bool:
            return set(pool.node_ids) <= set(allocator.ledger.nodes)

        await eventually(registered, what="the nodes in the allocator's ledger")
        await allocator.snapshot_once()  # None when its start already published this ledger
        published = await read_snapshot(bus)
        assert published is not None and published.version == allocator.ledger.version
        await bus.js.purge_stream("IBPOOL_POOL", seq=published.stream_seq)
        async with running_scheduler(bus, store, None, leader_key=f"sched-{pool.prefix}") as (service, sched):  # type: ignore[arg-type]
            await until_leading(sched, pool.node_ids)
            assert sched.feed.from_snapshot and sched.feed.replays == 0
            j = job_id()
            body = {"id": j, "tenant": "t", "gpus": 2, "workload": {"simulated_runtime_s": 0.3}}
            status, _ = await call(service, "POST", "/v1/jobs", body)
            assert status == 201

            async def completed() -> bool:
                return (await job_state(service, j))["state"] == "completed"

            await eventually(
                completed, what="a job scheduled, granted and run by a scheduler started from the snapshot"
            )


async def test_an_object_is_read_whole_and_a_cancelled_read_leaves_no_subscription(bus: Bus) -> None:
    bucket = unique("objtest").replace("-", "_")
    store = await bus.js.create_object_store(bucket)
    data = os.urandom(12 * 1024 * 1024)  # about 96 chunks
    await store.put("big", data)
    assert await read_object(bus, bucket, "big") == data
    assert await read_object(bus, bucket, "missing") is None
    assert await read_object(bus, unique("nobucket").replace("-", "_"), "big") is None

    subs_before = len(bus.nc._subs)
    reading = asyncio.create_task(read_object(bus, bucket, "big"))
    for _ in range(100_000):  # until its ordered consumer is subscribed
        if len(bus.nc._subs) > subs_before or reading.done():
            break
        await asyncio.sleep(0)
    assert not reading.done(), "the read ended before it could be cancelled"
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading
    assert len(bus.nc._subs) == subs_before
    await bus.js.delete_object_store(bucket)
