"""The scheduling cycle's incremental read of the live jobs (`state.LiveJobs`), on real Postgres: after a
whole first read, each read fetches only the rows written since the previous one, and still ends with
exactly what a whole read returns, also when a transaction that was open during a read commits after
it, or when a later submission commits before an earlier one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import msgspec

from ibpool_core.pool.ledger import Ledger
from ibpool_core.sched import records as jobs
from ibpool_core.sched.book import LiveBook
from ibpool_core.sched.pool_cycle import taken_in_flight
from ibpool_core.sched.records import JobRecord
from ibpool_proto.job import JobSpec
from ibpool_proto.pool import ResourceRequest
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store
from ibpool_scheduler import state
from ibpool_scheduler.service import record_from_spec
from tests.integration.helpers import own_store

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def record(job_id: str) -> JobRecord:
    spec = JobSpec(name=job_id, tenant="t", queue="q", request=ResourceRequest(kind="whole", gpus_per_host=1))
    made = record_from_spec(job_id, spec, NOW)
    assert isinstance(made, JobRecord)
    return made


async def whole(store: Store) -> list[tuple[str, str]]:
    return [(j.job_id, j.state) for j in await state.live_jobs(store.pool)]


async def incremental(live: state.LiveJobs, store: Store) -> list[tuple[str, str]]:
    async with store.pool.acquire() as conn:
        records = await live.read(conn)
    kept_as_walked(live, records)
    return [(j.job_id, j.state) for j in records]


def kept_as_walked(live: state.LiveJobs, records: Sequence[JobRecord]) -> None:
    """What the cache keeps as rows change is what a walk over the jobs it read finds."""
    assert dict(live.by_id) == {j.job_id: j for j in records}
    if isinstance(records, LiveBook):  # the book's own indexes
        assert records.queued() == [j for j in records if j.state == "queued"]
        assert records.held.ids == [j.job_id for j in records if j.state != "queued"]
    assert live.tally() == state.tally_of(records)
    assert live.queued == sum(1 for j in records if j.state == "queued")
    assert live.replacing() == [j for j in records if j.holding and j.replacing is not None and j.replace_id is None]
    assert live.in_flight(Ledger()) == taken_in_flight(Ledger(), records)


async def read_once(store: Store, *job_ids: str) -> state.LiveJobs:
    """The scheduler's tables, `job_ids` submitted, and a first (whole) read of them."""
    await store.migrate(state.MIGRATIONS)
    async with store.transaction() as tx:
        await state.insert_many(tx, [record(j) for j in job_ids], NOW)
    live = state.LiveJobs()
    await incremental(live, store)
    return live


async def rows_read(live: state.LiveJobs, store: Store) -> int:
    """How many job rows the next read fetches (without taking them in)."""
    assert live._xmin is not None
    async with store.pool.acquire() as conn:
        rows = await conn.fetch("SELECT count(*) AS n FROM jobs WHERE changed_xid >= $1::xid8", live._xmin)
    return int(rows[0]["n"])


async def test_reads_only_what_changed_and_ends_with_what_a_whole_read_returns(stack: StackInfo) -> None:
    async with own_store(stack) as store:
        await store.migrate(state.MIGRATIONS)
        async with store.transaction() as tx:
            await state.insert_many(tx, [record(f"j{i:02}") for i in range(20)], NOW)
        live = state.LiveJobs()
        assert await incremental(live, store) == await whole(store)
        assert len(await whole(store)) == 20
        first = (await incremental(live, store), live._book.version)
        # Nothing written since: the read fetches no job row and hands back the book unchanged.
        assert await rows_read(live, store) == 0
        assert (await incremental(live, store), live._book.version) == first

        # A job ends, another is scheduled, a third is submitted: three rows are read, not 21.
        async with store.transaction() as tx:
            ended = await state.lock_job(tx, "j03")
            assert ended is not None
            await state.save_job(tx, jobs.finished(ended, "completed", "done", NOW), NOW)
            held = await state.lock_job(tx, "j07")
            assert held is not None
            await state.save_job(tx, msgspec.structs.replace(held, state="scheduled", reason="granted"), NOW)
            await state.insert_many(tx, [record("j20")], NOW)
        assert await rows_read(live, store) == 3
        assert await incremental(live, store) == await whole(store)
        assert ("j03", "queued") not in await whole(store)
        assert ("j07", "scheduled") in await whole(store)
        assert live.tally() == state.Tally({"t": 1}, ["t"]) and live.queued == 19

        # A member of j07 to replace; a 2x4-GPU job of another tenant granted; j07 ends.
        async with store.transaction() as tx:
            held = await state.lock_job(tx, "j07")
            assert held is not None
            await state.save_job(tx, msgspec.structs.replace(held, replacing="n1"), NOW)
            gang = msgspec.structs.replace(record("g"), tenant="u", gpus_per_host=4, hosts=2, state="scheduled")
            await state.insert_many(tx, [gang], NOW)
        assert await incremental(live, store) == await whole(store)
        assert [j.job_id for j in live.replacing()] == ["j07"]
        assert live.tally() == state.Tally({"t": 1, "u": 8}, ["t"])
        async with store.transaction() as tx:
            held = await state.lock_job(tx, "j07")
            assert held is not None
            await state.save_job(tx, jobs.finished(held, "completed", "done", NOW), NOW)
        assert await incremental(live, store) == await whole(store)
        assert live.replacing() == [] and live.tally() == state.Tally({"u": 8}, ["t"])


