"""Wiring: adapters in (bus, store, GPU backends, clock), a ready ServiceSpec out."""

from __future__ import annotations

from ibpool_core.clock import Clock
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.service import Kit, ServiceSpec

from . import api, state
from .backends import GpuBackend, make_backends
from .config import NodeAgentConfig
from .service import NodeAgent


async def bootstrap(
    kit: Kit[NodeAgentConfig], backends: list[GpuBackend] | None = None, clock: Clock | None = None
) -> ServiceSpec:
    agent = NodeAgent(kit, backends if backends is not None else make_backends(kit.config), clock or SystemClock())
    return ServiceSpec(
        subscriptions=agent.subscriptions(),
        migrations=state.MIGRATIONS,
        add_routes=lambda app: app.router.add_routes(api.routes(agent)),
        tasks=[agent.heartbeat_loop, agent.telemetry_loop, agent.xid_loop, agent.workload_loop, agent.prune_loop],
        on_start=agent.register,
        on_stop=agent.deregister,
    )
