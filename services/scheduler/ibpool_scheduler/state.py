"""The scheduler's store: its jobs (live and ended) and the leader fence."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import asyncpg
import msgspec

from ibpool_core.pool.ledger import Ledger
from ibpool_core.sched.book import LiveBook
from ibpool_core.sched.pool_cycle import InFlight
from ibpool_core.sched.records import LIVE, JobRecord
from ibpool_runtime.store import Transaction

MIGRATIONS = Path(__file__).parent / "migrations"

_record = msgspec.json.Decoder(JobRecord)
_encoder = msgspec.json.Encoder()

UPSERT = (
    "INSERT INTO jobs (job_id, queue, tenant, state, submitted_at, updated_at, body)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (job_id) DO UPDATE SET state = $4, updated_at = $6, body = $7"
)


# Body -> record of the bodies this process wrote lately: a later read of such a row (the cycle's,
# a batch's read-ahead) takes the record instead of decoding the body again. A memo, as a body is
# one record (records are frozen); cleared when it grows past `_WRITTEN_MAX`.
_written: dict[str, JobRecord] = {}
_WRITTEN_MAX = 4096


def body_of(job: JobRecord) -> str:
    """The stored body of `job`, remembered for `record_of`."""
    body = _encoder.encode(job).decode()
    if len(_written) >= _WRITTEN_MAX:
        _written.clear()
    _written[body] = job
    return body


def record_of(body: str) -> JobRecord:
    """The record of a stored body."""
    hit = _written.get(body)
    return hit if hit is not None else _record.decode(body)


def row(job: JobRecord, now: dt.datetime) -> tuple[str, str, str, str, dt.datetime, dt.datetime, str]:
    """The `UPSERT` parameters of `job`."""
    return (job.job_id, job.queue, job.tenant, job.state, job.submitted_at, now, body_of(job))


CycleLock = Literal["locked", "busy", "fenced"]


# One statement: the cycle's lock, the commit's durability, and the fence (when there is a term).
_LOCK_CYCLE = (
    "WITH lock AS (SELECT pg_try_advisory_xact_lock(hashtext($1)) AS got FROM set_config('synchronous_commit',"
    " CASE WHEN $3::bool THEN NULL ELSE 'off' END,"  # NULL: the server's setting (as SET ... TO DEFAULT)
    " true)),"
    " fenced AS (INSERT INTO leader_fence (id, term)"
    " SELECT 1, $2::bigint FROM lock WHERE got AND $2::bigint IS NOT NULL"
    " ON CONFLICT (id) DO UPDATE SET term = EXCLUDED.term WHERE leader_fence.term <= EXCLUDED.term RETURNING term)"
    " SELECT got, (SELECT count(*) FROM fenced) AS fenced FROM lock"
)


async def lock_cycle(conn: asyncpg.Connection, schema: str, term: int | None, *, durable: bool) -> CycleLock:
    """Make this transaction the only scheduling cycle until it ends and, with a leader's `term`,
    record that term as the newest that decided (`fence`), in one statement: "busy" when another
    cycle runs, "fenced" when a newer term already decided (this replica was deposed), else "locked".

    Unless `durable`, its commit will not wait for the WAL to reach the disk (`synchronous_commit`
    off for this transaction only; `commit_durably` turns it back on). A crash of Postgres may then
    lose the last fraction of a second of cycles that only proposed: their jobs are queued again
    and planned anew, and a proposal the relay had already published is granted to a job that no
    longer waits for it, which `on_granted` gives back (a stray grant). The first cycle of a
    leader's term is durable (the fence must not go back below a term that proposed), as are cycles
    that handle news and handlers' transactions, whose events are acked after their commit. A
    durable cycle sets the server's setting for itself (`set_config` to NULL, as `commit_durably`'s
    `TO DEFAULT`), whatever a session of the pool may have kept."""
    row = await conn.fetchrow(_LOCK_CYCLE, f"ibpool.scheduler.{schema}", term, durable)
    if not row["got"]:
        return "busy"
    return "fenced" if term is not None and row["fenced"] == 0 else "locked"


async def commit_durably(conn: asyncpg.Connection) -> None:
    """This cycle's commit waits as the server's setting says after all: it ends, preempts or
    replaces (`CyclePlan.commits_durably`), whose events cannot be taken back by planning again, or
    it is the first of a leader's term, whose fence must not be lost."""
    await conn.execute("SET LOCAL synchronous_commit TO DEFAULT")  # the server's setting


