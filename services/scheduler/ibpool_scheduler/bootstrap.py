"""Wiring: adapters in (bus, store, clock), a ready ServiceSpec out."""

from __future__ import annotations

import asyncio

from ibpool_core.clock import Clock
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.leader import role
from ibpool_runtime.service import Kit, ServiceSpec, Task

from . import api, state
from .config import SchedulerConfig
from .service import Scheduler


async def bootstrap(
    kit: Kit[SchedulerConfig], clock: Clock | None = None, pool_from_seq: int | None = None
) -> ServiceSpec:
    """`pool_from_seq` replays the pool stream from that sequence instead of its start (tests whose
    allocators share one stream)."""
    scheduler = Scheduler(kit, clock or SystemClock(), pool_from_seq)
    tasks: list[Task] = [
        scheduler.cycle_loop,
        scheduler.leader_loop,
        scheduler.feed.run,
        scheduler.nodes.run,
        scheduler.fabric_feed.run,
    ]
    if scheduler.predictor is not None:
        predictor = scheduler.predictor
        await predictor.load()  # before the service consumes or schedules (see `load`)

        async def learn_runtimes(stop: asyncio.Event) -> None:
            await predictor.run(kit.store.pool, stop)

        tasks.append(learn_runtimes)
    return ServiceSpec(
        subscriptions=scheduler.subscriptions(),
        role=lambda: role(scheduler.leadership),
        migrations=state.MIGRATIONS,
        add_routes=lambda app: app.router.add_routes(api.routes(scheduler)),
        # The cycle loop first: tests reach the scheduler through it.
        tasks=tasks,
    )
