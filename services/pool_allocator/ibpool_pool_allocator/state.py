"""The allocator's store: the ledger's event log (`ledger_events`), read and appended under one lock,
and the newest snapshot of the ledger (`ledger_snapshots`), before which the log is deleted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import asyncpg
import msgspec

from ibpool_core.pool.ledger import LEDGER_FORMAT
from ibpool_core.pool.messages import LedgerEvent

MIGRATIONS = Path(__file__).parent / "migrations"

Position = tuple[int, int]
"""(version, seq) of a row of ledger_events; (0, -1) before the first."""

START: Position = (0, -1)

_event = msgspec.json.Decoder(LedgerEvent)


async def lock_ledger(conn: asyncpg.Connection, schema: str) -> None:
    """Make this transaction the ledger's only writer until it ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"ibpool.pool_allocator.{schema}")


class LogRow(NamedTuple):
    at: Position
    event_id: str
    body: str

    def event(self) -> LedgerEvent:
        return _event.decode(self.body)


async def log_from(conn: asyncpg.Connection | asyncpg.Pool, at: Position, limit: int) -> list[LogRow]:
    """The first `limit` rows of the log at `at` and after it, in order, read in one statement. The
    log is deleted oldest row first (`PRUNE_LOG`), so when the row at `at` is among them, none after
    it is missing. The limit also keeps the plan an index scan when Postgres plans the prepared
    statement generically (without it, a range it cannot size is read with a sequential scan and a
    sort: 91 ms on 400,000 rows)."""
    rows = await conn.fetch(
        "SELECT version, seq, event_id, body FROM ledger_events WHERE (version, seq) >= ($1, $2)"
        " ORDER BY version, seq LIMIT $3",
        at[0],
        at[1],
        limit,
    )
    return [LogRow((r["version"], r["seq"]), r["event_id"], r["body"]) for r in rows]


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


class Snapshot(NamedTuple):
    """The encoded ledger as it stood at `at`, the row of ledger_events of `event_id`; `format`: the
    ledger format of its bytes (`LEDGER_FORMAT` when this code wrote it)."""

    at: Position
    event_id: str
    ledger: bytes
    format: int = LEDGER_FORMAT


async def latest_snapshot(conn: asyncpg.Connection | asyncpg.Pool) -> Snapshot | None:
    row = await conn.fetchrow(
        "SELECT version, seq, event_id, body, format FROM ledger_snapshots ORDER BY version DESC, seq DESC LIMIT 1"
    )
    if row is None:
        return None
    return Snapshot((row["version"], row["seq"]), row["event_id"], bytes(row["body"]), row["format"])


def is_first_row(at: Position) -> bool:
    """Whether `at` is where the log begins before any snapshot: the first decision's version (1, or
    0 for a rejection decided on the empty ledger), first row."""
    return at[0] <= 1 and at[1] == 0


async def take_snapshot_turn(conn: asyncpg.Connection, schema: str) -> bool:
    """Whether this transaction may take the snapshot (until it ends); False while another replica's does."""
    return bool(
        await conn.fetchval(
            "SELECT pg_try_advisory_xact_lock(hashtext($1))", f"ibpool.pool_allocator.{schema}.snapshot"
        )
    )


async def save_snapshot(conn: asyncpg.Connection, snapshot: Snapshot) -> None:
    """Keep `snapshot` as the only one. Its own row of the log stays (catching up checks the row
    at the cache's position); `PRUNE_LOG` deletes the rows before it."""
    await conn.execute(
        "INSERT INTO ledger_snapshots (version, seq, event_id, body, format) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (version, seq) DO NOTHING",
        snapshot.at[0],
        snapshot.at[1],
        snapshot.event_id,
        snapshot.ledger,
        snapshot.format,
    )
    await conn.execute("DELETE FROM ledger_snapshots WHERE (version, seq) < ($1, $2)", *snapshot.at)


PRUNE_LOG = (
    "DELETE FROM ledger_events WHERE ctid = ANY(ARRAY("
    "SELECT ctid FROM ledger_events WHERE (version, seq) < ($1, $2) ORDER BY version, seq LIMIT $3))"
)
"""Deletes the oldest $3 rows of the log before ($1, $2), a snapshot's position
(`Store.delete_in_chunks`): oldest first, so what is left is always the log's end (see `log_from`)."""
