"""The Slurm bridge's store: ibpool's cordons, the newest word on each (the migrations beside it)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import asyncpg

from ibpool_core.slurm_bridge import Cordon

MIGRATIONS = Path(__file__).parent / "migrations"


async def record_cordon(
    conn: asyncpg.Connection, node_id: str, cordon: Cordon, *, lifted: bool, at: dt.datetime
) -> bool:
    """Keep `cordon` (applied, or `lifted`) on `node_id` unless a newer word on it is kept already;
    True when it changed what is kept."""
    row = await conn.fetchval(
        """
        INSERT INTO slurm_bridge_cordons (node_id, scope, gpu_index, rail, reason, lifted, at)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        ON CONFLICT (node_id, scope, gpu_index, rail) DO UPDATE
            SET reason = EXCLUDED.reason, lifted = EXCLUDED.lifted, at = EXCLUDED.at
            WHERE slurm_bridge_cordons.at <= EXCLUDED.at
        RETURNING 1
        """,
        node_id,
        cordon.scope,
        cordon.gpu_index,
        cordon.rail,
        cordon.reason,
        lifted,
        at,
    )
    return row is not None


async def cordons(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, tuple[Cordon, ...]]:
    """Node -> its cordons in force, sorted."""
    rows = await conn.fetch(
        "SELECT node_id, scope, gpu_index, rail, reason FROM slurm_bridge_cordons WHERE NOT lifted"
        " ORDER BY node_id, scope, gpu_index, rail"
    )
    out: dict[str, list[Cordon]] = {}
    for r in rows:
        out.setdefault(r["node_id"], []).append(
            Cordon(scope=r["scope"], gpu_index=r["gpu_index"], rail=r["rail"], reason=r["reason"])
        )
    return {node: tuple(sorted(cs)) for node, cs in out.items()}
