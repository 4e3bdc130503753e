"""Wiring: adapters in (bus, store, clock, placer, fabric distance), a ready ServiceSpec out."""

from __future__ import annotations

from ibpool_core.clock import Clock
from ibpool_core.pool.allocate import Hops
from ibpool_core.pool.placement import Placer
from ibpool_core.pool.policy_placer import policy_placer
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.config import ConfigError
from ibpool_runtime.service import Kit, ServiceSpec

from . import api, state
from .config import PoolAllocatorConfig
from .service import PoolAllocator


async def bootstrap(
    kit: Kit[PoolAllocatorConfig], clock: Clock | None = None, place: Placer | None = None, hops: Hops | None = None
) -> ServiceSpec:
    """`place` overrides the placer; by default the packing policy `placement_policy` of the config."""
    if place is None:
        place = placer_for(kit.config)
    allocator = PoolAllocator(kit, clock or SystemClock(), place, hops)
    return ServiceSpec(
        subscriptions=allocator.subscriptions(),
        migrations=state.MIGRATIONS,
        add_routes=lambda app: app.router.add_routes(api.routes(allocator)),
        tasks=[allocator.expiry_loop],
        on_start=allocator.load,
    )


def placer_for(cfg: PoolAllocatorConfig) -> Placer:
    """The placer of `cfg.placement_policy`; ConfigError naming the known policies when unknown."""
    try:
        return policy_placer(cfg.placement_policy)
    except ValueError as e:
        raise ConfigError(f"invalid pool_allocator config: field `placement_policy`: {e}") from None
