"""Wiring: adapters in (bus, store, topology loader, counter source, clock), a ready ServiceSpec out."""

from __future__ import annotations

from ibpool_core.clock import Clock
from ibpool_core.fabric.model import Topology
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.service import Kit, ServiceSpec

from . import api, state
from .config import FabricMonitorConfig
from .service import FabricMonitor, SourceFactory, TopologyLoader
from .sources import AgentsSource, CounterSource, NoSource, PerfquerySource, SimulatedSource, SysfsSource
from .topology_source import topology_loader


def source_factory(cfg: FabricMonitorConfig) -> SourceFactory:
    def make(topology: Topology) -> CounterSource:
        match cfg.counter_source:
            case "simulated":
                return SimulatedSource(topology, cfg.seed)
            case "sysfs":
                return SysfsSource(cfg.sysfs_root, topology)
            case "agents":
                return AgentsSource(topology)
            case "perfquery":
                hosts = {h.strip() for h in cfg.perfquery_hosts.split(",") if h.strip()}
                return PerfquerySource(cfg.perfquery_command, topology, hosts or None)
            case _:
                return NoSource()

    return make


async def bootstrap(
    kit: Kit[FabricMonitorConfig],
    load_topology: TopologyLoader | None = None,
    make_source: SourceFactory | None = None,
    clock: Clock | None = None,
) -> ServiceSpec:
    monitor = FabricMonitor(
        kit,
        load_topology or topology_loader(kit.config),
        make_source or source_factory(kit.config),
        clock or SystemClock(),
    )
    return ServiceSpec(
        subscriptions=monitor.subscriptions(),
        migrations=state.MIGRATIONS,
        add_routes=lambda app: app.router.add_routes(api.routes(monitor)),
        tasks=[monitor.poll_loop, monitor.rediscover_loop],
        on_start=monitor.start,
    )
