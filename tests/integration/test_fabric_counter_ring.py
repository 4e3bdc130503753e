"""The fabric monitor's counter history on a real Postgres: a ring per link, never more rows than
the window however many polls, the newest kept, and no prune statement."""

from __future__ import annotations

import datetime as dt
import itertools

from ibpool_core.fabric.link_health import PortSample
from ibpool_fabric_monitor import state
from ibpool_runtime.store import Store

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
INTERVAL_S = 5.0
KEEP = 7


async def test_rows_per_link_never_exceed_the_window_and_the_newest_are_kept(store: Store) -> None:
    await store.migrate(state.MIGRATIONS)
    links = ["l1", "l2", "l3"]
    for poll in range(3 * KEEP + 2):
        at = T0 + dt.timedelta(seconds=INTERVAL_S * poll)
        samples = [PortSample(link_id=link, at=at, up=poll % 2 == 0, counters={"errors": poll}) for link in links]
        async with store.transaction() as tx:
            await state.record_samples(tx.conn, samples, KEEP, INTERVAL_S)
        async with store.pool.acquire() as conn:
            per_link = await conn.fetch("SELECT link_id, count(*) AS n FROM counter_ring GROUP BY link_id")
        assert all(r["n"] <= KEEP for r in per_link), (poll, per_link)
    kept = await state.recent_samples(store.pool, "l2")
    assert [s.counters["errors"] for s in kept] == list(range(3 * KEEP + 1, 2 * KEEP + 1, -1))
    assert kept[0].at == T0 + dt.timedelta(seconds=INTERVAL_S * (3 * KEEP + 1))


def test_consecutive_polls_take_consecutive_slots_around_the_ring() -> None:
    slots = [state.sample_slot(T0 + dt.timedelta(seconds=INTERVAL_S * k), INTERVAL_S, KEEP) for k in range(2 * KEEP)]
    assert sorted(set(slots)) == list(range(KEEP))
    assert all((b - a) % KEEP == 1 for a, b in itertools.pairwise(slots))
