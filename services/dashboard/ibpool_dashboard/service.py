"""The dashboard's lifecycle: connect to the bus -> HTTP -> register on the NATS service API -> the
feed, discovery and sampling loops -> run until SIGTERM/SIGINT -> stop the loops, close every
`/events` stream, take itself off the service API, close HTTP and the bus.

It is built from the runtime's parts (config, logs, `create_app` with /healthz, /readyz, /metrics,
/openapi.json and the API tokens, `discovery.register`) but not on `runtime.service.Service`: that
one consumes durably and keeps a Postgres store, and the dashboard owns nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Coroutine
from typing import Any

import aiohttp
from aiohttp import web

from ibpool_runtime import discovery, telemetry
from ibpool_runtime.bus import Bus, BusUnavailable
from ibpool_runtime.config import ConfigError, load_config
from ibpool_runtime.connection_events import connection_name
from ibpool_runtime.http import ApiAuth, create_app
from ibpool_runtime.logs import configure_logging, get_logger
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.outages import OUTAGES
from ibpool_runtime.service import MAX_REQUEST_LINE, repeat_until_stopped

from . import views
from .api import Dashboard, routes
from .config import DashboardConfig
from .feed import Feed
from .sources import Sources

NAME = "dashboard"
log = get_logger(__name__)


async def sample(d: Dashboard) -> None:
    """One point of the overview's history (none while the allocator does not answer)."""
    snap = await d.sources.snapshot("pool", "jobs")
    if snap.pool is not None:
        d.add_point(views.history_point(snap.pool, snap.jobs, round(time.time(), 3)))


async def serve(config: DashboardConfig) -> int:
    auth = ApiAuth.from_config(config)
    metrics = ServiceMetrics(NAME)
    source = connection_name(NAME, config.instance)
    bus = await Bus.connect(
        config.nats_url,
        name=source,
        attempts=config.connect_attempts,
        backoff_s=config.connect_backoff_s,
        tls_ca=config.nats_tls_ca,
        metrics=metrics,
    )
    loop = asyncio.get_running_loop()
    crashed: list[str] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            sources = Sources(bus, http, config.services_token or None, config.discover_wait_s)
            feed = Feed(config.recent_events, config.backlog_events)
            d = Dashboard(bus, sources, feed, config.history_points, can_act=auth is not None)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, d.stop.set)

            async def readiness() -> dict[str, bool]:
                return {"bus": bus.connected, "events": feed.following}

            app = create_app(
                metrics, readiness, None, lambda a: a.add_routes(routes(d)), auth, title="ibpool dashboard"
            )
            runner = web.AppRunner(
                app, access_log=None, max_line_size=MAX_REQUEST_LINE, max_field_size=MAX_REQUEST_LINE
            )
            await runner.setup()
            micro = None
            tasks: list[asyncio.Task[None]] = []

            def supervised(work: Coroutine[Any, Any, None], name: str) -> None:
                task = asyncio.create_task(work, name=name)

                def ended(t: asyncio.Task[None]) -> None:
                    if not t.cancelled() and t.exception() is not None:  # a bug: stop, exit 1
                        crashed.append(name)
                        log.error("dashboard task failed; stopping", task=name, exc_info=t.exception())
                        d.stop.set()

                task.add_done_callback(ended)
                tasks.append(task)

            try:
                site = web.TCPSite(runner, config.http_host, config.http_port)
                await site.start()
                url = f"http://{config.http_host}:{runner.addresses[0][1]}"
                await sources.discover()
                if config.register:
                    micro = await discovery.register(bus, NAME, source, url)
                supervised(feed.tail(bus, d.stop), "event-tail")
                supervised(feed.follow_telemetry(bus, d.stop), "telemetry")
                supervised(sources.keep_discovering(d.stop, config.discover_interval_s), "discovery")
                supervised(
                    repeat_until_stopped(
                        d.stop, config.sample_interval_s, lambda: sample(d), "sampling", metrics=metrics
                    ),
                    "sampling",
                )
                log.info("dashboard started", http=url, services=sorted(sources.urls))
                await d.stop.wait()
            finally:
                d.stop.set()
                if tasks:
                    _, pending = await asyncio.wait(tasks, timeout=config.shutdown_grace_s)
                    for t in pending:
                        t.cancel()
                if micro is not None:
                    with contextlib.suppress(*OUTAGES):
                        await micro.stop()
                await runner.cleanup()
    finally:
        await bus.close()
    if crashed:
        log.error("exiting after a task failed", pid=os.getpid(), tasks=crashed)
        return 1
    log.info("exiting", pid=os.getpid())
    return 0


def main() -> int:
    try:
        config = load_config(DashboardConfig, NAME)
    except ConfigError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    configure_logging(NAME, config.log_level)
    telemetry.setup_tracing(NAME)
    try:
        return asyncio.run(serve(config))
    except ConfigError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    except BusUnavailable as e:
        print(f"{NAME}: cannot start: {e}", file=sys.stderr)
        return 1
    finally:
        telemetry.shutdown_tracing()
