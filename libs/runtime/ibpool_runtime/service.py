"""A service's lifecycle in one place.

connect (bounded retries) -> migrate -> streams -> consumers, outbox relay, HTTP, own tasks -> run;
on SIGTERM/SIGINT: stop fetching, finish the batch in hand (bounded), stop own tasks, flush the
outbox, drain NATS, close Postgres, exit 0. NATS or Postgres unreachable at start: exit 1 with a
message that says which and where. A loop survives an outage of the bus or the store
(`outages.OUTAGES`, counted in `ibpool_loop_failures`); a task that ends with any other error (a
bug) is logged with its traceback and stops the service the same graceful way, then exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from aiohttp import web
from nats.micro.service import Service as NatsMicroService

from . import discovery, telemetry
from .bus import Bus, BusUnavailable
from .config import BaseConfig, ConfigError, load_config
from .connection_events import connection_name
from .consumer import Consumer, ConsumerSettings, Subscription
from .http import ApiAuth, create_app
from .logs import configure_logging, get_logger
from .metrics import ServiceMetrics, count_failure
from .outages import OUTAGES
from .outbox import OutboxRelay
from .store import MigrationError, Store, StoreUnavailable
from .streams import STREAMS

log = get_logger(__name__)

C = TypeVar("C", bound=BaseConfig)
Task = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


@dataclass
class Kit(Generic[C]):
    """The adapters a service's bootstrap wires together: connected bus and store, config, metrics."""

    name: str
    config: C
    bus: Bus
    store: Store
    metrics: ServiceMetrics
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once HTTP listens, before on_start runs: where this instance serves its API.
    http_url: str | None = None

    @property
    def source(self) -> str:
        return connection_name(self.name, self.config.instance)


@dataclass
class ServiceSpec:
    """What a service is: its subscriptions, schema, routes and own loops. No I/O happens here."""

    subscriptions: list[Subscription] = field(default_factory=list)
    migrations: Path | None = None
    add_routes: Callable[[web.Application], object] | None = None
    tasks: list[Task] = field(default_factory=list)
    on_start: Callable[[], Awaitable[None]] | None = None
    on_stop: Callable[[], Awaitable[None]] | None = None
    # Run after the migrations, before anything is consumed: raises StartRefused when the stored
    # state is one this version cannot serve from (nothing is consumed and failed meanwhile).
    check: Callable[[], Awaitable[None]] | None = None
    # This instance's role now ("leader" / "standby" where replicas elect one; default "active"),
    # shown on the NATS service API (`ibpool_runtime.discovery`).
    role: Callable[[], str] | None = None


MAX_REQUEST_LINE = 65_536


class StartRefused(Exception):
    """The service will not start: what it stored cannot be served by this version (the message says why)."""


