"""The allocator's store: the ledger's event log (`ledger_events`), read and appended under one lock."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import asyncpg
import msgspec

from ibpool_core.pool.messages import LedgerEvent

MIGRATIONS = Path(__file__).parent / "migrations"

Position = tuple[int, int]
"""(version, seq) of a row of ledger_events; (0, -1) before the first."""

START: Position = (0, -1)

_event = msgspec.json.Decoder(LedgerEvent)


async def lock_ledger(conn: asyncpg.Connection, schema: str) -> None:
    """Make this transaction the ledger's only writer until it ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"ibpool.pool_allocator.{schema}")


async def look(conn: asyncpg.Connection | asyncpg.Pool, at: Position) -> tuple[str | None, Position]:
    """The id of the event stored at `at` (None when there is none), and the position of the last row."""
    row = await conn.fetchrow(
        "SELECT (SELECT event_id FROM ledger_events WHERE version = $1 AND seq = $2) AS at_id,"
        " (SELECT array[version, seq] FROM ledger_events ORDER BY version DESC, seq DESC LIMIT 1) AS last",
        at[0],
        at[1],
    )
    last = row["last"]
    return row["at_id"], START if last is None else (last[0], last[1])


async def events_after(conn: asyncpg.Connection | asyncpg.Pool, after: Position) -> list[tuple[Position, LedgerEvent]]:
    rows = await conn.fetch(
        "SELECT version, seq, body FROM ledger_events WHERE (version, seq) > ($1, $2) ORDER BY version, seq",
        after[0],
        after[1],
    )
    return [((r["version"], r["seq"]), _event.decode(r["body"])) for r in rows]


APPEND = "INSERT INTO ledger_events (version, seq, event_id, body) VALUES ($1, $2, $3, $4)"
"""Writes one row of `log_rows`."""


def log_rows(after: Position, events: Sequence[LedgerEvent]) -> tuple[list[tuple[int, int, str, str]], Position]:
    """The ledger_events rows of `events` appended behind `after` (the last row), and the last one's position."""
    out = []
    position = after
    for e in events:
        version = e.ledger_version
        position = (version, position[1] + 1 if version == position[0] else 0)
        out.append((position[0], position[1], e.id, msgspec.json.encode(e).decode()))
    return out, position


async def append(conn: asyncpg.Connection, after: Position, events: Sequence[LedgerEvent]) -> Position:
    """Append `events` behind `after` (the last row) now; returns the position of the last one appended."""
    appended, position = log_rows(after, events)
    await conn.executemany(APPEND, appended)
    return position
