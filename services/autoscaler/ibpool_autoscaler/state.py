"""The autoscaler's store: deployments (with the scaler's memory), their live replicas, metric samples;
elastic training jobs, their live workers, and the jobs waiting at the scheduler."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeAlias, TypeVar

import asyncpg
import msgspec

from ibpool_core.scale.model import MetricSample

from .deployments import DeploymentRecord, ReplicaRecord, replica_job_id
from .elastic import ElasticJobRecord, Waiting, WorkerRecord, worker_job_id

MIGRATIONS = Path(__file__).parent / "migrations"

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool
R = TypeVar("R", ReplicaRecord, WorkerRecord)

_sample = msgspec.json.Decoder(MetricSample)
_encoder = msgspec.json.Encoder()
D = TypeVar("D", DeploymentRecord, ElasticJobRecord)


class Declarations(Generic[D]):
    """What operators declared by name (deployments, elastic jobs), one JSON body per row."""

    def __init__(self, record: type[D], table: str) -> None:
        self.table = table
        self._decoder: msgspec.json.Decoder[D] = msgspec.json.Decoder(record)

    async def save(self, conn: asyncpg.Connection, record: D) -> None:
        await conn.execute(
            f"INSERT INTO {self.table} (name, updated_at, body) VALUES ($1, $2, $3)"
            " ON CONFLICT (name) DO UPDATE SET updated_at = $2, body = $3",
            record.name,
            record.updated_at,
            _encoder.encode(record).decode(),
        )

    async def lock(self, conn: asyncpg.Connection, name: str) -> D | None:
        """The declaration, its row locked until the transaction ends: decisions, PUTs and DELETEs of one
        name happen one at a time."""
        body = await conn.fetchval(f"SELECT body FROM {self.table} WHERE name = $1 FOR UPDATE", name)
        return None if body is None else self._decoder.decode(body)

    async def lock_all(self, conn: asyncpg.Connection) -> list[D]:
        """Every declaration, rows locked in name order until the transaction ends (a round that decides
        them together; PUTs and DELETEs wait for it)."""
        rows = await conn.fetch(f"SELECT body FROM {self.table} ORDER BY name FOR UPDATE")
        return [self._decoder.decode(r["body"]) for r in rows]

    async def get(self, conn: Conn, name: str) -> D | None:
        body = await conn.fetchval(f"SELECT body FROM {self.table} WHERE name = $1", name)
        return None if body is None else self._decoder.decode(body)

    async def all(self, conn: Conn) -> list[D]:
        rows = await conn.fetch(f"SELECT body FROM {self.table} ORDER BY name")
        return [self._decoder.decode(r["body"]) for r in rows]

    async def names(self, conn: Conn) -> list[str]:
        return [r["name"] for r in await conn.fetch(f"SELECT name FROM {self.table} ORDER BY name")]

    async def delete(self, conn: asyncpg.Connection, name: str) -> None:
        await conn.execute(f"DELETE FROM {self.table} WHERE name = $1", name)


DEPLOYMENTS = Declarations(DeploymentRecord, "deployments")
ELASTIC_JOBS = Declarations(ElasticJobRecord, "elastic_jobs")


async def delete_deployment(conn: asyncpg.Connection, name: str) -> None:
    await DEPLOYMENTS.delete(conn, name)
    await conn.execute("DELETE FROM samples WHERE deployment = $1", name)


class MemberJobs(Generic[R]):
    """The live member jobs of an owner, one scheduler job each: a deployment's replicas and an elastic
    job's workers are kept alike (same columns; only the table, the owner's column and the id form
    differ). Job ids `<owner>-<letter><N>` come from a per-owner counter and are never reused."""

    def __init__(self, record: type[R], table: str, owner: str, numbers: str, job_id: Callable[[str, int], str]):
        self.record: type[R] = record
        self.table, self.owner, self.numbers, self.job_id = table, owner, numbers, job_id

    def _of(self, row: asyncpg.Record) -> R:
        fields = {"job_id", "state", "since", "submitted_at", "allocation_id", "hosts", self.owner}
        member: R = self.record(**{f: row[f] for f in fields}, nodes=list(row["nodes"]), started=list(row["started"]))
        return member

    async def of(self, conn: Conn, owner: str) -> list[R]:
        """The owner's live members, oldest submission first."""
        rows = await conn.fetch(
            f"SELECT * FROM {self.table} WHERE {self.owner} = $1 ORDER BY submitted_at, job_id", owner
        )
        return [self._of(r) for r in rows]

    async def by_owner(self, conn: Conn) -> dict[str, list[R]]:
        out: dict[str, list[R]] = {}
        for r in await conn.fetch(f"SELECT * FROM {self.table} ORDER BY submitted_at, job_id"):
            out.setdefault(r[self.owner], []).append(self._of(r))
        return out

    async def lock(self, conn: asyncpg.Connection, job_id: str) -> R | None:
        row = await conn.fetchrow(f"SELECT * FROM {self.table} WHERE job_id = $1 FOR UPDATE", job_id)
        return None if row is None else self._of(row)

    async def insert(self, conn: asyncpg.Connection, members: list[R]) -> None:
        await conn.executemany(
            f"INSERT INTO {self.table} (job_id, {self.owner}, state, since, submitted_at, hosts)"
            " VALUES ($1, $2, $3, $4, $5, $6)",
            [(m.job_id, getattr(m, self.owner), m.state, m.since, m.submitted_at, m.hosts) for m in members],
        )

    async def update(self, conn: asyncpg.Connection, m: R) -> None:
        await conn.execute(
            f"UPDATE {self.table} SET state = $2, since = $3, allocation_id = $4, nodes = $5, started = $6"
            " WHERE job_id = $1",
            m.job_id,
            m.state,
            m.since,
            m.allocation_id,
            m.nodes,
            m.started,
        )

    async def delete(self, conn: asyncpg.Connection, job_ids: list[str]) -> None:
        await conn.execute(f"DELETE FROM {self.table} WHERE job_id = ANY($1::text[])", job_ids)

    async def next_ids(self, conn: asyncpg.Connection, owner: str, count: int) -> list[str]:
        """`count` fresh member job ids of `owner`."""
        if count <= 0:
            return []
        last = await conn.fetchval(
            f"INSERT INTO {self.numbers} ({self.owner}, next) VALUES ($1, $2 + 1)"
            f" ON CONFLICT ({self.owner}) DO UPDATE SET next = {self.numbers}.next + $2 RETURNING next",
            owner,
            count,
        )
        first = int(last) - count
        return [self.job_id(owner, n) for n in range(first, first + count)]