async def test_a_transaction_open_during_a_read_is_seen_by_the_next_one(stack: StackInfo) -> None:
    async with own_store(stack) as store:
        live = await read_once(store, "a")
        # "late" takes its seq (and its transaction id) first, then "early" commits before it does.
        async with store.pool.acquire() as slow_conn:
            slow = slow_conn.transaction()
            await slow.start()
            try:
                await state.insert_job(slow_conn, record("late"), NOW)
                async with store.transaction() as tx:
                    await state.insert_many(tx, [record("early")], NOW)
                # A read while "late" is uncommitted sees "early" only...
                assert [j for j, _ in await incremental(live, store)] == ["a", "early"]
                # ...and so does the next, which reads the uncommitted transaction's rows again.
                assert [j for j, _ in await incremental(live, store)] == ["a", "early"]
                await slow.commit()
            except BaseException:
                await slow.rollback()
                raise
        # Once it commits, the next read has it, in submission (seq) order as a whole read does.
        assert [j for j, _ in await incremental(live, store)] == ["a", "late", "early"]
        assert await incremental(live, store) == await whole(store)


async def test_an_unchanged_row_keeps_its_record_and_reset_reads_whole(stack: StackInfo) -> None:
    async with own_store(stack) as store:
        await store.migrate(state.MIGRATIONS)
        async with store.transaction() as tx:
            await state.insert_many(tx, [record("a"), record("b")], NOW)
        live = state.LiveJobs()
        async with store.pool.acquire() as conn:
            before = {j.job_id: j for j in await live.read(conn)}
            # "b" written again with the same body (a handler's no-op save): read again, same object.
            async with conn.transaction():
                await conn.execute("UPDATE jobs SET updated_at = now() WHERE job_id = 'b'")
            after = {j.job_id: j for j in await live.read(conn)}
            assert after["a"] is before["a"] and after["b"] is before["b"]
            # After a reset the read is a whole one again.
            await conn.execute("UPDATE jobs SET state = 'completed' WHERE job_id = 'a'")
            live.reset()
            assert live._xmin is None
            assert [j.job_id for j in await live.read(conn)] == ["b"]


async def test_transaction_ids_behind_the_last_read_make_a_whole_read(stack: StackInfo) -> None:
    """A database restored from a backup is behind the ids the cache has seen: its rows written since
    would all look old, so the read starts over instead of trusting the watermark."""
    async with own_store(stack) as store:
        live = await read_once(store, "a")
        async with store.transaction() as tx:
            await state.insert_many(tx, [record("b")], NOW)
        live._xmin = 2**62  # as if a newer database had been read before
        assert await incremental(live, store) == await whole(store) == [("a", "queued"), ("b", "queued")]
        assert live._xmin is not None and live._xmin < 2**62


async def test_a_restarted_server_makes_a_whole_read(stack: StackInfo) -> None:
    """A crash of Postgres may undo cycles that committed without waiting for the disk
    (`state.lock_cycle`): rows go back to what they were, with their old transaction ids, which the
    next incremental read would not fetch. A server that started again since the last read makes
    the read a whole one."""
    async with own_store(stack) as store:
        live = await read_once(store, "a")
        async with store.transaction() as tx:
            held = await state.lock_job(tx, "a")
            assert held is not None
            await state.save_job(tx, msgspec.structs.replace(held, state="proposed", reason="proposed"), NOW)
        assert await incremental(live, store) == [("a", "proposed")]
        # The undone commit: the row as it was, its changed_xid as old as before (the trigger off).
        async with store.pool.acquire() as conn, conn.transaction():
            await conn.execute("ALTER TABLE jobs DISABLE TRIGGER jobs_mark_changed")
            await conn.execute(
                "UPDATE jobs SET state = 'queued', body = $1, changed_xid = '1' WHERE job_id = 'a'",
                state.body_of(held),
            )
            await conn.execute("ALTER TABLE jobs ENABLE TRIGGER jobs_mark_changed")
        assert await incremental(live, store) == [("a", "proposed")]  # the same server: not seen
        live._started = "an earlier start of the server"
        assert await incremental(live, store) == await whole(store) == [("a", "queued")]


async def test_the_history_queries_can_use_the_ended_jobs_index(stack: StackInfo) -> None:
    """A new leader's fair share reads every job that ended lately, cancelled ones too, and the runtime
    model the completed, failed and killed ones: both through `jobs_ended_by_end`, never the whole
    table (with sequential scans off the planner says which it can use)."""
    async with own_store(stack) as store:
        await read_once(store, "a")
        async with store.pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL enable_seqscan = off")
            since = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
            for query, arg in ((state.USAGE_SINCE, since), (state.ENDED_SINCE, since), (state.ENDED_NEWEST, 5)):
                plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + query, arg))
                assert "jobs_ended_by_end" in plan, plan
