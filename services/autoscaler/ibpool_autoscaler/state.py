"""The autoscaler's store: deployments (with the scaler's memory), their live replicas, metric samples."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TypeAlias

import asyncpg
import msgspec

from ibpool_core.scale.model import MetricSample

from .deployments import DeploymentRecord, ReplicaRecord, replica_job_id

MIGRATIONS = Path(__file__).parent / "migrations"

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool

_record = msgspec.json.Decoder(DeploymentRecord)
_sample = msgspec.json.Decoder(MetricSample)
_encoder = msgspec.json.Encoder()


async def save_deployment(conn: asyncpg.Connection, record: DeploymentRecord) -> None:
    await conn.execute(
        "INSERT INTO deployments (name, updated_at, body) VALUES ($1, $2, $3)"
        " ON CONFLICT (name) DO UPDATE SET updated_at = $2, body = $3",
        record.name,
        record.updated_at,
        _encoder.encode(record).decode(),
    )


async def lock_deployment(conn: asyncpg.Connection, name: str) -> DeploymentRecord | None:
    """The deployment, its row locked until the transaction ends: decisions, PUTs and DELETEs of one
    deployment happen one at a time."""
    body = await conn.fetchval("SELECT body FROM deployments WHERE name = $1 FOR UPDATE", name)
    return None if body is None else _record.decode(body)


async def get_deployment(conn: Conn, name: str) -> DeploymentRecord | None:
    body = await conn.fetchval("SELECT body FROM deployments WHERE name = $1", name)
    return None if body is None else _record.decode(body)


async def list_deployments(conn: Conn) -> list[DeploymentRecord]:
    return [_record.decode(r["body"]) for r in await conn.fetch("SELECT body FROM deployments ORDER BY name")]


async def deployment_names(conn: Conn) -> list[str]:
    return [r["name"] for r in await conn.fetch("SELECT name FROM deployments ORDER BY name")]


async def delete_deployment(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute("DELETE FROM deployments WHERE name = $1", name)
    await conn.execute("DELETE FROM samples WHERE deployment = $1", name)


def _replica(row: asyncpg.Record) -> ReplicaRecord:
    return ReplicaRecord(
        job_id=row["job_id"],
        deployment=row["deployment"],
        state=row["state"],
        since=row["since"],
        submitted_at=row["submitted_at"],
        allocation_id=row["allocation_id"],
        nodes=list(row["nodes"]),
    )


async def replicas_of(conn: Conn, deployment: str) -> list[ReplicaRecord]:
    """The deployment's live replicas, oldest submission first."""
    rows = await conn.fetch("SELECT * FROM replicas WHERE deployment = $1 ORDER BY submitted_at, job_id", deployment)
    return [_replica(r) for r in rows]


async def lock_replica(conn: asyncpg.Connection, job_id: str) -> ReplicaRecord | None:
    row = await conn.fetchrow("SELECT * FROM replicas WHERE job_id = $1 FOR UPDATE", job_id)
    return None if row is None else _replica(row)


async def insert_replicas(conn: asyncpg.Connection, replicas: list[ReplicaRecord]) -> None:
    await conn.executemany(
        "INSERT INTO replicas (job_id, deployment, state, since, submitted_at) VALUES ($1, $2, $3, $4, $5)",
        [(r.job_id, r.deployment, r.state, r.since, r.submitted_at) for r in replicas],
    )


async def update_replica(conn: asyncpg.Connection, r: ReplicaRecord) -> None:
    await conn.execute(
        "UPDATE replicas SET state = $2, since = $3, allocation_id = $4, nodes = $5 WHERE job_id = $1",
        r.job_id,
        r.state,
        r.since,
        r.allocation_id,
        r.nodes,
    )


async def delete_replicas(conn: asyncpg.Connection, job_ids: list[str]) -> None:
    await conn.execute("DELETE FROM replicas WHERE job_id = ANY($1::text[])", job_ids)


async def next_job_ids(conn: asyncpg.Connection, deployment: str, count: int) -> list[str]:
    """`count` fresh replica job ids `<deployment>-r<N>`; numbers are never reused under one name."""
    if count <= 0:
        return []
    last = await conn.fetchval(
        "INSERT INTO replica_numbers (deployment, next) VALUES ($1, $2 + 1)"
        " ON CONFLICT (deployment) DO UPDATE SET next = replica_numbers.next + $2 RETURNING next",
        deployment,
        count,
    )
    first = int(last) - count
    return [replica_job_id(deployment, n) for n in range(first, first + count)]


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
