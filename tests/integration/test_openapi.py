"""Every service's HTTP API against its own OpenAPI document (GET /openapi.json), with schemathesis.

All six services run for real on the embedded nats-server and Postgres. For each operation of each
document, schemathesis draws requests that fit the schema (path, query and body) and checks the
answers: never a 5xx, only documented status codes, bodies and content types as documented. The
number of requests per operation and mode is IBPOOL_API_FUZZ_EXAMPLES (default 10), so the whole run
stays short; raise it for a longer hunt (docs/fuzzing.md).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig

# Loaded now, at collection: loaded lazily mid-session (after fuzz tests that hit RecursionError on
# purpose), CPython 3.11.7's parser can fail with "AST constructor recursion depth mismatch".
from schemathesis.specs.openapi import schemas as _openapi_schemas  # noqa: F401
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ibpool_autoscaler.bootstrap import bootstrap as autoscaler_bootstrap
from ibpool_autoscaler.config import AutoscalerConfig
from ibpool_fabric_monitor.bootstrap import bootstrap as monitor_bootstrap
from ibpool_fabric_monitor.config import FabricMonitorConfig
from ibpool_failover_controller.bootstrap import bootstrap as controller_bootstrap
from ibpool_failover_controller.config import FailoverControllerConfig
from ibpool_node_agent.bootstrap import bootstrap as agent_bootstrap
from ibpool_node_agent.config import NodeAgentConfig
from ibpool_pool_allocator.bootstrap import bootstrap as allocator_bootstrap
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_scheduler.bootstrap import bootstrap as scheduler_bootstrap
from ibpool_scheduler.config import SchedulerConfig
from ibpool_slurm_bridge.bootstrap import bootstrap as bridge_bootstrap
from ibpool_slurm_bridge.config import SlurmBridgeConfig
from tests.integration.helpers import own_store, promtool, promtool_check_metrics
from tests.integration.test_fabric_monitor import small_fabric

EXAMPLES = int(os.environ.get("IBPOOL_API_FUZZ_EXAMPLES", "10"))
# schemathesis draws with the `random` module inside its strategies; hypothesis warns about that.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
# Every check schemathesis has that applies to one request (`--checks all` less the stateful ones).
COMMON = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    content_type_conformance,
    response_headers_conformance,
    missing_required_header,
    ignored_auth,
]
# A request the document allows is accepted: 2xx, or a refusal of what it names (404), of the state it
# meets (409), or of values that fit the schema but contradict each other (422, `Unprocessable`).
CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "403", "404", "409", "422", "429"]}}}
)
CHECKS = [*COMMON, positive_data_acceptance]
# A request the document forbids is refused (4xx): the document is as strict as the code, and the code as the document.
NEGATIVE_CHECKS = [*COMMON, negative_data_rejection]
SERVICES = [
    "scheduler",
    "pool_allocator",
    "autoscaler",
    "fabric_monitor",
    "failover_controller",
    "node_agent",
    "slurm_bridge",
]


def _configs(unique: str) -> dict[str, Any]:
    fast = {"instance": "openapi", "shutdown_grace_s": 2.0}
    return {
        "node_agent": NodeAgentConfig(
            **fast, nodes=2, node_prefix=unique, backend="simulated", heartbeat_interval_s=0.5
        ),
        "pool_allocator": PoolAllocatorConfig(**fast, durable_prefix=f"pa-{unique}"),
        "scheduler": SchedulerConfig(
            **fast, durable_prefix=f"sched-{unique}", leader_key=f"sched-{unique}", leader_ttl_s=1.0
        ),
        "autoscaler": AutoscalerConfig(
            **fast, durable_prefix=f"as-{unique}", leader_key=f"as-{unique}", leader_ttl_s=1.0
        ),
        "fabric_monitor": FabricMonitorConfig(**fast, poll_interval_s=0.2),
        "failover_controller": FailoverControllerConfig(
            **fast, durable_prefix=f"fc-{unique}", leader_key=f"fc-{unique}"
        ),
        # No Slurm here: its rounds fail to read Slurm's nodes and say so; the API answers all the same.
        "slurm_bridge": SlurmBridgeConfig(**fast, durable_prefix=f"sb-{unique}", scontrol="/bin/false"),
    }


async def _spec(name: str, kit: Kit[Any], bus: Bus, unique: str) -> Any:
    if name == "scheduler":
        info = await bus.js.stream_info("IBPOOL_POOL")
        return await scheduler_bootstrap(kit, pool_from_seq=info.state.last_seq + 1)
    if name == "fabric_monitor":
        topology = small_fabric(f"openapi-{unique}")
        return await monitor_bootstrap(kit, load_topology=lambda: topology)
    build = {
        "node_agent": agent_bootstrap,
        "pool_allocator": allocator_bootstrap,
        "autoscaler": autoscaler_bootstrap,
        "failover_controller": controller_bootstrap,
        "slurm_bridge": bridge_bootstrap,
    }[name]
    spec = await build(kit)
    if name == "autoscaler":
        # It serves its API without its control loop: a deployment or elastic job the fuzzer declares
        # is stored, and no replica or worker is submitted. Submitted, they would be real work on the
        # shared bus, which the schedulers of later tests (durables shared across tests) would place.
        kept = [t for t in spec.tasks if getattr(t, "__name__", "") != "control_loop"]
        assert len(kept) == len(spec.tasks) - 1, "the autoscaler's control loop is no longer named control_loop"
        spec.tasks = kept
    return spec


@pytest.fixture(scope="module")
async def services(stack: StackInfo) -> AsyncIterator[dict[str, Service[Any]]]:
    unique = f"o{uuid.uuid4().hex[:6]}"
    bus = await Bus.connect(stack.nats_url, name="openapi-test")
    await bus.ensure_streams()
    running: dict[str, Service[Any]] = {}
    try:
        async with AsyncExitStack() as exits:
            for name, cfg in _configs(unique).items():
                store = await exits.enter_async_context(own_store(stack))
                kit = Kit(name=name, config=cfg, bus=bus, store=store, metrics=ServiceMetrics(name))
                service = Service(kit, await _spec(name, kit, bus, unique))
                await service.start()
                exits.push_async_callback(service.stop)
                running[name] = service
            yield running
    finally:
        await bus.close()


async def _document(service: Service[Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{service.http_url}/openapi.json") as r:
        assert r.status == 200
        return dict(await r.json())


def _fuzz(document: dict[str, Any], base_url: str, mode: GenerationMode) -> list[str]:
    """Run schemathesis on every operation (in negative mode: those that take a body or parameters);
    the operations it exercised. Raises on the first failure."""
    schema = schemathesis.openapi.from_dict(document, config=CONFIG)
    exercised = []
    checks = CHECKS if mode is GenerationMode.POSITIVE else NEGATIVE_CHECKS
    for result in schema.get_all_operations():
        operation = result.ok()
        raw = document["paths"][operation.path][operation.method.lower()]
        if mode is GenerationMode.NEGATIVE and not (raw.get("requestBody") or raw.get("parameters")):
            continue

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            derandomize=os.environ.get("CI") == "true",  # as tests/fuzz/budget.py: reproducible in CI
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            case.call_and_validate(base_url=base_url, checks=checks, timeout=10)

        try:
            check()
        except Unsatisfiable:  # nothing it sends can break the schema (e.g. only free-text parameters)
            continue
        exercised.append(f"{operation.method.upper()} {operation.path}")
    return exercised


@pytest.mark.parametrize("name", SERVICES)
async def test_service_api_matches_its_openapi_document(services: dict[str, Service[Any]], name: str) -> None:
    service = services[name]
    document = await _document(service)
    assert document["openapi"].startswith("3.1")
    assert document["info"]["title"] == f"ibpool {name}"
    undocumented = [
        f"{method.upper()} {path}"
        for path, ops in document["paths"].items()
        for method, op in ops.items()
        if op.get("x-undocumented")
    ]
    assert undocumented == []
    assert {"/healthz", "/readyz", "/metrics", "/openapi.json"} <= set(document["paths"])
    assert len(document["paths"]) > 4, "the service's own routes are in the document"
    exercised = await asyncio.to_thread(_fuzz, document, service.http_url or "", GenerationMode.POSITIVE)
    assert len(exercised) == sum(len(ops) for ops in document["paths"].values())


@pytest.mark.parametrize("name", SERVICES)
async def test_service_api_rejects_what_its_document_forbids(services: dict[str, Service[Any]], name: str) -> None:
    service = services[name]
    document = await _document(service)
    exercised = await asyncio.to_thread(_fuzz, document, service.http_url or "", GenerationMode.NEGATIVE)
    assert exercised, "some operation takes a body or parameters"


@pytest.mark.parametrize("name", SERVICES)
async def test_service_metrics_pass_promtool(services: dict[str, Service[Any]], name: str) -> None:
    """Each service's /metrics, after the fuzzing above has exercised its API, read by Prometheus's
    own linter (`promtool check metrics`): no problem reported (names, units, help, types)."""
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    async with aiohttp.ClientSession() as s, s.get(f"{services[name].http_url}/metrics") as r:
        assert r.status == 200
        text = await r.read()
    assert b"# TYPE " in text and b"ibpool_" in text
    status, said = await promtool_check_metrics(tool, text)
    assert status == 0, f"promtool check metrics on {name}:\n{said}"
