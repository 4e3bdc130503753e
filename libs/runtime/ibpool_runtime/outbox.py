"""The outbox relay: publishes committed outbox rows in commit order and deletes them once acked.

One relay at a time per schema (a transaction-level advisory lock), so events of one aggregate
leave in the order they were committed. A crash after publish and before delete republishes;
JetStream drops the copy by `Nats-Msg-Id`. So the relay's own transaction commits without waiting
for its WAL fsync (`synchronous_commit = off`, for that transaction only): a delete lost in a crash
is the same case, and Postgres's other commits, the services' state changes, still wait for theirs.
"""

from __future__ import annotations

import asyncio
import contextlib

import msgspec

from . import faults
from .bus import Bus, OutgoingMessage
from .logs import get_logger
from .store import Store

log = get_logger(__name__)


class OutboxRelay:
    def __init__(self, store: Store, bus: Bus, *, window: int = 256, poll_s: float = 0.5) -> None:
        self.store = store
        self.bus = bus
        self.window = window
        self.poll_s = poll_s
        self.published = 0

    async def run(self, stop: asyncio.Event) -> None:
        wake = self.store.outbox_committed()
        while not stop.is_set():
            wake.clear()
            try:
                while await self.publish_pending() == self.window:
                    pass
            except Exception as e:  # the bus or the store is down: retry on the next tick
                log.warning("outbox relay failed, will retry", error=str(e) or type(e).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=self.poll_s)

    async def publish_pending(self) -> int:
        """Publish up to `window` rows; returns how many were published (0 if another relay holds the lock)."""
        async with self.store.pool.acquire() as conn, conn.transaction():
            # The delete need not wait for its own fsync: if a crash loses it, the rows are published
            # again and JetStream drops the copies by Nats-Msg-Id, as after a crash before the delete.
            locked = await conn.fetchval(
                "SELECT pg_try_advisory_xact_lock(hashtext($1)) FROM set_config('synchronous_commit', 'off', true)",
                f"ibpool.outbox.{self.store.schema}",
            )
            if not locked:
                return 0
            rows = await conn.fetch("SELECT seq, subject, headers, body FROM outbox ORDER BY seq LIMIT $1", self.window)
            if not rows:
                return 0
            faults.crash_if_armed("outbox.before_publish")
            batch = [OutgoingMessage(r["subject"], msgspec.json.decode(r["headers"]), bytes(r["body"])) for r in rows]
            await self.bus.publish_batch(batch)
            await conn.execute("DELETE FROM outbox WHERE seq = ANY($1::bigint[])", [r["seq"] for r in rows])
        self.published += len(rows)
        return len(rows)

    async def flush(self, timeout_s: float = 10.0) -> None:
        """Publish everything committed so far (used at shutdown)."""

        async def _drain() -> None:
            while await self.publish_pending():
                pass

        try:
            await asyncio.wait_for(_drain(), timeout=timeout_s)
        except Exception as e:
            log.warning("outbox flush incomplete; rows stay for the next start", error=str(e) or type(e).__name__)
