"""The node agent's own store: its nodes' inventory and the work running on them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import asyncpg
import msgspec

from ibpool_core.workload import Workload
from ibpool_proto.job import JobExited
from ibpool_proto.node import GpuInfo
from ibpool_runtime.store import rows_affected

MIGRATIONS = Path(__file__).parent / "migrations"

_gpus = msgspec.json.Decoder(list[GpuInfo])
_workload = msgspec.json.Decoder(Workload)


class NodeRow(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    hostname: str
    backend: str
    gpus: list[GpuInfo]
    registered_at: dt.datetime


async def upsert_node(
    conn: asyncpg.Connection, node_id: str, hostname: str, backend: str, gpus: list[GpuInfo], now: dt.datetime
) -> None:
    await conn.execute(
        "INSERT INTO nodes (node_id, hostname, backend, inventory, registered_at) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (node_id) DO UPDATE SET hostname = $2, backend = $3, inventory = $4, registered_at = $5",
        node_id,
        hostname,
        backend,
        msgspec.json.encode(gpus).decode(),
        now,
    )


async def nodes(conn: asyncpg.Connection | asyncpg.Pool) -> list[NodeRow]:
    rows = await conn.fetch("SELECT * FROM nodes ORDER BY node_id")
    return [
        NodeRow(
            node_id=r["node_id"],
            hostname=r["hostname"],
            backend=r["backend"],
            gpus=_gpus.decode(r["inventory"]),
            registered_at=r["registered_at"],
        )
        for r in rows
    ]


async def insert_workload(conn: asyncpg.Connection, w: Workload) -> None:
    await conn.execute(
        "INSERT INTO workloads (allocation_id, job_id, node_id, body, started_at, ends_at)"
        " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (allocation_id, node_id) DO NOTHING",
        w.allocation_id,
        w.job_id,
        w.node_id,
        msgspec.json.encode(w).decode(),
        w.started_at,
        w.ends_at,
    )


async def running(conn: asyncpg.Connection | asyncpg.Pool, node_ids: list[str] | None = None) -> list[Workload]:
    if node_ids is None:
        rows = await conn.fetch("SELECT body FROM workloads WHERE exited_at IS NULL ORDER BY started_at")
    else:
        rows = await conn.fetch(
            "SELECT body FROM workloads WHERE exited_at IS NULL AND node_id = ANY($1::text[]) ORDER BY started_at",
            node_ids,
        )
    return [_workload.decode(r["body"]) for r in rows]


async def running_one(conn: asyncpg.Connection, allocation_id: str, node_id: str) -> Workload | None:
    body = await conn.fetchval(
        "SELECT body FROM workloads WHERE allocation_id = $1 AND node_id = $2 AND exited_at IS NULL FOR UPDATE",
        allocation_id,
        node_id,
    )
    return None if body is None else _workload.decode(body)


async def mark_exited(conn: asyncpg.Connection, exited: JobExited) -> bool:
    """Record an exit once; False if the workload had already exited (or never ran here)."""
    status = await conn.execute(
        "UPDATE workloads SET exited_at = $2, exit_code = $3, exit_reason = $4"
        " WHERE allocation_id = $1 AND node_id = $5 AND exited_at IS NULL",
        exited.allocation_id,
        exited.occurred_at,
        exited.exit_code,
        exited.reason,
        exited.node_id,
    )
    return rows_affected(status) == 1


async def prune_exited(
    conn: asyncpg.Connection | asyncpg.Pool, older_than_s: float, node_ids: list[str]
) -> list[tuple[str, str]]:
    """Delete the workloads of `node_ids` that exited more than `older_than_s` ago; (allocation id,
    node id) of each that went."""
    rows = await conn.fetch(
        "DELETE FROM workloads WHERE node_id = ANY($1::text[]) AND exited_at < now() - make_interval(secs => $2)"
        " RETURNING allocation_id, node_id",
        node_ids,
        older_than_s,
    )
    return [(r["allocation_id"], r["node_id"]) for r in rows]


async def exits_by_reason(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT exit_reason, count(*) AS n FROM workloads WHERE exited_at IS NOT NULL GROUP BY exit_reason"
    )
    return {r["exit_reason"]: int(r["n"]) for r in rows}
