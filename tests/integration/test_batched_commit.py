"""One transaction per consumer batch: rows queued for commit, and the allocator's batched ledger commit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from ibpool_core.pool.ledger import Ledger
from ibpool_core.pool.placement import PlacementRequest
from ibpool_pool_allocator import state
from ibpool_pool_allocator.bootstrap import bootstrap
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_pool_allocator.service import PoolAllocator
from ibpool_proto import decode
from ibpool_proto.job import CancelJob
from ibpool_proto.pool import (
    AllocationGranted,
    GpuAssignment,
    ProposePlacement,
    RequestAllocation,
    ResourceRequest,
)
from ibpool_runtime.bus import Bus
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store
from tests.integration.helpers import eventually, stream_messages
from tests.integration.pool_support import registered, unique

QUEUED = "INSERT INTO queued (n) VALUES ($1)"


async def queued_rows(store: Store, conn: Any = None) -> list[int]:
    return [r["n"] for r in await (conn or store.pool).fetch("SELECT n FROM queued ORDER BY id")]


async def test_rows_queued_for_commit_are_written_at_commit_in_order(store: Store) -> None:
    await store.pool.execute("CREATE TABLE queued (id serial PRIMARY KEY, n int NOT NULL)")
    wake = store.outbox_committed()
    wake.clear()
    async with store.transaction() as tx:
        tx.executemany_at_commit(QUEUED, [(1,), (2,)])
        await tx.outbox(CancelJob(source="test", key="j", job_id="j"))
        tx.executemany_at_commit(QUEUED, [(3,)])
        assert await queued_rows(store, tx.conn) == []  # not written yet: one statement at commit
        assert not wake.is_set()
    assert await queued_rows(store) == [1, 2, 3]
    assert await store.outbox_lag() == 1 and wake.is_set()


async def test_rows_queued_in_a_rolled_back_savepoint_are_dropped(store: Store) -> None:
    await store.pool.execute("CREATE TABLE queued (id serial PRIMARY KEY, n int NOT NULL)")
    async with store.transaction() as tx:
        tx.executemany_at_commit(QUEUED, [(1,)])
        with pytest.raises(RuntimeError):
            async with tx.savepoint():
                assert tx.in_savepoint
                tx.executemany_at_commit(QUEUED, [(2,)])
                raise RuntimeError("this event's handler failed")
        async with tx.savepoint():
            tx.executemany_at_commit(QUEUED, [(3,)])
        assert not tx.in_savepoint
        assert await queued_rows(store, tx.conn) == [3]  # written when its savepoint was released
    assert await queued_rows(store) == [3, 1]


async def test_after_commit_calls_run_once_after_the_commit_and_never_after_a_rollback(store: Store) -> None:
    """What the scheduler wakes its cycle with: the call comes once the rows are committed."""
    await store.pool.execute("CREATE TABLE queued (id serial PRIMARY KEY, n int NOT NULL)")
    calls: list[str] = []

    def woken() -> None:
        calls.append("woken")

    async with store.transaction() as tx:
        await tx.conn.execute(QUEUED, 1)
        tx.after_commit(woken)
        tx.after_commit(woken)  # the same call is queued once
        assert calls == [] and await queued_rows(store) == []  # not yet: another connection sees nothing
    assert calls == ["woken"] and await queued_rows(store) == [1]
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await tx.conn.execute(QUEUED, 2)
            tx.after_commit(lambda: calls.append("rolled back"))
            raise RuntimeError("handler failed")
    assert calls == ["woken"] and await queued_rows(store) == [1]


async def test_rolled_back_transaction_writes_no_queued_row(store: Store) -> None:
    await store.pool.execute("CREATE TABLE queued (id serial PRIMARY KEY, n int NOT NULL)")
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            tx.executemany_at_commit(QUEUED, [(1,)])
            raise RuntimeError("the batch failed")
    assert await queued_rows(store) == []


def propose(job: str, node_id: str, gpu: int, version: int) -> ProposePlacement:
    return ProposePlacement(
        source="test",
        key=job,
        job_id=job,
        tenant="t",
        queue="q",
        ledger_version=version,
        assignments=[GpuAssignment(node_id=node_id, gpu_index=gpu, milli=250, memory_mib=20_000)],
    )


def kit_for(bus: Bus, store: Store, prefix: str, instance: str = "test") -> Kit[PoolAllocatorConfig]:
    cfg = PoolAllocatorConfig(instance=instance, durable_prefix=prefix, consumer_batch=32, expiry_interval_s=60.0)
    return Kit(name="pool_allocator", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("pool_allocator"))


async def loaded_from_log(bus: Bus, store: Store) -> Ledger:
    """A second allocator's cache, rebuilt from the log alone."""
    fresh = PoolAllocator(kit_for(bus, store, unique("unused-"), instance="reader"), clock=SystemClock())
    await fresh.load()
    return fresh.ledger


