"""Where the dashboard's data comes from: the services found on the bus and their HTTP APIs.

The services are found and called exactly as the operator CLI finds and calls them
(`ibpool_cli.ops`: the NATS service API, the leader where replicas elect one, `Cluster.call`), so
the dashboard and `ibpool nodes` can never disagree about which instance answers. `Sources` asks
the bus again every `discover_interval_s` in the background (an ask waits its second for answers)
and reads the APIs on demand; a service that does not answer leaves its part of a page empty, and
the page says which service and why (`Snapshot.errors`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ibpool_cli.ops import Cluster, OpsError, choose
from ibpool_runtime.bus import Bus
from ibpool_runtime.discovery import ServiceView, services
from ibpool_runtime.logs import get_logger
from ibpool_runtime.outages import OUTAGES
from ibpool_runtime.service import sleep_unless_stopped

log = get_logger(__name__)

MAX_JOBS = 1000
MAX_VERDICTS = 500


@dataclass
class Snapshot:
    """The services' answers read for one page (None or empty where a service did not answer)."""

    pool: dict[str, Any] | None = None
    allocations: list[dict[str, Any]] = field(default_factory=list)
    health: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    queues: dict[str, Any] | None = None
    links: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


# What a snapshot can hold: field -> (service, path, query).
READS: dict[str, tuple[str, str, dict[str, str]]] = {
    "pool": ("pool_allocator", "/v1/pool", {}),
    "allocations": ("pool_allocator", "/v1/allocations", {}),
    "health": ("failover_controller", "/health/nodes", {}),
    "jobs": ("scheduler", "/v1/jobs", {"live": "true", "limit": str(MAX_JOBS)}),
    "queues": ("scheduler", "/v1/queues", {}),
    "links": ("fabric_monitor", "/v1/links", {}),
    "verdicts": ("failover_controller", "/health/verdicts", {"limit": str(MAX_VERDICTS)}),
}


class Sources:
    def __init__(self, bus: Bus, http: aiohttp.ClientSession, token: str | None, wait_s: float = 1.0) -> None:
        self.bus, self.http, self.token, self.wait_s = bus, http, token, wait_s
        self.found: list[ServiceView] = []
        self.urls: dict[str, str] = {}
        self._topology: tuple[str, dict[str, Any]] | None = None  # (the fabric monitor's URL + version, it)
        self._seen: dict[str, tuple[float, ServiceView]] = {}

    async def discover(self, forget_after_s: float = 15.0) -> None:
        """Ask the bus who serves; an instance that did not answer this once (busy for a second) is
        kept until it has not answered for `forget_after_s`."""
        now = time.monotonic()
        for v in await services(self.bus, wait_s=self.wait_s):
            self._seen[v.id or v.http_url] = (now, v)
        self._seen = {k: (t, v) for k, (t, v) in self._seen.items() if now - t <= forget_after_s}
        self.found = sorted((v for _, v in self._seen.values()), key=lambda v: (v.service, v.instance))
        self.urls = choose(self.found)

    async def keep_discovering(self, stop: asyncio.Event, interval_s: float) -> None:
        while not stop.is_set():
            try:
                await self.discover(forget_after_s=3 * interval_s)
            except OUTAGES as e:
                log.warning("service discovery failed", error=str(e) or type(e).__name__)
            await sleep_unless_stopped(stop, interval_s)

    def cluster(self, token: str | None = None) -> Cluster:
        """The services as the operator CLI calls them, with `token` (default: the dashboard's own)."""
        return Cluster(self.urls, token if token is not None else self.token, self.http)

    async def snapshot(self, *wanted: str) -> Snapshot:
        """The answers named in `wanted` (READS' keys), read at once."""
        c = self.cluster()
        snap = Snapshot()

        async def read(name: str) -> None:
            service, path, query = READS[name]
            try:
                setattr(snap, name, await c.call("GET", service, path, **query))
            except OpsError as e:
                snap.errors[name] = str(e)

        await asyncio.gather(*(read(name) for name in wanted))
        missing = [name for name in snap.errors if READS[name][0] not in self.urls]
        if missing:  # started after the last ask: ask now rather than show a page without it
            await self.discover()
            c = self.cluster()
            for name in missing:
                del snap.errors[name]
            await asyncio.gather(*(read(name) for name in missing))
        return snap

    async def topology(self) -> tuple[dict[str, Any] | None, str | None]:
        """The fabric monitor's current topology (read again only when its version changes), or the
        reason it could not be read."""
        c = self.cluster()
        try:
            versions = await c.call("GET", "fabric_monitor", "/v1/topology/versions")
            newest = max((v.get("version", 0) for v in versions), default=0) if isinstance(versions, list) else 0
            key = f"{c.url('fabric_monitor')}#{newest}"
            if self._topology is None or self._topology[0] != key:
                self._topology = (key, await c.call("GET", "fabric_monitor", "/v1/topology"))
            return self._topology[1], None
        except OpsError as e:
            return None, str(e)