# `Transaction.scratch` keys: rows a batch read ahead (`lock_ahead`), submissions it inserted
# (`insert_many`), records saved but not yet written (`save_job`).
AHEAD = "scheduler.jobs_ahead"
INSERTED = "scheduler.jobs_inserted"
SAVED = "scheduler.jobs_saved"


async def lock_job(tx: Transaction, job_id: str) -> JobRecord | None:
    """The job, its row locked until the transaction ends (handlers and cycles change it one at a time).
    What this transaction saved of it when it did (the row is written at commit); else taken from
    the batch's read-ahead when there (once: a later call reads the row again)."""
    saved: dict[str, JobRecord] = tx.scratch.get(SAVED, {})
    if job_id in saved:
        return saved[job_id]
    ahead: dict[str, JobRecord | None] | None = tx.scratch.get(AHEAD)
    if ahead is not None and job_id in ahead:
        return ahead.pop(job_id)
    body = await tx.conn.fetchval("SELECT body FROM jobs WHERE job_id = $1 FOR UPDATE", job_id)
    return None if body is None else record_of(body)


async def lock_ahead(tx: Transaction, job_ids: Sequence[str]) -> None:
    """Lock and read the rows of `job_ids` in one statement, in job id order (the cycle's lock order),
    for `lock_job` to take; an id without a row is remembered as none."""
    wanted = sorted(set(job_ids))
    if not wanted:
        return
    rows = await tx.conn.fetch(
        "SELECT job_id, body FROM jobs WHERE job_id = ANY($1::text[]) ORDER BY job_id FOR UPDATE", wanted
    )
    ahead: dict[str, JobRecord | None] = dict.fromkeys(wanted)
    ahead.update((r["job_id"], record_of(r["body"])) for r in rows)
    tx.scratch[AHEAD] = ahead


async def get_job(conn: asyncpg.Connection | asyncpg.Pool, job_id: str) -> JobRecord | None:
    body = await conn.fetchval("SELECT body FROM jobs WHERE job_id = $1", job_id)
    return None if body is None else record_of(body)


async def read_job(tx: Transaction, job_id: str) -> JobRecord | None:
    """The job as this transaction leaves it (what it saved, else the row), without locking it."""
    saved: dict[str, JobRecord] = tx.scratch.get(SAVED, {})
    return saved[job_id] if job_id in saved else await get_job(tx.conn, job_id)


async def insert_job(conn: asyncpg.Connection, job: JobRecord, now: dt.datetime) -> bool:
    """Store a new job; False when the id is taken (a repeated submission)."""
    done = await conn.fetchval(
        "INSERT INTO jobs (job_id, queue, tenant, state, submitted_at, updated_at, body)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (job_id) DO NOTHING RETURNING 1",
        *row(job, now),
    )
    return done is not None


async def insert_many(tx: Transaction, jobs: Sequence[JobRecord], now: dt.datetime) -> None:
    """Store new jobs in one statement, in order; `taken_insert` then tells each one's outcome."""
    if not jobs:
        return
    columns = list(zip(*(row(j, now) for j in jobs), strict=True))
    inserted = await tx.conn.fetch(
        "INSERT INTO jobs (job_id, queue, tenant, state, submitted_at, updated_at, body)"
        " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],"
        " $6::timestamptz[], $7::text[]) ON CONFLICT (job_id) DO NOTHING RETURNING job_id",
        *(list(c) for c in columns),
    )
    new = {r["job_id"] for r in inserted}
    tx.scratch[INSERTED] = {j.job_id: j if j.job_id in new else None for j in jobs}


def taken_insert(tx: Transaction, job_id: str) -> tuple[bool, JobRecord | None]:
    """(whether `insert_many` stored a row for `job_id` in this transaction, the record it stored
    or None when the id was taken); (False, None) when it had no row for it. Each answer once."""
    done: dict[str, JobRecord | None] | None = tx.scratch.get(INSERTED)
    if done is None or job_id not in done:
        return False, None
    return True, done.pop(job_id)


