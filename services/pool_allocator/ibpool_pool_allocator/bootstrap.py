"""Wiring: adapters in (bus, store, clock, placer, fabric distance), a ready ServiceSpec out."""

from __future__ import annotations

from ibpool_core.clock import Clock
from ibpool_core.pool.allocate import Hops
from ibpool_core.pool.placement import Placer, first_fit
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.service import Kit, ServiceSpec

from . import api, state
from .config import PoolAllocatorConfig
from .service import PoolAllocator


async def bootstrap(
    kit: Kit[PoolAllocatorConfig], clock: Clock | None = None, place: Placer = first_fit, hops: Hops | None = None
) -> ServiceSpec:
    allocator = PoolAllocator(kit, clock or SystemClock(), place, hops)
    return ServiceSpec(
        subscriptions=allocator.subscriptions(),
        migrations=state.MIGRATIONS,
        add_routes=lambda app: app.router.add_routes(api.routes(allocator)),
        tasks=[allocator.expiry_loop],
        on_start=allocator.load,
    )
