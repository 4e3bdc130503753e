"""Wiring: adapters in (bus, store, clock), a ready ServiceSpec out."""

from __future__ import annotations

from aiohttp import web

from ibpool_core.clock import Clock
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.leader import role
from ibpool_runtime.service import Kit, ServiceSpec

from . import api, state
from .config import AutoscalerConfig
from .service import Autoscaler


async def bootstrap(
    kit: Kit[AutoscalerConfig], clock: Clock | None = None, pool_from_seq: int | None = None
) -> ServiceSpec:
    """`pool_from_seq`: the ledger replica replays the pool stream from there (tests sharing one stream)."""
    autoscaler = Autoscaler(kit, clock or SystemClock(), pool_from_seq)

    def add_routes(app: web.Application) -> None:
        app.router.add_routes(api.routes(autoscaler))

    return ServiceSpec(
        subscriptions=autoscaler.subscriptions(),
        role=lambda: role(autoscaler.leadership),
        migrations=state.MIGRATIONS,
        add_routes=add_routes,
        # The control loop first: tests reach the autoscaler through it.
        tasks=[autoscaler.control_loop, autoscaler.leader_loop, autoscaler.pool_loop],
    )
