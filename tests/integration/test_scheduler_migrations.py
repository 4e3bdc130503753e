"""The scheduler's stored job bodies across a migration: a placement written as `hosts` (before
migration 006) reads back as `ranks` once the migrations ran, on a real Postgres."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import msgspec

from ibpool_core.sched.records import JobPlacement, JobRecord
from ibpool_runtime.store import Store
from ibpool_scheduler.state import MIGRATIONS

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


async def test_a_placement_stored_as_hosts_reads_back_as_ranks(store: Store, tmp_path: Path) -> None:
    before = tmp_path / "before-006"
    before.mkdir()
    for f in sorted(MIGRATIONS.glob("*.sql")):
        if f.name < "006":
            shutil.copy(f, before / f.name)
    await store.migrate(before)
    placed = JobRecord(
        job_id="old",
        tenant="t",
        queue="q",
        gpus_per_host=8,
        hosts=2,
        submitted_at=T0,
        queued_at=T0,
        state="running",
        nodes=["n1", "n2"],
        placement=JobPlacement(ranks=["n2", "n1"], sharp=True, sharp_reason="why", tier=1),
    )
    old = msgspec.json.decode(msgspec.json.encode(placed))
    old["placement"]["hosts"] = old["placement"].pop("ranks")  # the body as written before 006
    unplaced = JobRecord(job_id="new", tenant="t", queue="q", submitted_at=T0, queued_at=T0)
    async with store.pool.acquire() as conn:
        for job_id, body in (("old", old), ("new", msgspec.to_builtins(unplaced))):
            await conn.execute(
                "INSERT INTO jobs (job_id, queue, tenant, state, submitted_at, updated_at, body)"
                " VALUES ($1, 'q', 't', 'running', $2, $2, $3)",
                job_id,
                T0,
                msgspec.json.encode(body).decode(),
            )
    assert await store.migrate(MIGRATIONS) == ["006_placement_ranks.sql"]
    async with store.pool.acquire() as conn:
        rows = {r["job_id"]: r["body"] for r in await conn.fetch("SELECT job_id, body FROM jobs")}
    assert msgspec.json.decode(rows["old"], type=JobRecord) == placed
    assert "hosts" not in msgspec.json.decode(rows["old"])["placement"]
    assert msgspec.json.decode(rows["new"], type=JobRecord) == unplaced