async def save_job(tx: Transaction, job: JobRecord, now: dt.datetime) -> None:
    """Store `job` (its row locked by `lock_job` first). The row is written with the batch's others
    in one statement at commit (`Transaction.executemany_at_commit`); until then `lock_job` and
    `read_job` of this transaction answer with `job`, so a batch's handlers see each other's work."""
    ahead: dict[str, JobRecord | None] | None = tx.scratch.get(AHEAD)
    if ahead is not None:
        ahead.pop(job.job_id, None)  # what was read ahead is no longer the row
    tx.scratch.setdefault(SAVED, {})[job.job_id] = job
    tx.executemany_at_commit(UPSERT, [row(job, now)])


async def live_jobs(conn: asyncpg.Connection | asyncpg.Pool, *, lock: bool = False) -> list[JobRecord]:
    """Every queued, proposed, scheduled or running job, in submission order; `lock` holds their rows."""
    rows = await conn.fetch(
        "SELECT body FROM jobs WHERE state = ANY($1::text[]) ORDER BY seq" + (" FOR UPDATE" if lock else ""),
        list(LIVE),
    )
    return [_record.decode(r["body"]) for r in rows]


# Each read returns its statement's snapshot xmin (an int) and when the server started in every row
# (at least one row: the LEFT JOIN).
_LIVE_ALL = (
    "SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin, pg_postmaster_start_time() AS started,"
    " j.job_id, j.seq, j.state, j.body"
    " FROM (SELECT 1) one LEFT JOIN jobs j ON j.state = ANY($1::text[]) ORDER BY j.seq"
)
_CHANGED_SINCE = (
    "SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin, pg_postmaster_start_time() AS started,"
    " j.job_id, j.seq, j.state, j.body"
    " FROM (SELECT 1) one LEFT JOIN jobs j ON j.changed_xid >= $1::xid8 ORDER BY j.seq"
)


class Tally(msgspec.Struct, frozen=True):
    """Per tenant, what fair share reads of the live jobs: the GPUs held or promised by each tenant
    with a live job that is not queued, and the tenants with a queued job (sorted)."""

    held: dict[str, int]
    waiting: list[str]


class _Counts:
    """What `Tally` is made of, counted job by job (`count(job, 1)`, and `-1` to take it back)."""

    def __init__(self) -> None:
        self.queued = 0  # live jobs in state "queued"
        self._tenants: dict[str, list[int]] = {}  # tenant -> [queued jobs, other live jobs, their GPUs]

    def count(self, job: JobRecord, sign: int) -> None:
        counts = self._tenants.get(job.tenant)
        if counts is None:
            counts = self._tenants[job.tenant] = [0, 0, 0]
        if job.state == "queued":
            counts[0] += sign
            self.queued += sign
        else:  # every live job but a queued one holds its GPUs or has them promised
            counts[1] += sign
            counts[2] += sign * job.gpus
        if not counts[0] and not counts[1]:
            del self._tenants[job.tenant]

    def tally(self) -> Tally:
        tenants = self._tenants
        return Tally({t: c[2] for t, c in tenants.items() if c[1]}, sorted(t for t, c in tenants.items() if c[0]))


def tally_of(jobs: Iterable[JobRecord]) -> Tally:
    """The tally of a list of live jobs (`LiveJobs.tally` keeps the same one as rows change)."""
    counts = _Counts()
    for job in jobs:
        counts.count(job, 1)
    return counts.tally()


