"""Wiring: adapters in (bus, store, clock, placer, fabric distance), a ready ServiceSpec out."""

from __future__ import annotations

from ibpool_core.clock import Clock
from ibpool_core.fabric.view import FabricView
from ibpool_core.pool.allocate import Hops
from ibpool_core.pool.placement import GpuPlacer
from ibpool_core.pool.policy_placer import policy_placer
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.config import ConfigError
from ibpool_runtime.fabric_feed import load_fabric_file
from ibpool_runtime.grant_signing import GrantSigner, SigningKeyError, load_seed
from ibpool_runtime.logs import get_logger
from ibpool_runtime.service import Kit, ServiceSpec

from . import api, state
from .config import PoolAllocatorConfig
from .service import PoolAllocator

log = get_logger(__name__)


async def bootstrap(
    kit: Kit[PoolAllocatorConfig], clock: Clock | None = None, place: GpuPlacer | None = None, hops: Hops | None = None
) -> ServiceSpec:
    """`place` overrides the placer (by default the packing policy `placement_policy` of the config,
    with the fabric for gangs and remote use); `hops` overrides the fabric's distances."""
    fabric = fabric_at_start(kit.config)
    sign_grants(kit)
    if place is None:
        place = placer_for(kit.config, fabric)
    allocator = PoolAllocator(kit, clock or SystemClock(), place, hops, fabric)
    return ServiceSpec(
        subscriptions=allocator.subscriptions(),
        migrations=state.MIGRATIONS,
        add_routes=lambda app: app.router.add_routes(api.routes(allocator)),
        # The expiry loop first: tests reach the allocator through it.
        tasks=[allocator.expiry_loop, allocator.fabric_feed.run, allocator.snapshot_loop],
        on_start=allocator.load,
        check=allocator.check_snapshot,
    )


def sign_grants(kit: Kit[PoolAllocatorConfig]) -> None:
    """Sign what node agents act on with the seed of `grant_signing_seed_file` (ConfigError when it
    cannot be read); say so loudly when no seed is configured."""
    path = kit.config.grant_signing_seed_file
    if not path:
        log.warning("grants are not signed (no grant_signing_seed_file): agents cannot tell them from forged ones")
        return
    try:
        signer = GrantSigner(load_seed(path))
    except SigningKeyError as e:
        raise ConfigError(f"invalid pool_allocator config: field `grant_signing_seed_file`: {e}") from None
    kit.store.signer = signer.sign
    log.info("grants are signed", public_key=signer.public_key)


def fabric_at_start(cfg: PoolAllocatorConfig) -> FabricView:
    """The fabric of `cfg.fabric_file`, or none until a topology is published; ConfigError when the
    file cannot be read."""
    if not cfg.fabric_file:
        return FabricView()
    loaded = load_fabric_file(cfg.fabric_file, cfg.fabric_format, service="pool_allocator")
    about = loaded.about
    log.info("fabric topology loaded", file=about.origin, hosts=about.hosts, leaf_groups=about.leaf_groups)
    return FabricView(loaded)


def placer_for(cfg: PoolAllocatorConfig, fabric: FabricView | None = None) -> GpuPlacer:
    """The placer of `cfg.placement_policy`; ConfigError naming the known policies when unknown."""
    try:
        return policy_placer(cfg.placement_policy, fabric)
    except ValueError as e:
        raise ConfigError(f"invalid pool_allocator config: field `placement_policy`: {e}") from None
