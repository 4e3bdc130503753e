"""The controller's store: its health picture, the observations waiting for a decision, verdicts, link map."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import msgspec

from ibpool_core.health.decide import OBSERVATIONS, HealthState, Observation
from ibpool_core.health.link_signals import LinkTarget
from ibpool_proto import Event, encode
from ibpool_proto.codec import decode

MIGRATIONS = Path(__file__).parent / "migrations"

_state = msgspec.json.Decoder(HealthState)
_targets = msgspec.json.Decoder(dict[str, LinkTarget])


class VerdictRow(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    event_id: str
    type: str
    key: str
    occurred_at: dt.datetime
    event: msgspec.Raw


async def lock(conn: asyncpg.Connection, schema: str) -> bool:
    """Make this transaction the only decider until it ends; False when another one is deciding."""
    got: bool = await conn.fetchval("SELECT pg_try_advisory_xact_lock(hashtext($1))", f"ibpool.failover.{schema}")
    return got


async def load_state(conn: asyncpg.Connection | asyncpg.Pool) -> HealthState:
    body = await conn.fetchval("SELECT body FROM health_state WHERE id = 1")
    return HealthState() if body is None else _state.decode(body)


async def save_state(conn: asyncpg.Connection, state: HealthState, now: dt.datetime) -> None:
    await conn.execute(
        "INSERT INTO health_state (id, body, updated_at) VALUES (1, $1, $2)"
        " ON CONFLICT (id) DO UPDATE SET body = $1, updated_at = $2",
        msgspec.json.encode(state).decode(),
        now,
    )


async def add_pending(conn: asyncpg.Connection, observation: Event) -> None:
    """An observation that came over the bus, kept until a tick decides on it."""
    await conn.execute("INSERT INTO pending_observations (body) VALUES ($1)", encode(observation).decode())


async def take_pending(conn: asyncpg.Connection, limit: int = 10_000) -> tuple[list[Observation], int | None]:
    """The oldest waiting observations in arrival order, and the seq of the last one (to delete)."""
    rows = await conn.fetch("SELECT seq, body FROM pending_observations ORDER BY seq LIMIT $1", limit)
    out: list[Observation] = []
    for r in rows:
        message = decode(r["body"].encode())
        if isinstance(message, OBSERVATIONS):
            out.append(message)  # type: ignore[arg-type]
    return out, (rows[-1]["seq"] if rows else None)


async def drop_pending(conn: asyncpg.Connection, through: int) -> None:
    await conn.execute("DELETE FROM pending_observations WHERE seq <= $1", through)


async def record_verdicts(conn: asyncpg.Connection, events: Sequence[Event], keep: int) -> None:
    if not events:
        return
    await conn.executemany(
        "INSERT INTO verdicts (event_id, type, key, occurred_at, body) VALUES ($1, $2, $3, $4, $5)",
        [(e.id, type(e).__name__, e.key, e.occurred_at, encode(e).decode()) for e in events],
    )
    await conn.execute(
        "DELETE FROM verdicts WHERE seq <= (SELECT max(seq) FROM verdicts) - $1",
        keep,
    )


async def verdicts(
    conn: asyncpg.Connection | asyncpg.Pool, limit: int, type_name: str | None, key: str | None
) -> list[VerdictRow]:
    rows = await conn.fetch(
        "SELECT seq, event_id, type, key, occurred_at, body FROM verdicts"
        " WHERE ($2::text IS NULL OR type = $2) AND ($3::text IS NULL OR key = $3)"
        " ORDER BY seq DESC LIMIT $1",
        limit,
        type_name,
        key,
    )
    return [
        VerdictRow(
            seq=r["seq"],
            event_id=r["event_id"],
            type=r["type"],
            key=r["key"],
            occurred_at=r["occurred_at"],
            event=msgspec.Raw(r["body"].encode()),
        )
        for r in rows
    ]


async def save_link_targets(conn: asyncpg.Connection, version: int, targets: dict[str, LinkTarget]) -> None:
    await conn.execute(
        "INSERT INTO link_targets (id, version, body) VALUES (1, $1, $2)"
        " ON CONFLICT (id) DO UPDATE SET version = $1, body = $2 WHERE link_targets.version <= $1",
        version,
        msgspec.json.encode(targets).decode(),
    )


async def link_targets_after(
    conn: asyncpg.Connection | asyncpg.Pool, version: int
) -> tuple[int, dict[str, LinkTarget]] | None:
    row = await conn.fetchrow("SELECT version, body FROM link_targets WHERE id = 1 AND version > $1", version)
    return None if row is None else (row["version"], _targets.decode(row["body"]))


async def fence(conn: asyncpg.Connection, term: int) -> bool:
    """Record `term` as the newest that decided; False when a newer term already did (we were deposed)."""
    row = await conn.fetchval(
        "INSERT INTO leader_fence (id, term) VALUES (1, $1)"
        " ON CONFLICT (id) DO UPDATE SET term = $1 WHERE leader_fence.term <= $1 RETURNING term",
        term,
    )
    return row is not None
