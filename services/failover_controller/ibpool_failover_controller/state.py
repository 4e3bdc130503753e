"""The controller's store: its health picture, the observations waiting for a decision, verdicts, link map."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from ibpool_core.health.decide import (
    OBSERVATIONS,
    STATE_MAPS,
    HealthState,
    Holding,
    JobRecord,
    NodeHealth,
    Observation,
    StateChanges,
)
from ibpool_core.health.link_signals import LinkTarget
from ibpool_proto import Event, encode
from ibpool_proto.codec import decode

MIGRATIONS = Path(__file__).parent / "migrations"

_state = msgspec.json.Decoder(HealthState)
_targets = msgspec.json.Decoder(dict[str, LinkTarget])
# The decoder of each map's entries (`health_entries.map` -> its value's type).
_entries: dict[str, msgspec.json.Decoder[Any]] = {
    "nodes": msgspec.json.Decoder(NodeHealth),
    "holdings": msgspec.json.Decoder(Holding),
    "jobs": msgspec.json.Decoder(JobRecord),
    "departed": msgspec.json.Decoder(dt.datetime),
    "finished": msgspec.json.Decoder(dt.datetime),
    "link_problems": msgspec.json.Decoder(list[str]),
}


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


async def load_state(conn: asyncpg.Connection) -> tuple[HealthState, bool]:
    """The picture as last saved, and whether its body still holds maps (saved whole, before
    `health_entries`): the caller then writes it anew with `save_whole`."""
    body = await conn.fetchval("SELECT body FROM health_state WHERE id = 1")
    saved = HealthState() if body is None else _state.decode(body)
    whole = any(getattr(saved, name) for name in STATE_MAPS) or bool(saved.links)
    maps: dict[str, dict[str, Any]] = {name: dict(getattr(saved, name)) for name in STATE_MAPS}
    for r in await conn.fetch("SELECT map, key, body FROM health_entries"):
        decoder = _entries.get(r["map"])
        if decoder is None:
            raise ValueError(f"health_entries: unknown map {r['map']!r} (key {r['key']!r})")
        maps[r["map"]][r["key"]] = decoder.decode(r["body"])
    # Oldest first, as the decision keeps them (it forgets from the front).
    maps["finished"] = dict(sorted(maps["finished"].items(), key=lambda kv: (kv[1], kv[0])))
    links = saved.links
    if not links and saved.topology_version:
        row = await conn.fetchrow("SELECT body FROM link_targets WHERE id = 1 AND version = $1", saved.topology_version)
        links = {} if row is None else _targets.decode(row["body"])
    return msgspec.structs.replace(saved, links=links, **maps), whole


async def save_changes(conn: asyncpg.Connection, state: HealthState, changes: StateChanges, now: dt.datetime) -> int:
    """Write the entries `changes` names (set or removed) and the body; returns how many entries."""
    written = 0
    for name in STATE_MAPS:
        keys: list[str] = getattr(changes, name)
        if not keys:
            continue
        live: dict[str, Any] = getattr(state, name)
        present = [(name, k, msgspec.json.encode(live[k]).decode()) for k in keys if k in live]
        gone = [k for k in keys if k not in live]
        if present:
            await conn.executemany(
                "INSERT INTO health_entries (map, key, body) VALUES ($1, $2, $3)"
                " ON CONFLICT (map, key) DO UPDATE SET body = EXCLUDED.body",
                present,
            )
        if gone:
            await conn.execute("DELETE FROM health_entries WHERE map = $1 AND key = ANY($2::text[])", name, gone)
        written += len(keys)
    await _save_body(conn, state, now)
    return written


async def save_whole(conn: asyncpg.Connection, state: HealthState, now: dt.datetime) -> None:
    """Write every entry of `state` anew (a body saved whole before `health_entries`)."""
    await conn.execute("DELETE FROM health_entries")
    everything = StateChanges(
        nodes=sorted(state.nodes),
        holdings=sorted(state.holdings),
        jobs=sorted(state.jobs),
        departed=sorted(state.departed),
        finished=sorted(state.finished),
        link_problems=sorted(state.link_problems),
    )
    await save_changes(conn, state, everything, now)


async def _save_body(conn: asyncpg.Connection, state: HealthState, now: dt.datetime) -> None:
    rest = HealthState(degraded=state.degraded, topology_version=state.topology_version)
    await conn.execute(
        "INSERT INTO health_state (id, body, updated_at) VALUES (1, $1, $2)"
        " ON CONFLICT (id) DO UPDATE SET body = $1, updated_at = $2",
        msgspec.json.encode(rest).decode(),
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