class LiveJobs:
    """The live jobs, kept across scheduling cycles: a read fetches only the rows written since the
    previous read, not every live job (thousands hold GPUs on a big cluster; a cycle runs many times
    a second under load).

    Why it is exact: every row carries the transaction that last wrote it (`changed_xid`, migration
    004). A transaction below a snapshot's xmin had ended when the snapshot was taken, so a read
    that saw it sees its rows; every other one (in progress then, or later) is read again by the next
    read, which asks for the rows written by transactions from that xmin on. A row read again with an
    unchanged body keeps its record object, which the cycle's caches compare by identity.

    `reset()` (a new leader, a failed cycle) makes the next read a whole one, as does a snapshot xmin
    below the previous one (the database restored from a backup, its transaction ids behind ours), or
    a server that started again since the previous read: a crash may have undone the last cycles,
    which commit without waiting for the disk (`lock_cycle`), and their transaction ids are given out
    again.
    """

    def __init__(self) -> None:
        self._xmin: int | None = None
        self._started: object = None  # pg_postmaster_start_time() at the previous read
        self._bodies: dict[str, str] = {}  # job id -> its row's body as read
        self._book = LiveBook()  # the records of those rows, by their seq
        self._clear()

    def _clear(self) -> None:
        # Kept as rows come and go, so that a cycle needs no walk over every live job for them.
        self._book.clear()
        self._counts = _Counts()
        self._replacing: dict[str, JobRecord] = {}  # job id -> a job with `member_to_replace`
        self._in_flight = InFlight()

    def reset(self) -> None:
        self._xmin, self._started, self._bodies = None, None, {}
        self._clear()

    @property
    def by_id(self) -> Mapping[str, JobRecord]:
        """Job id -> record of every live job as of the last read. Not to be changed."""
        return self._book.records

    @property
    def current(self) -> bool:
        """Whether a read was made since the last `reset()` (before one, nothing is known)."""
        return self._xmin is not None

    @property
    def queued(self) -> int:
        """How many of the last read's jobs are queued."""
        return self._counts.queued

    def tally(self) -> Tally:
        """`tally_of` the last read's jobs, from counts kept as rows changed (no walk over the jobs)."""
        return self._counts.tally()

    def in_flight(self, ledger: Ledger) -> dict[str, set[int]]:
        """`plan.taken_in_flight(ledger, <the last read's jobs>)`, from what was kept (`plan.InFlight`)."""
        return self._in_flight.taken(ledger)

    def replacing(self) -> list[JobRecord]:
        """The held jobs with a member to replace and none proposed, in submission order."""
        return sorted(self._replacing.values(), key=lambda j: self._book.seq_of(j.job_id))

    def _count(self, job: JobRecord, sign: int) -> None:
        if sign > 0:
            self._in_flight.add(job)
        else:
            self._in_flight.remove(job)
        self._counts.count(job, sign)
        if job.member_to_replace:
            if sign > 0:
                self._replacing[job.job_id] = job
            else:
                del self._replacing[job.job_id]

    def stored_body(self, job_id: str) -> str:
        """The body of a live job's row as the last read found it (what a conditional write compares:
        the stored text itself, which re-encoding the record need not give back once the record
        has gained a field)."""
        return self._bodies[job_id]

    async def read(self, conn: asyncpg.Connection) -> LiveBook:
        """The live jobs in submission order, as of this read's snapshot: the book kept from read to
        read, changed only by the rows that changed (a cycle reads what changed from it). Not to be
        changed."""
        last = self._xmin
        rows = None if last is None else await conn.fetch(_CHANGED_SINCE, last)
        if rows is None or last is None or int(rows[0]["xmin"]) < last or rows[0]["started"] != self._started:
            rows = await conn.fetch(_LIVE_ALL, list(LIVE))  # ids went back, or the server restarted
            self._bodies = {}
            self._clear()
        known, book = self._bodies, self._book
        for r in rows:
            job_id = r["job_id"]
            if job_id is None:
                continue
            if r["state"] not in LIVE:
                if known.pop(job_id, None) is not None:
                    gone = book.drop(job_id)
                    assert gone is not None
                    self._count(gone, -1)
                continue
            body: str = r["body"]
            had = known.get(job_id)
            if had == body:
                continue
            seq: int = r["seq"]
            record = record_of(body)
            known[job_id] = body
            if had is not None:
                self._count(book.records[job_id], -1)
            self._count(record, 1)
            book.put(seq, record)
        self._xmin, self._started = int(rows[0]["xmin"]), rows[0]["started"]
        return book


async def list_jobs(
    conn: asyncpg.Connection | asyncpg.Pool,
    *,
    states: Sequence[str] = (),
    queue: str | None = None,
    tenant: str | None = None,
    limit: int = 100,
) -> list[JobRecord]:
    """The newest jobs first, filtered by state, queue and tenant."""
    rows = await conn.fetch(
        "SELECT body FROM jobs WHERE (cardinality($1::text[]) = 0 OR state = ANY($1::text[]))"
        " AND ($2::text IS NULL OR queue = $2) AND ($3::text IS NULL OR tenant = $3)"
        " ORDER BY seq DESC LIMIT $4",
        list(states),
        queue,
        tenant,
        limit,
    )
    return [_record.decode(r["body"]) for r in rows]


