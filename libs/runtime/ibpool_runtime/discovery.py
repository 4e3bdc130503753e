"""Every service instance on the NATS service API, so a client with only the NATS URL finds them all.

Each instance registers with nats-py's `nats.micro` (the NATS service protocol: `$SRV.PING`,
`$SRV.INFO`, `$SRV.STATS`), so `nats micro ls` lists it too. It registers under its service name
and ibpool's version, with metadata:

- `instance`: its source, as its events carry it;
- `http_url`: where its API is.

It has one endpoint, `ibpool.about.<service>`, which answers with `About`. The endpoint's stats
carry the instance's live `role`: `leader` or `standby` where replicas elect one, `active`
otherwise. `services(bus)` asks every instance for its stats and returns them as `ServiceView`s.
This is what `ibpool services` lists.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import EndpointStats, Service, ServiceConfig

from .bus import Bus

ABOUT_PREFIX = "ibpool.about"
DISCOVERY_WAIT_S = 1.0

Role = Callable[[], str]


class About(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    instance: str
    version: str
    role: str
    http_url: str


class ServiceView(msgspec.Struct, frozen=True, kw_only=True):
    """One running instance, as `ibpool services` shows it."""

    service: str
    instance: str
    id: str
    version: str
    role: str
    http_url: str
    started: str
    requests: int


def ibpool_version() -> str:
    try:
        return version("ibpool-runtime")
    except PackageNotFoundError:
        return "0.0.0"


def about_subject(service: str) -> str:
    return f"{ABOUT_PREFIX}.{service}"


def always_active() -> str:
    return "active"


async def register(bus: Bus, service: str, instance: str, http_url: str, role: Role | None = None) -> Service:
    """Register this instance with the NATS service API; stop the returned service on shutdown."""
    live_role = role or always_active

    def about() -> About:
        return About(service=service, instance=instance, version=ibpool_version(), role=live_role(), http_url=http_url)

    async def answer(request: Request) -> None:
        await request.respond(msgspec.json.encode(about()))

    def stats(_: EndpointStats) -> dict[str, str]:
        return {"role": live_role()}

    config = ServiceConfig(
        name=service,
        version=ibpool_version(),
        description=f"ibpool {service}",
        metadata={"instance": instance, "http_url": http_url},
        stats_handler=stats,
    )
    micro = await add_service(bus.nc, config)
    await micro.add_endpoint(name="about", subject=about_subject(service), handler=answer)
    return micro


async def services(bus: Bus, wait_s: float = DISCOVERY_WAIT_S) -> list[ServiceView]:
    """Every instance that answers `$SRV.STATS` within `wait_s`, by service and instance."""
    found: list[dict[str, Any]] = []
    inbox = bus.nc.new_inbox()

    async def collect(msg: Any) -> None:
        try:
            found.append(json.loads(msg.data))
        except ValueError:
            pass  # not a stats answer: nothing to list

    sub = await bus.nc.subscribe(inbox, cb=collect)
    try:
        await bus.nc.publish("$SRV.STATS", b"", reply=inbox)
        await bus.nc.flush()
        await asyncio.sleep(wait_s)  # how many answer is not known in advance: whoever does within the wait
    finally:
        await sub.unsubscribe()
    return sorted((_view(s) for s in found if s.get("type") == "io.nats.micro.v1.stats_response"), key=_order)


def _view(stats: dict[str, Any]) -> ServiceView:
    metadata = stats.get("metadata") or {}
    endpoints = stats.get("endpoints") or []
    role = next((str((e.get("data") or {}).get("role", "")) for e in endpoints if e.get("name") == "about"), "")
    return ServiceView(
        service=str(stats.get("name", "")),
        instance=str(metadata.get("instance", "")),
        id=str(stats.get("id", "")),
        version=str(stats.get("version", "")),
        role=role or "unknown",
        http_url=str(metadata.get("http_url", "")),
        started=str(stats.get("started", "")),
        requests=sum(int(e.get("num_requests", 0)) for e in endpoints),
    )


def _order(view: ServiceView) -> tuple[str, str]:
    return view.service, view.instance
