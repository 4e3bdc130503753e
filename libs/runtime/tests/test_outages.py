"""What a service loop survives (an outage of the bus or the store, counted) and what ends it (a bug)."""

from __future__ import annotations

import asyncio

import asyncpg
import nats.errors
import nats.js.errors
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ibpool_proto.node import NodeHeartbeat
from ibpool_runtime.bus import Bus
from ibpool_runtime.config import BaseConfig
from ibpool_runtime.http import create_app
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.outages import OUTAGES
from ibpool_runtime.service import Kit, Service, ServiceSpec, repeat_until_stopped
from ibpool_runtime.store import Store
from ibpool_runtime.telemetry_buffer import TelemetryBuffer


def failures(metrics: ServiceMetrics, loop: str, error: str) -> float:
    value = metrics.registry.get_sample_value("ibpool_loop_failures_total", {"loop": loop, "error": error})
    return value or 0.0


def test_the_outages_are_the_bus_the_store_sockets_and_timeouts_and_no_bug_is_one() -> None:
    outages = [
        nats.errors.TimeoutError(),
        nats.errors.NoServersError(),
        nats.js.errors.NotFoundError(),  # JetStream's errors derive from nats-py's base
        nats.js.errors.ServiceUnavailableError(),
        asyncpg.exceptions.DeadlockDetectedError("deadlock detected"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.InterfaceError("pool is closing"),
        ConnectionRefusedError(111, "refused"),
        TimeoutError(),  # asyncio.TimeoutError is this class since Python 3.11
    ]
    for e in outages:
        assert isinstance(e, OUTAGES), e
    for bug in (KeyError("k"), TypeError("t"), AttributeError("a"), AssertionError(), ValueError("v")):
        assert not isinstance(bug, OUTAGES), bug


class Steps:
    """A periodic step that raises the given errors in turn, then stops the loop."""

    def __init__(self, stop: asyncio.Event, *errors: Exception) -> None:
        self.stop = stop
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.stop.set()


async def test_a_loop_survives_outages_counts_each_and_runs_again() -> None:
    metrics, stop = ServiceMetrics("demo"), asyncio.Event()
    step = Steps(
        stop,
        ConnectionResetError(104, "reset"),
        asyncpg.exceptions.SerializationError("could not serialize access"),
        nats.errors.TimeoutError(),
    )
    await asyncio.wait_for(repeat_until_stopped(stop, 0.0, step, "pruning", metrics=metrics), timeout=5)
    assert step.calls == 4
    assert failures(metrics, "pruning", "ConnectionResetError") == 1
    assert failures(metrics, "pruning", "SerializationError") == 1
    assert failures(metrics, "pruning", "TimeoutError") == 1


async def test_a_bug_ends_the_loop_at_once_and_is_not_counted_as_survived() -> None:
    metrics, stop = ServiceMetrics("demo"), asyncio.Event()
    step = Steps(stop, KeyError("gpu-7"), ConnectionResetError())
    with pytest.raises(KeyError, match="gpu-7"):
        await asyncio.wait_for(repeat_until_stopped(stop, 0.0, step, "pruning", metrics=metrics), timeout=5)
    assert step.calls == 1 and not stop.is_set()
    assert failures(metrics, "pruning", "KeyError") == 0


async def test_a_task_that_fails_stops_the_service_and_is_named() -> None:
    # The real Bus and Store objects, never connected: nothing here touches them.
    kit = Kit(
        name="demo",
        config=BaseConfig(),
        bus=Bus(None, None),  # type: ignore[arg-type]
        store=Store(None, "demo"),
        metrics=ServiceMetrics("demo"),
    )
    service = Service(kit, ServiceSpec())
    stop = asyncio.Event()

    async def broken() -> None:
        await repeat_until_stopped(stop, 0.0, Steps(stop, TypeError("not a mapping")), "tick")

    task = service._supervised(broken(), "tick_loop")
    with pytest.raises(TypeError):
        await asyncio.wait_for(task, timeout=5)
    await asyncio.sleep(0)  # done callbacks run on the loop's next turn
    assert kit.stop.is_set() and service.crashed == ["tick_loop"]

    fine = service._supervised(asyncio.sleep(0), "quiet")
    await fine
    await asyncio.sleep(0)
    assert service.crashed == ["tick_loop"]


class Wire:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def publish(self, _: object) -> None:
        raise self.error


async def test_telemetry_kept_through_an_outage_is_counted_and_a_bug_propagates() -> None:
    metrics = ServiceMetrics("demo")
    sample = NodeHeartbeat(source="t", key="n1", node_id="n1", seq=1, interval_s=1.0)
    buf = TelemetryBuffer(Wire(nats.errors.ConnectionReconnectingError()).publish, lambda: True, metrics=metrics)
    buf.offer(sample)
    assert await buf.flush() == 0 and len(buf.pending) == 1
    assert failures(metrics, "telemetry flush", "ConnectionReconnectingError") == 1
    buggy = TelemetryBuffer(Wire(AttributeError("no such field")).publish, lambda: True, metrics=metrics)
    buggy.offer(sample)
    with pytest.raises(AttributeError):
        await buggy.flush()


async def test_a_handler_bug_answers_500_and_is_counted_and_a_scrape_survives_an_outage() -> None:
    refresh_error: list[Exception] = [ConnectionRefusedError(111, "refused")]

    async def ready() -> dict[str, bool]:
        return {"bus": True}

    async def refresh() -> None:
        raise refresh_error[0]

    def routes(a: web.Application) -> None:
        async def boom(_: web.Request) -> web.Response:
            raise KeyError("job-1")

        a.router.add_get("/v1/boom", boom)

    metrics = ServiceMetrics("demo")
    c = TestClient(TestServer(create_app(metrics, ready, refresh, add_routes=routes)))
    await c.start_server()
    try:
        r = await c.get("/v1/boom")
        assert r.status == 500 and (await r.json())["detail"] == "KeyError"
        assert failures(metrics, "http", "KeyError") == 1

        r = await c.get("/metrics")  # the store away: the gauges keep their last values, the scrape answers
        assert r.status == 200 and "ibpool_loop_failures_total" in await r.text()
        assert failures(metrics, "metrics refresh", "ConnectionRefusedError") == 1

        refresh_error[0] = KeyError("consumer")  # a bug in a refresh is not hidden: the scrape fails, loudly
        r = await c.get("/metrics")
        assert r.status == 500 and failures(metrics, "http", "KeyError") == 2
    finally:
        await c.close()