async def datasets(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, list[str]]:
    """The stored dataset registry: dataset -> node ids holding it."""
    rows = await conn.fetch("SELECT name, nodes FROM datasets")
    return {r["name"]: list(r["nodes"]) for r in rows}


async def put_dataset(
    conn: asyncpg.Connection | asyncpg.Pool, name: str, nodes: Sequence[str], now: dt.datetime
) -> None:
    """Store (replace) which nodes hold `name`; no nodes removes the entry."""
    if not nodes:
        await conn.execute("DELETE FROM datasets WHERE name = $1", name)
        return
    await conn.execute(
        "INSERT INTO datasets (name, nodes, updated_at) VALUES ($1, $2, $3)"
        " ON CONFLICT (name) DO UPDATE SET nodes = $2, updated_at = $3",
        name,
        sorted(set(nodes)),
        now,
    )


# Written out, not parameters, so that the planner uses the partial index `jobs_ended_by_end`.
USAGE_SINCE = (
    "SELECT tenant, body::jsonb->>'gpus_per_host' AS g, body::jsonb->>'hosts' AS h,"
    " body::jsonb->>'runtime_s' AS r, updated_at FROM jobs"
    " WHERE state IN ('completed', 'failed', 'cancelled', 'killed') AND updated_at > $1"
)


async def usage_history(conn: asyncpg.Connection, since: dt.datetime) -> list[tuple[str, int, float, dt.datetime]]:
    """(tenant, GPUs, runtime s, ended at) of every job that ended after `since`: what fair share
    starts from when a replica begins to lead."""
    rows = await conn.fetch(USAGE_SINCE, since)
    return [(r["tenant"], int(r["g"] or 1) * int(r["h"] or 1), float(r["r"] or 0.0), r["updated_at"]) for r in rows]


# Written out, not parameters, so that the planner uses the partial indexes `jobs_live` and `jobs_ended_by_end`.
HELD_SINCE = (
    "SELECT body FROM jobs WHERE state IN ('queued', 'proposed', 'scheduled', 'running')"
    " UNION ALL SELECT body FROM jobs WHERE state IN ('completed', 'failed', 'cancelled', 'killed') AND updated_at > $1"
)


async def jobs_for_usage(conn: asyncpg.Connection | asyncpg.Pool, since: dt.datetime) -> list[JobRecord]:
    """Every job that may have held GPUs after `since`: the live ones and those that ended after it."""
    rows = await conn.fetch(HELD_SINCE, since)
    return [_record.decode(r["body"]) for r in rows]


# The ended states the runtime model learns from (ibpool_scheduler.predictor: never `cancelled`).
# Written out, not a parameter, so that the planner uses the partial index `jobs_ended_by_end`.
_LEARNED = "state IN ('completed', 'failed', 'killed')"
ENDED_NEWEST = f"SELECT body, updated_at FROM jobs WHERE {_LEARNED} ORDER BY updated_at DESC, job_id DESC LIMIT $1"
ENDED_SINCE = f"SELECT job_id, updated_at FROM jobs WHERE {_LEARNED} AND updated_at > $1 ORDER BY updated_at, job_id"


async def ended_jobs_newest(conn: asyncpg.Connection | asyncpg.Pool, limit: int) -> list[tuple[JobRecord, dt.datetime]]:
    """The newest `limit` completed, failed or killed jobs with when they ended, oldest first."""
    rows = await conn.fetch(ENDED_NEWEST, limit)
    return [(_record.decode(r["body"]), r["updated_at"]) for r in reversed(rows)]


async def ended_job_ids_since(
    conn: asyncpg.Connection | asyncpg.Pool, since: dt.datetime
) -> list[tuple[str, dt.datetime]]:
    """(job id, when it ended) of the completed, failed or killed jobs that ended after `since`, in that order."""
    rows = await conn.fetch(ENDED_SINCE, since)
    return [(r["job_id"], r["updated_at"]) for r in rows]


async def jobs_by_id(conn: asyncpg.Connection | asyncpg.Pool, job_ids: Sequence[str]) -> dict[str, JobRecord]:
    """The stored records of `job_ids` (absent ids are left out)."""
    rows = await conn.fetch("SELECT job_id, body FROM jobs WHERE job_id = ANY($1::text[])", list(job_ids))
    return {r["job_id"]: _record.decode(r["body"]) for r in rows}
