"""Wiring: adapters in (bus, store, clock), a ready ServiceSpec out."""

from __future__ import annotations

from ibpool_core.clock import Clock
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.leader import role
from ibpool_runtime.service import Kit, ServiceSpec

from . import api, state
from .config import FailoverControllerConfig
from .service import FailoverController


async def bootstrap(kit: Kit[FailoverControllerConfig], clock: Clock | None = None) -> ServiceSpec:
    controller = FailoverController(kit, clock or SystemClock())
    return ServiceSpec(
        subscriptions=controller.subscriptions(),
        role=lambda: role(controller.leadership),
        migrations=state.MIGRATIONS,
        add_routes=lambda app: app.router.add_routes(api.routes(controller)),
        tasks=[controller.leader_loop, controller.beats_loop, controller.connections_loop, controller.tick_loop],
    )
