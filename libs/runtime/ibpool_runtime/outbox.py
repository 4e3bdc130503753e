"""The outbox relay: publishes committed outbox rows in commit order and deletes them once acked.

One relay at a time per schema: the relay that takes the schema's session advisory lock keeps it,
on a connection of its own, for as long as it runs, so events of one aggregate leave in the order
they were committed; another replica's relay tries again every `poll_s` and takes over when the
holder's connection ends. A holder that freezes (a paused container, a stalled VM) loses the lock
after `hold_idle_s`: its connection is closed by Postgres (`idle_session_timeout`), since a live
holder reads the outbox at least every `poll_s`. The holder is woken by its own service's commits and, through LISTEN
(migration 002), by every replica's. A round is one statement: delete the rows the previous round
published (JetStream acked them) and read the oldest of the rest; then publish them. Rows a round
published are deleted by the next one, which comes with the next commit or `linger_s` later. A
crash after publish and before that delete republishes; JetStream drops the copy by `Nats-Msg-Id`.
So the relay's connection runs with `synchronous_commit = off`: a delete lost in a crash is the same
case. The services' other commits still wait for their WAL
fsync, except the scheduler's cycles that only propose (`ibpool_scheduler.state.lock_cycle` says
why a lost one is harmless).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Any

import asyncpg
import msgspec

from . import faults
from .bus import Bus, OutgoingMessage
from .logs import get_logger
from .metrics import ServiceMetrics, count_failure
from .outages import OUTAGES
from .store import Store

log = get_logger(__name__)


# One round: delete what the previous round published, read the oldest rows of the rest (the
# statement's snapshot still holds the deleted rows, hence the filter).
_ROUND = (
    "WITH published AS (DELETE FROM outbox WHERE seq = ANY($1::bigint[]))"
    " SELECT seq, subject, headers, body FROM outbox WHERE seq <> ALL($1::bigint[]) ORDER BY seq LIMIT $2"
)


def notify_channel(schema: str) -> str:
    """The LISTEN channel of a schema's outbox commits (as migration 002 names it)."""
    return "ibpool_outbox_" + hashlib.md5(schema.encode()).hexdigest()[:16]


class OutboxRelay:
    def __init__(
        self,
        store: Store,
        bus: Bus,
        *,
        window: int = 256,
        poll_s: float = 0.5,
        hold_idle_s: float = 5.0,
        linger_s: float = 0.05,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics  # counts the rounds that met an outage (`ibpool_loop_failures`)
        self.linger_s = min(linger_s, poll_s)
        # Seqs of rows published and not yet deleted: the next round's statement deletes them.
        self._published: list[int] = []
        self.hold_idle_s = max(hold_idle_s, 4 * poll_s)
        self.bus = bus
        self.window = window
        self.poll_s = poll_s
        self.published = 0
        self._lock_key = f"ibpool.outbox.{store.schema}"
        self._channel = notify_channel(store.schema)
        self._conn: asyncpg.Connection | None = None  # holds the lock while set
        # One user of the connection at a time: a flush at shutdown may start while a slow round of
        # `run` is still going.
        self._using = asyncio.Lock()

    async def run(self, stop: asyncio.Event) -> None:
        wake = self.store.outbox_committed()
        try:
            while not stop.is_set():
                wake.clear()
                try:
                    while await self.publish_pending() == self.window:
                        pass
                except (*OUTAGES, asyncpg.exceptions.InternalClientError) as e:
                    # The bus or the store is down, or the held connection is in a state asyncpg
                    # cannot go on from (seen once under load at 5,000 nodes: "cannot switch to state
                    # 12; another operation is in progress"): drop the connection, retry next tick.
                    count_failure(self.metrics, "outbox relay", e)
                    log.warning("outbox relay failed, will retry", error=str(e) or type(e).__name__)
                    await self._let_go(broken=True)
                waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait())]
                # Published rows wait for the next round's delete: soon, if no commit wakes it first.
                timeout = self.linger_s if self._published else self.poll_s
                try:
                    await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            with contextlib.suppress(Exception):
                await self._delete_published()
            await self._let_go()

    async def _delete_published(self) -> None:
        """Delete the rows the last round published, now (not with a next round)."""
        async with self._using:
            if self._published and self._conn is not None and not self._conn.is_closed():
                await self._conn.execute("DELETE FROM outbox WHERE seq = ANY($1::bigint[])", self._published)
                self._published = []

    async def publish_pending(self) -> int:
        """Publish up to `window` rows; returns how many were published (0 if another relay holds the lock)."""
        async with self._using:
            return await self._publish_pending()

    async def _publish_pending(self) -> int:
        conn = await self._holder()
        if conn is None:
            return 0
        rows = await conn.fetch(_ROUND, self._published, self.window)
        self._published = []
        if not rows:
            return 0
        faults.crash_if_armed("outbox.before_publish")
        batch = [OutgoingMessage(r["subject"], msgspec.json.decode(r["headers"]), bytes(r["body"])) for r in rows]
        await self.bus.publish_batch(batch)
        self._published = [r["seq"] for r in rows]
        self.published += len(rows)
        return len(rows)

    async def _holder(self) -> asyncpg.Connection | None:
        """The connection holding this schema's relay lock: kept, or taken now; None while another has it."""
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        self._conn = None
        pool = self.store.pool
        conn = await pool.acquire()
        try:
            got = await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", self._lock_key)
            if got:
                await conn.execute(
                    "SELECT set_config('synchronous_commit', 'off', false),"
                    " set_config('idle_session_timeout', $1, false)",
                    f"{round(self.hold_idle_s * 1000)}ms",
                )
                await conn.add_listener(self._channel, self._notified)
        except BaseException:
            conn.terminate()
            await pool.release(conn)
            raise
        if not got:
            await pool.release(conn)
            return None
        self._conn = conn
        return conn

    def _notified(self, *_: Any) -> None:
        self.store.outbox_committed().set()

    async def _let_go(self, *, broken: bool = False) -> None:
        """Give the lock and the connection back (the connection as the pool lent it: the lock, the
        listener and the session setting undone; or closed when `broken`)."""
        async with self._using:
            conn, self._conn = self._conn, None
            if conn is not None:
                await self._give_back(conn, broken)

    async def _give_back(self, conn: asyncpg.Connection, broken: bool) -> None:
        # Only a connection whose session was undone goes back as it is: one that is broken, or
        # whose undoing failed or was cancelled, is closed (its lock and settings end with it)
        # rather than lent out again with them.
        undone = False
        try:
            if not broken and not conn.is_closed():
                await conn.remove_listener(self._channel, self._notified)
                await conn.execute(
                    "RESET synchronous_commit; RESET idle_session_timeout; SELECT pg_advisory_unlock_all()"
                )
                undone = True
        except OUTAGES as e:  # the store away: the connection is closed below (anything else propagates, after that)
            count_failure(self.metrics, "outbox relay", e)
        finally:
            if not undone:
                with contextlib.suppress(Exception):
                    conn.terminate()
            with contextlib.suppress(Exception):  # the pool may be closed and have taken it back
                await self.store.pool.release(conn)

    async def flush(self, timeout_s: float = 10.0) -> None:
        """Publish everything committed so far (used at shutdown)."""

        async def _drain() -> None:
            while await self.publish_pending():
                pass

        try:
            await asyncio.wait_for(_drain(), timeout=timeout_s)
        except OUTAGES as e:  # the bus or the store away at shutdown, or past `timeout_s`
            count_failure(self.metrics, "outbox flush", e)
            log.warning("outbox flush incomplete; rows stay for the next start", error=str(e) or type(e).__name__)
        finally:
            await self._let_go()