def summary(ledger: Ledger) -> tuple[int, dict[str, list[tuple[str, int, int]]]]:
    return ledger.version, {
        a.allocation_id: sorted((g.node_id, g.gpu_index, g.milli) for g in a.grants)
        for a in ledger.allocations.values()
    }


async def test_commands_of_one_transaction_take_the_lock_once_and_match_the_log(
    bus: Bus, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.migrate(state.MIGRATIONS)
    allocator = PoolAllocator(kit_for(bus, store, unique("pa-")), clock=SystemClock())
    await allocator.load()
    node = unique("n")
    await allocator.submit(registered(node))
    version = allocator.ledger.version
    locks = 0
    real_lock = state.lock_ledger

    async def counting_lock(conn: Any, schema: str) -> None:
        nonlocal locks
        locks += 1
        await real_lock(conn, schema)

    monkeypatch.setattr(state, "lock_ledger", counting_lock)
    # Four fractions of GPU 0 fit; the fifth conflicts with the four granted before it in the same transaction.
    cmds = [propose(unique("j"), node, 0, version) for _ in range(5)]
    async with store.transaction() as tx:
        decisions = [await allocator.commit(tx, allocator.decider(c)) for c in cmds]
        written = await tx.conn.fetchval("SELECT count(*) FROM ledger_events WHERE version > $1", version)
        assert written == 0  # queued, written with one statement at commit
    assert locks == 1
    assert [bool(d.granted) for d in decisions] == [True] * 4 + [False]
    rejection = decisions[4].rejection
    assert rejection is not None and rejection.reason == "conflict"
    assert summary(await loaded_from_log(bus, store)) == summary(allocator.ledger)
    assert await store.outbox_lag() == 6  # the registration's node update, four grants, one rejection

    # The same command again, in a later transaction: the same answer, no second grant.
    again = await allocator.submit(cmds[0])
    assert again.repeat and [g.id for g in again.granted] == [g.id for g in decisions[0].granted]
    assert allocator.rebuilds == 0


@asynccontextmanager
async def running(bus: Bus, store: Store, prefix: str, place: Any) -> AsyncIterator[tuple[Service, PoolAllocator]]:
    kit = kit_for(bus, store, prefix)
    spec = await bootstrap(kit, place=place)
    allocator = spec.tasks[0].__self__  # type: ignore[attr-defined]
    service = Service(kit, spec)
    await service.start()
    try:
        yield service, allocator
    finally:
        await service.stop()


async def test_a_failing_command_does_not_take_its_batch_down(bus: Bus, store: Store) -> None:
    node, bad_job = unique("n"), unique("boom")

    def placer(view: Ledger, want: PlacementRequest) -> list[GpuAssignment] | None:
        # Only the bad command asks the placer (proposals carry their own assignment).
        raise RuntimeError("the placer broke on this request")

    prefix = unique("pa-")
    async with running(bus, store, prefix, placer) as (_, allocator):
        await bus.publish(registered(node))

        async def known() -> bool:
            return node in allocator.ledger.nodes

        await eventually(known, what="node registered")
        version = allocator.ledger.version
    # Stopped: the commands wait in the stream, and the restarted consumer fetches them in one batch.
    good = [propose(unique("j"), node, gpu, version) for gpu in range(3)]
    bad = RequestAllocation(
        source="test", key=bad_job, job_id=bad_job, tenant="t", queue="q", request=ResourceRequest(kind="whole")
    )
    for cmd in [good[0], bad, good[1], good[2]]:
        await bus.publish(cmd)
    async with running(bus, store, prefix, placer) as (_, allocator):

        async def granted() -> bool:
            return all(c.id in allocator.ledger.allocations for c in good)

        await eventually(granted, what="the good commands granted")
        assert bad_job not in {a.job_id for a in allocator.ledger.allocations.values()}
        assert summary(await loaded_from_log(bus, store)) == summary(allocator.ledger)
    grants = [decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_POOL", AllocationGranted.subject(node))]
    assert sorted(g.job_id for g in grants) == sorted(c.job_id for c in good)  # each exactly once
