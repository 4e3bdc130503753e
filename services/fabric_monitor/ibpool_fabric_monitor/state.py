"""The fabric monitor's store: topology versions, link health and counter history."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import asyncpg
import msgspec

from ibpool_core.fabric.link_health import LinkHealth, PortSample
from ibpool_core.fabric.model import Topology

MIGRATIONS = Path(__file__).parent / "migrations"

_topology = msgspec.json.Decoder(Topology)
_health = msgspec.json.Decoder(LinkHealth)


class VersionRow(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    content_hash: str
    hosts: int
    switches: int
    links: int
    created_at: dt.datetime


async def latest_version(conn: asyncpg.Connection | asyncpg.Pool) -> VersionRow | None:
    r = await conn.fetchrow(
        "SELECT version, content_hash, hosts, switches, links, created_at FROM topology_versions"
        " ORDER BY version DESC LIMIT 1"
    )
    return None if r is None else VersionRow(**dict(r))


async def versions(conn: asyncpg.Connection | asyncpg.Pool) -> list[VersionRow]:
    rows = await conn.fetch(
        "SELECT version, content_hash, hosts, switches, links, created_at FROM topology_versions ORDER BY version"
    )
    return [VersionRow(**dict(r)) for r in rows]


async def topology(conn: asyncpg.Connection | asyncpg.Pool, version: int) -> Topology | None:
    body = await conn.fetchval("SELECT body FROM topology_versions WHERE version = $1", version)
    return None if body is None else _topology.decode(body)


async def insert_version(
    conn: asyncpg.Connection, version: int, digest: str, t: Topology, now: dt.datetime, kept: int
) -> None:
    """Store a new topology version; of the versions before it, `kept` - 1 stay."""
    await conn.execute("DELETE FROM topology_versions WHERE version <= $1", version - kept)
    await conn.execute(
        "INSERT INTO topology_versions (version, content_hash, body, hosts, switches, links, created_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)",
        version,
        digest,
        msgspec.json.encode(t),
        len(t.hosts),
        len(t.switches),
        len(t.links),
        now,
    )


async def link_healths(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, LinkHealth]:
    rows = await conn.fetch("SELECT body FROM link_health")
    return {h.link_id: h for h in (_health.decode(r["body"]) for r in rows)}


async def links_in_state(conn: asyncpg.Connection | asyncpg.Pool, state: str | None) -> list[tuple[str, str]]:
    if state is None:
        rows = await conn.fetch("SELECT link_id, state FROM link_health ORDER BY link_id")
    else:
        rows = await conn.fetch("SELECT link_id, state FROM link_health WHERE state = $1 ORDER BY link_id", state)
    return [(r["link_id"], r["state"]) for r in rows]


async def save_health(conn: asyncpg.Connection, healths: list[LinkHealth], now: dt.datetime) -> None:
    await conn.executemany(
        "INSERT INTO link_health (link_id, state, body, updated_at) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (link_id) DO UPDATE SET state = $2, body = $3, updated_at = $4",
        [(h.link_id, h.state, msgspec.json.encode(h).decode(), now) for h in healths],
    )


def sample_slot(at: dt.datetime, interval_s: float, keep: int) -> int:
    """The ring slot of a sample taken at `at`: polls `interval_s` apart take consecutive slots, and
    the slot `keep` polls later is the same one, so each link keeps its last `keep` samples."""
    return int(at.timestamp() // interval_s) % keep


async def record_samples(conn: asyncpg.Connection, samples: list[PortSample], keep: int, interval_s: float) -> None:
    """Store one poll's samples in the per-link ring (migration 002): each overwrites its slot, so
    the rows of a link never exceed `keep` and no prune runs."""
    await conn.executemany(
        "INSERT INTO counter_ring (link_id, slot, at, up, sample) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (link_id, slot) DO UPDATE SET at = $3, up = $4, sample = $5",
        [
            (s.link_id, sample_slot(s.at, interval_s, keep), s.at, s.up, msgspec.json.encode(s).decode())
            for s in samples
        ],
    )


async def recent_samples(conn: asyncpg.Connection | asyncpg.Pool, link_id: str) -> list[PortSample]:
    """The samples kept of `link_id`, newest first."""
    rows = await conn.fetch("SELECT sample FROM counter_ring WHERE link_id = $1 ORDER BY at DESC", link_id)
    return [msgspec.json.decode(r["sample"], type=PortSample) for r in rows]
