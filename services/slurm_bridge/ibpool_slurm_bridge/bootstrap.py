"""Wiring: adapters in (bus, store, scontrol), a ready ServiceSpec out."""

from __future__ import annotations

from ibpool_runtime.service import Kit, ServiceSpec

from . import api, state
from .config import SlurmBridgeConfig
from .service import SlurmBridge
from .slurm import Scontrol


async def bootstrap(kit: Kit[SlurmBridgeConfig], scontrol: Scontrol | None = None) -> ServiceSpec:
    bridge = SlurmBridge(kit, scontrol)
    return ServiceSpec(
        subscriptions=bridge.subscriptions(),
        migrations=state.MIGRATIONS,
        add_routes=lambda app: app.router.add_routes(api.routes(bridge)),
        tasks=[bridge.sync_loop, bridge.feed.run],
    )