class Service(Generic[C]):
    def __init__(self, kit: Kit[C], spec: ServiceSpec) -> None:
        self.kit = kit
        self.spec = spec
        if spec.role is not None:
            kit.metrics.follow_role(spec.role)
        cfg = kit.config
        settings = ConsumerSettings(
            batch=cfg.consumer_batch,
            max_ack_pending=cfg.consumer_max_ack_pending,
            ack_wait_s=cfg.consumer_ack_wait_s,
            max_deliver=cfg.consumer_max_deliver,
        )
        self.consumers = [
            Consumer(kit.bus, kit.store if s.transactional else None, s, settings, kit.metrics, kit.source)
            for s in spec.subscriptions
        ]
        self.relay = OutboxRelay(kit.store, kit.bus, window=cfg.outbox_window, metrics=kit.metrics)
        self._consumer_tasks: list[asyncio.Task[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._relay_stop = asyncio.Event()
        self._relay_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.http_url: str | None = None
        self._micro: NatsMicroService | None = None
        # Names of the tasks that ended with an error (a bug: what a loop survives it catches):
        # the service stops, and exits non-zero.
        self.crashed: list[str] = []

    async def start(self) -> None:
        kit = self.kit
        auth = ApiAuth.from_config(kit.config)  # a bad tokens file stops the start before anything runs
        applied = await kit.store.migrate(*([self.spec.migrations] if self.spec.migrations else []))
        if applied:
            log.info("migrations applied", applied=applied)
        if self.spec.check is not None:
            await self.spec.check()
        await kit.bus.ensure_streams(kit.config.stream_replicas)
        for c in self.consumers:
            await c.start()
        self._relay_task = self._supervised(self.relay.run(self._relay_stop), "outbox-relay")
        for c in self.consumers:
            self._consumer_tasks.append(self._supervised(c.run(kit.stop), f"consumer-{c.sub.durable}"))
        app = create_app(
            kit.metrics, self.readiness, self.refresh_metrics, self.spec.add_routes, auth, title=f"ibpool {kit.name}"
        )
        # A request line or header up to 64 KiB reaches the app, which answers it as documented (JSON);
        # past aiohttp's default 8 KiB its parser answered a bare text/plain 400 before any middleware.
        self._runner = web.AppRunner(
            app, access_log=None, max_line_size=MAX_REQUEST_LINE, max_field_size=MAX_REQUEST_LINE
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, kit.config.http_host, kit.config.http_port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.http_url = kit.http_url = f"http://{kit.config.http_host}:{port}"
        if self.spec.on_start is not None:
            await self.spec.on_start()
        self._micro = await discovery.register(kit.bus, kit.name, kit.source, self.http_url, self.spec.role)
        for t in [*self.spec.tasks, self.prune_inbox]:
            self._tasks.append(self._supervised(t(kit.stop), getattr(t, "__name__", "task")))
        log.info("service started", http=self.http_url, consumers=[c.sub.durable for c in self.consumers])

    def _supervised(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task of the service whose error ends the service: every loop survives what it means to
        (`outages.OUTAGES`, and bad input where it says so), so an error out of one is a bug, and a
        service running on without that loop would look alive and do nothing of its work."""
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(self._task_ended)
        return task

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        self.crashed.append(task.get_name())
        log.error("service task failed; stopping the service", task=task.get_name(), exc_info=error)
        self.kit.stop.set()

    async def prune_inbox(self, stop: asyncio.Event) -> None:
        """Delete handled event ids past `inbox_retention_s`, every `inbox_prune_interval_s`, so the
        inbox holds what the streams still hold and no more. Every replica does it (deletes of the
        same rows are harmless); a store outage is logged, counted and tried again next time."""
        cfg = self.kit.config
        longest = max(spec.max_age_s for spec in STREAMS)
        if cfg.inbox_retention_s < longest:
            log.warning(
                "inbox_retention_s is shorter than the streams keep messages: an event redelivered after it"
                " (a consumer recreated, a replay) is handled again",
                inbox_retention_s=cfg.inbox_retention_s,
                stream_max_age_s=longest,
            )

        async def prune() -> None:
            deleted = await self.kit.store.prune_inbox(cfg.inbox_retention_s, stop=stop)
            if deleted:
                log.info("inbox pruned", deleted=deleted, older_than_s=cfg.inbox_retention_s)

        await repeat_until_stopped(stop, cfg.inbox_prune_interval_s, prune, "inbox pruning", metrics=self.kit.metrics)

    async def readiness(self) -> dict[str, bool]:
        return {
            "bus": self.kit.bus.connected,
            "store": await self.kit.store.ping(self.kit.metrics),
            "consumers": all(c.running and not c.missing for c in self.consumers),
            "dead_letters": not any(c.dlq_failing for c in self.consumers),
        }

    async def refresh_metrics(self) -> None:
        self.kit.metrics.outbox_lag.set(await self.kit.store.outbox_lag())
        for c in self.consumers:
            self.kit.metrics.consumer_pending.labels(c.sub.durable).set(await c.pending())

    async def stop(self) -> None:
        kit = self.kit
        kit.stop.set()
        grace = kit.config.shutdown_grace_s
        # Consumers finish the batch in hand (handled, committed, acked) and fetch no more.
        await _wait_bounded(self._consumer_tasks, grace, "consumers")
        await _wait_bounded(self._tasks, grace, "service tasks")
        try:
            if self.spec.on_stop is not None:
                try:
                    await asyncio.wait_for(self.spec.on_stop(), timeout=grace)
                except OUTAGES as e:  # the bus or the store away at shutdown, or past the grace: stop anyway
                    kit.metrics.loop_failed("on_stop", e)
                    log.warning("on_stop failed", error=str(e) or type(e).__name__)
        finally:  # a bug in on_stop propagates, after the outbox is flushed and HTTP closed
            if self._micro is not None:
                try:
                    await self._micro.stop()
                except OUTAGES as e:  # the bus away: nothing to take off it
                    kit.metrics.loop_failed("service api stop", e)
            self._relay_stop.set()
            if self._relay_task is not None:
                await _wait_bounded([self._relay_task], grace, "outbox relay")
            await self.relay.flush(timeout_s=grace)
            if self._runner is not None:
                await self._runner.cleanup()
        log.info("service stopped", published=self.relay.published)

    async def serve(self) -> None:
        """Start, run until the kit's stop event is set, then stop gracefully."""
        await self.start()
        try:
            await self.kit.stop.wait()
        finally:
            await self.stop()


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile: the pause of every service loop."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def repeat_until_stopped(
    stop: asyncio.Event,
    interval_s: float,
    step: Callable[[], Awaitable[object]],
    what: str,
    *,
    metrics: ServiceMetrics | None = None,
) -> None:
    """Run `step` now and every `interval_s` after it until `stop` is set: a service's periodic work.
    A step that meets an outage of the bus or the store (`outages.OUTAGES`) is logged as "`what`
    failed", counted in `metrics` (`ibpool_loop_failures{loop=what}`) and runs again at its next
    time. Any other error is a bug: it ends the loop (and `Service` then stops the service)."""
    while not stop.is_set():
        try:
            await step()
        except OUTAGES as e:
            count_failure(metrics, what, e)
            log.warning(f"{what} failed", error=str(e) or type(e).__name__)
        await sleep_unless_stopped(stop, interval_s)


async def _wait_bounded(tasks: list[asyncio.Task[None]], timeout_s: float, what: str) -> None:
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for t in pending:
        log.warning("cancelling after shutdown grace", what=what, task=t.get_name())
        t.cancel()
    for t in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.error("task ended with error", what=what, task=t.get_name(), error=repr(t.exception()))


Build = Callable[[Kit[C]], Awaitable[ServiceSpec]]


async def connect_kit(name: str, config: C, schema: str) -> Kit[C]:
    metrics = ServiceMetrics(name)
    bus = await Bus.connect(
        config.nats_url,
        name=connection_name(name, config.instance),  # the `source` of its events: who closed a connection
        attempts=config.connect_attempts,
        backoff_s=config.connect_backoff_s,
        window=config.outbox_window,
        tls_ca=config.nats_tls_ca,
        metrics=metrics,
    )
    try:
        store = await Store.connect(
            config.postgres_dsn, schema, attempts=config.connect_attempts, backoff_s=config.connect_backoff_s
        )
    except BaseException:
        await bus.close()
        raise
    return Kit(name=name, config=config, bus=bus, store=store, metrics=metrics)


async def close_kit(kit: Kit[C]) -> None:
    await kit.bus.close()
    await kit.store.close()


def run_service(
    name: str,
    config_type: type[C],
    build: Build[C],
    argv: list[str] | None = None,
    schema: Callable[[C], str] | None = None,
) -> int:
    """The whole `python -m ibpool_<service>`: config, logging, tracing, signals, exit code. The
    store's schema is the service's name, or `schema(config)` for a service whose instances each
    keep state of their own (node agents: one per agent)."""
    try:
        config = load_config(config_type, name)
    except ConfigError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    configure_logging(name, config.log_level)
    telemetry.setup_tracing(name)
    try:
        return asyncio.run(_serve(name, config, build, schema(config) if schema else name))
    except ConfigError as e:  # a setting only the service's own wiring can check
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    except (BusUnavailable, StoreUnavailable, MigrationError, StartRefused) as e:
        print(f"{name}: cannot start: {e}", file=sys.stderr)
        return 1
    finally:
        telemetry.shutdown_tracing()


def freeze_startup_heap() -> None:
    """Move everything alive after start-up (imported libraries, the service's wiring, its warm state)
    out of the garbage collector's reach: a full collection otherwise walks all of it again, and with
    scikit-learn and scipy loaded (the scheduler's runtime model) that took ~130 ms, a pause longer
    than a scheduling latency target. Objects made afterwards are collected as usual."""
    gc.collect()
    gc.freeze()


async def _serve(name: str, config: C, build: Build[C], schema: str) -> int:
    kit = await connect_kit(name, config, schema=schema)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, kit.stop.set)
    try:
        spec = await build(kit)
        freeze_startup_heap()
        service = Service(kit, spec)
        await service.serve()
    finally:
        await close_kit(kit)
    if service.crashed:
        log.error("exiting after a service task failed", pid=os.getpid(), tasks=service.crashed)
        return 1
    log.info("exiting", pid=os.getpid())
    return 0
