"""The store: asyncpg on Postgres, one schema per service, numbered SQL migrations, inbox and outbox.

A handler's state change, the id of the event it handled (inbox) and the events it caused
(outbox) are written in one transaction, so a redelivered event changes nothing and a crash
between commit and publish loses nothing.

Rows that only need to be there at commit (the outbox, an append-only log) can be queued with
`Transaction.executemany_at_commit`: all rows queued for one statement go in one `executemany`
just before the commit, or before the savepoint they were queued in is released. A batch of
handlers in one transaction then pays one round trip for all their outbox rows, not one each.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from ibpool_proto import Message

from .bus import OutgoingMessage, outgoing
from .logs import get_logger
from .metrics import ServiceMetrics, count_failure
from .outages import OUTAGES

log = get_logger(__name__)

RUNTIME_MIGRATIONS = Path(__file__).parent / "migrations"
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}\Z")
_MIGRATION_NAME = re.compile(r"^(\d+)_[\w-]+\.sql$")


class StoreUnavailable(Exception):
    """Postgres could not be reached after the configured retries."""


class MigrationError(Exception):
    """A migration file is misnamed or failed to apply; the message names the file."""


class Transaction:
    """One database transaction of a service: its own state, the inbox and the outbox."""

    def __init__(self, conn: asyncpg.Connection, on_outbox: Any = None, signer: Signer | None = None) -> None:
        self.conn = conn
        self._on_outbox = on_outbox
        self._signer = signer
        self.emitted = 0
        # Rows queued for one executemany per statement, in first-queued order; one scope per open savepoint.
        self._queued: dict[str, list[Sequence[Any]]] = {}
        self._savepoints = 0
        self._after_commit: list[Callable[[], None]] = []
        # What a service keeps between the handlers of one transaction (rows read ahead for a batch,
        # see `Subscription.prepare`); emptied when a savepoint rolls back, as it may be stale then.
        self.scratch: dict[str, Any] = {}

    @property
    def in_savepoint(self) -> bool:
        """True inside `savepoint()`: work done now may be rolled back while the transaction goes on."""
        return self._savepoints > 0

    async def mark_handled(self, consumer: str, event_id: str) -> bool:
        """Record that `consumer` handled `event_id`; False if it already had (a redelivery)."""
        row = await self.conn.fetchval(
            "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
            consumer,
            event_id,
        )
        return row is not None

    async def mark_handled_many(self, consumer: str, event_ids: list[str]) -> list[str]:
        """Record a batch of handled ids in one statement; returns the ids not seen before."""
        rows = await self.conn.fetch(
            "INSERT INTO inbox (consumer, event_id) SELECT $1, unnest($2::text[])"
            " ON CONFLICT DO NOTHING RETURNING event_id",
            consumer,
            event_ids,
        )
        return [r["event_id"] for r in rows]

    async def outbox(self, *messages: Message) -> None:
        """Queue messages for publishing; they leave only if this transaction commits.

        The rows are written at commit (see `executemany_at_commit`); the headers, trace context
        included, are taken now.
        """
        rows = []
        for m in messages:
            out = outgoing(m)
            if self._signer is not None:
                out = self._signer(m, out)
            rows.append((m.id, out.subject, msgspec.json.encode(out.headers).decode(), out.body))
        self.executemany_at_commit(_OUTBOX_INSERT, rows)

    def after_commit(self, call: Callable[[], None]) -> None:
        """Call `call` (once, synchronously) after this transaction commits; never if it rolls back.
        For waking a loop that reads what this transaction writes: woken earlier, it could read
        the rows before they are committed and miss them. A call queued inside a savepoint that
        rolls back still runs: it must be harmless when nothing changed (a spurious wake-up)."""
        if call not in self._after_commit:
            self._after_commit.append(call)

    def executemany_at_commit(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        """Queue `rows` for `statement`, written with one `executemany` per statement before commit.

        Inside a savepoint they are written before it is released, and dropped if it rolls back.
        Statements run in the order they were first queued, rows in the order queued. Until then
        the rows are not in the database: a query of this transaction does not see them, and a
        failing write fails the commit (or the savepoint), not the call that queued them.
        """
        if rows:
            self._queued.setdefault(statement, []).extend(rows)

    async def write_queued(self, *, outbox: bool = True) -> None:
        """Write the rows queued in the current scope now (done before every commit and savepoint release).
        `outbox=False` leaves the outbox rows queued (for the commit): a transaction that must read
        its own writes back before it ends need not write its events twice."""
        queued, self._queued = self._queued, {}
        if not outbox and _OUTBOX_INSERT in queued:
            self._queued[_OUTBOX_INSERT] = queued.pop(_OUTBOX_INSERT)
        for statement, rows in queued.items():
            await self.conn.executemany(statement, rows)
            if statement == _OUTBOX_INSERT:
                self.emitted += len(rows)

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        outer, self._queued = self._queued, {}
        self._savepoints += 1
        try:
            async with self.conn.transaction():
                yield
                await self.write_queued()
        except BaseException:
            self.scratch.clear()
            raise
        finally:
            self._savepoints -= 1
            self._queued = outer


# Adds what an outgoing message carries beyond its envelope (the pool allocator's grant signature:
# `grant_signing.GrantSigner.sign`), at the time it is queued in the outbox.
Signer = Callable[[Message, OutgoingMessage], OutgoingMessage]

_OUTBOX_INSERT = (
    "INSERT INTO outbox (event_id, subject, headers, body) VALUES ($1, $2, $3, $4) ON CONFLICT (event_id) DO NOTHING"
)


def rows_affected(status: str) -> int:
    """How many rows a statement changed, from its command status (`DELETE 3`, `INSERT 0 3`)."""
    return int(status.rsplit(" ", 1)[1])


_INBOX_PRUNE = (
    "DELETE FROM inbox WHERE ctid = ANY(ARRAY("
    "SELECT ctid FROM inbox WHERE handled_at < now() - make_interval(secs => $1) LIMIT $2))"
)


class Store:
    def __init__(self, pool: asyncpg.Pool, schema: str) -> None:
        self.pool = pool
        self.schema = schema
        self._committed_outbox = asyncio.Event()
        # Applied to every message a transaction queues in the outbox (the allocator's grant signer).
        self.signer: Signer | None = None

    @classmethod
    async def connect(
        cls, dsn: str, schema: str, *, attempts: int = 10, backoff_s: float = 0.5, max_size: int = 10
    ) -> Store:
        if not _SCHEMA_NAME.match(schema):
            raise ValueError(f"schema name {schema!r} must be a lower-case SQL identifier")
        last: Exception | None = None
        for attempt in range(1, attempts + 1):
            try:
                conn = await asyncpg.connect(dsn, timeout=5)
                try:
                    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                finally:
                    await conn.close()
                pool = await asyncpg.create_pool(
                    dsn,
                    min_size=1,
                    max_size=max_size,
                    server_settings={"search_path": schema},
                    timeout=5,
                    # Skip asyncpg's reset round trip on release: we keep no session state, and an
                    # open transaction is still rolled back.
                    reset=_no_reset,
                )
                return cls(pool, schema)
            except (OSError, asyncpg.PostgresError, TimeoutError) as e:
                last = e
                log.warning("postgres connect failed", attempt=attempt, error=str(e) or type(e).__name__)
                await asyncio.sleep(min(backoff_s * 2 ** (attempt - 1), 5.0))
        raise StoreUnavailable(f"cannot reach Postgres at {_redact(dsn)} after {attempts} attempts: {last!r}")

    async def migrate(self, *dirs: Path) -> list[str]:
        """Apply numbered SQL files not yet applied, under an advisory lock; returns what ran."""
        applied_now: list[str] = []
        async with self.pool.acquire() as conn:
            await conn.execute("SELECT pg_advisory_lock(hashtext($1))", f"ibpool.migrate.{self.schema}")
            try:
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " source text NOT NULL, version int NOT NULL, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (source, version))"
                )
                for source, directory in [("runtime", RUNTIME_MIGRATIONS), *[("service", d) for d in dirs]]:
                    done = {
                        r["version"]
                        for r in await conn.fetch("SELECT version FROM schema_migrations WHERE source = $1", source)
                    }
                    for version, path in _migration_files(directory):
                        if version in done:
                            continue
                        try:
                            async with conn.transaction():
                                await conn.execute(path.read_text())
                                await conn.execute(
                                    "INSERT INTO schema_migrations (source, version, name) VALUES ($1, $2, $3)",
                                    source,
                                    version,
                                    path.name,
                                )
                        except asyncpg.PostgresError as e:
                            raise MigrationError(f"migration {path.name} failed: {e}") from None
                        applied_now.append(path.name)
            finally:
                await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", f"ibpool.migrate.{self.schema}")
        return applied_now

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        async with self.pool.acquire() as conn, conn.transaction():
            tx = Transaction(conn, signer=self.signer)
            yield tx
            await tx.write_queued()
            if tx.emitted:
                tx.after_commit(self._committed_outbox.set)  # the relay publishes what was committed
        for call in tx._after_commit:
            call()

    async def prune_inbox(self, older_than_s: float, chunk: int = 10_000, stop: asyncio.Event | None = None) -> int:
        """Delete the inbox rows handled more than `older_than_s` ago (`delete_in_chunks`)."""
        return await self.delete_in_chunks(_INBOX_PRUNE, older_than_s, chunk=chunk, stop=stop)

    async def delete_in_chunks(
        self, statement: str, *args: object, chunk: int = 10_000, stop: asyncio.Event | None = None
    ) -> int:
        """Run a DELETE of at most `chunk` rows (its last parameter, after `args`) again and again,
        each in a short transaction of its own so other work goes on between them, until it deletes
        fewer or `stop` is set; returns how many rows were deleted."""
        deleted = 0
        while stop is None or not stop.is_set():
            status = await self.pool.execute(statement, *args, chunk)
            n = rows_affected(status)
            deleted += n
            if n < chunk:
                break
            await asyncio.sleep(0)
        return deleted

    def outbox_committed(self) -> asyncio.Event:
        """Set after a commit that wrote outbox rows; the relay waits on it."""
        return self._committed_outbox

    async def outbox_lag(self) -> int:
        return int(await self.pool.fetchval("SELECT count(*) FROM outbox"))

    async def ping(self, metrics: ServiceMetrics | None = None) -> bool:
        """Whether the store answers now (readiness); a failure is counted in `metrics` (`store ping`)."""
        try:
            return bool(await self.pool.fetchval("SELECT 1", timeout=2))
        except OUTAGES as e:
            count_failure(metrics, "store ping", e)
            return False

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.pool.close(), timeout=5)
        except TimeoutError:
            self.pool.terminate()


async def _no_reset(_: asyncpg.Connection) -> None:
    return None


def _migration_files(directory: Path) -> Iterable[tuple[int, Path]]:
    files = []
    for path in sorted(directory.glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration file {path} must be named NNN_description.sql")
        files.append((int(match.group(1)), path))
    versions = [v for v, _ in files]
    if len(versions) != len(set(versions)):
        raise MigrationError(f"two migrations in {directory} share a number")
    return files


def _redact(dsn: str) -> str:
    return re.sub(r"://([^:@/]+):[^@/]*@", r"://\1:***@", dsn)