REPLICAS = MemberJobs(ReplicaRecord, "replicas", "deployment", "replica_numbers", replica_job_id)
WORKERS = MemberJobs(WorkerRecord, "elastic_workers", "elastic_job", "worker_numbers", worker_job_id)


async def add_sample(conn: asyncpg.Connection, deployment: str, sample: MetricSample) -> None:
    await conn.execute(
        "INSERT INTO samples (deployment, at, body) VALUES ($1, $2, $3)",
        deployment,
        sample.at,
        _encoder.encode(sample).decode(),
    )


async def samples_since(conn: Conn, deployment: str, since: dt.datetime) -> list[MetricSample]:
    """The deployment's samples at or after `since`, oldest first."""
    rows = await conn.fetch(
        "SELECT body FROM samples WHERE deployment = $1 AND at >= $2 ORDER BY at, seq", deployment, since
    )
    return [_sample.decode(r["body"]) for r in rows]


async def prune_samples(conn: Conn, before: dt.datetime) -> None:
    await conn.execute("DELETE FROM samples WHERE at < $1", before)


# -- batch elasticity ---------------------------------------------------------------------------------


async def job_queued(conn: asyncpg.Connection, job_id: str, gpus: int, priority: int) -> None:
    await conn.execute(
        "INSERT INTO job_demand (job_id, gpus, priority, waiting) VALUES ($1, $2, $3, true)"
        " ON CONFLICT (job_id) DO UPDATE SET gpus = $2, priority = $3, waiting = true",
        job_id,
        gpus,
        priority,
    )


async def job_waiting(conn: asyncpg.Connection, job_id: str, waiting: bool) -> None:
    """Scheduled (False) or requeued (True); a job not queued in our time is not tracked."""
    await conn.execute("UPDATE job_demand SET waiting = $2 WHERE job_id = $1", job_id, waiting)


async def job_finished(conn: asyncpg.Connection, job_id: str) -> None:
    await conn.execute("DELETE FROM job_demand WHERE job_id = $1", job_id)


async def waiting_jobs(conn: Conn) -> list[Waiting]:
    """The jobs waiting at the scheduler, the elastic jobs' own workers excepted."""
    rows = await conn.fetch(
        "SELECT d.job_id, d.gpus, d.priority FROM job_demand d"
        " LEFT JOIN elastic_workers w ON w.job_id = d.job_id WHERE d.waiting AND w.job_id IS NULL ORDER BY d.job_id"
    )
    return [Waiting(job_id=r["job_id"], gpus=r["gpus"], priority=r["priority"]) for r in rows]
