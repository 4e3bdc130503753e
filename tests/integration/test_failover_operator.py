"""An operator's actions on the failover controller, against real NATS and Postgres with the pool allocator.

A node is registered with a GPU model of its own, so a request for that model can land on it only:
the pool's answer to such a request says whether the node's GPUs are schedulable.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec

from ibpool_failover_controller.bootstrap import bootstrap as controller_bootstrap
from ibpool_pool_allocator.bootstrap import bootstrap as allocator_bootstrap
from ibpool_proto.health import Cordoned, GpuFailed, GpuRecovered, NodeFailed, NodeRecovered, Uncordoned
from ibpool_proto.node import (
    GpuInfo,
    GpuSample,
    NodeDeregistered,
    NodeHeartbeat,
    NodeRegistered,
    TelemetryReported,
)
from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.service import Service
from ibpool_runtime.store import Store
from tests.integration.agent_support import unique_prefix
from tests.integration.helpers import eventually, own_store
from tests.integration.test_failover_controller import (
    LENIENT,
    allocator_kit,
    controller_kit,
    get_json,
    health_events,
    running,
)

GPUS = 4


def registration(node: str, model: str) -> NodeRegistered:
    gpus = [GpuInfo(index=i, uuid=f"GPU-{node}-{i}", model=model, memory_mib=81_920) for i in range(GPUS)]
    return NodeRegistered(
        source="test", key=node, node_id=node, hostname=node, cpu_milli=64_000, memory_mib=512_000, gpus=gpus,
        backend="test",
    )  # fmt: skip


def xid(node: str, gpu: int, code: int) -> TelemetryReported:
    gpus = [
        GpuSample(
            index=i,
            uuid=f"GPU-{node}-{i}",
            utilization_pct=0.0,
            memory_used_mib=0,
            temperature_c=40.0,
            power_w=100.0,
            xids=[code] if i == gpu else [],
        )
        for i in range(GPUS)
    ]
    return TelemetryReported(source="test", key=node, node_id=node, gpus=gpus)


async def published(bus: Bus, kind: type, key: str, count: int = 1) -> list[Any]:
    """The `kind` events of `key`, once `count` are on the stream (the outbox publishes after the commit)."""

    async def there() -> bool:
        return len(await health_events(bus, kind, key)) >= count

    await eventually(there, timeout_s=10, what=f"{count} {kind.__name__} of {key} published")
    return await health_events(bus, kind, key)


async def post(url: str, body: object) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
        return r.status, msgspec.json.decode(await r.read())


@asynccontextmanager
async def beating_node(bus: Bus, node: str, model: str) -> AsyncIterator[None]:
    stop = asyncio.Event()

    async def beat() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            await bus.publish_unacked(NodeHeartbeat(source="test", key=node, node_id=node, seq=seq, interval_s=0.2))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    task = asyncio.create_task(beat())
    try:
        await bus.publish(registration(node, model))
        yield
    finally:
        stop.set()
        await task
        # Gone cleanly: allocators and controllers of later tests, which replay the node stream, leave it out.
        await bus.publish(NodeDeregistered(source="test", key=node, node_id=node, reason="test over"))


async def grant_all(allocator: Service[Any], node: str, model: str) -> str | None:
    """Ask for every GPU of the node's model; the allocation id when granted (then released), else None."""
    body = {
        "job_id": f"op-{uuid.uuid4().hex[:8]}",
        "tenant": "t",
        "queue": "q",
        "request": {"kind": "whole", "gpus": GPUS, "gpu_model": model},
    }
    status, granted = await post(f"{allocator.http_url}/v1/allocations", body)
    if status != 201:
        return None
    assert [g["node_id"] for g in granted["grants"]] == [node]
    async with (
        aiohttp.ClientSession() as http,
        http.delete(f"{allocator.http_url}/v1/allocations/" + granted["allocation_id"]) as r,
    ):
        assert r.status == 200
    return str(granted["allocation_id"])


async def pool_node(allocator: Service[Any], node: str) -> dict[str, Any]:
    _, pool = await get_json(f"{allocator.http_url}/v1/pool")
    [found] = [n for n in pool["nodes"] if n["node_id"] == node]
    return dict(found)


@asynccontextmanager
async def setup(stack: StackInfo, bus: Bus, store: Store) -> AsyncIterator[tuple[Service[Any], Service[Any], str, str]]:
    node, model = f"{unique_prefix()}-op", f"OP-{uuid.uuid4().hex[:8]}"
    async with (
        own_store(stack) as allocator_store,
        running("pool_allocator", allocator_kit(bus, allocator_store), allocator_bootstrap) as allocator,
        running("failover_controller", controller_kit(bus, store, **LENIENT), controller_bootstrap) as controller,
        beating_node(bus, node, model),
    ):

        async def known() -> bool:
            status, _ = await get_json(f"{controller.http_url}/health/nodes/{node}")
            return status == 200 and await grant_all(allocator, node, model) is not None

        await eventually(known, what="the node known to the controller and granted by the pool")
        yield allocator, controller, node, model


async def test_xid_79_fails_the_node_and_an_operator_recover_puts_it_back_into_the_pool(
    stack: StackInfo, bus: Bus, store: Store
) -> None:
    async with setup(stack, bus, store) as (allocator, controller, node, model):
        base = f"{controller.http_url}/health/nodes/{node}"
        why = {"reason": "GPU 3 reseated, ticket OPS-7", "by": "alice"}
        status, body = await post(f"{base}/recover", why)
        assert (status, body["outcome"], body["events"]) == (200, "nothing_to_do", []), body

        await bus.publish(xid(node, 3, 79))

        async def failed_in_pool() -> bool:
            return (
                bool(await health_events(bus, NodeFailed, node))
                and (await pool_node(allocator, node))["state"] == "failed"
            )

        await eventually(failed_in_pool, what="NodeFailed, and the pool's node failed")
        assert await grant_all(allocator, node, model) is None
        assert "node" in [c.scope for c in await published(bus, Cordoned, node)]

        status, body = await post(f"{base}/recover", why)
        assert (status, body["outcome"], body["events"]) == (200, "done", ["NodeRecovered", "Uncordoned"]), body
        [recovered] = await published(bus, NodeRecovered, node)
        assert recovered.reason == "GPU 3 reseated, ticket OPS-7 (by alice)"
        assert [u.reason for u in await published(bus, Uncordoned, node) if u.scope == "node"] == [recovered.reason]

        async def granted_again() -> bool:
            return await grant_all(allocator, node, model) is not None

        await eventually(granted_again, what="the pool granting the node's GPUs again")
        assert (await pool_node(allocator, node))["state"] == "ready"
        status, view = await get_json(base)
        assert (view["status"], view["cordoned"], view["needs_reboot"]) == ("healthy", False, False), view
        status, body = await post(f"{base}/recover", why)
        assert (status, body["outcome"], body["events"]) == (200, "nothing_to_do", []), body
        _, history = await get_json(f"{controller.http_url}/health/verdicts?type=NodeRecovered&key={node}")
        assert [h["event"]["reason"] for h in history] == [recovered.reason]


async def test_xid_48_fails_one_gpu_and_an_operator_recover_uncordons_it_once(
    stack: StackInfo, bus: Bus, store: Store
) -> None:
    async with setup(stack, bus, store) as (allocator, controller, node, _model):
        base = f"{controller.http_url}/health/nodes/{node}"
        await bus.publish(xid(node, 1, 48))

        async def gpu_out_of_pool() -> bool:
            gpus = (await pool_node(allocator, node))["gpus"]
            return bool(await health_events(bus, GpuFailed, node)) and gpus[1]["state"] == "failed"

        await eventually(gpu_out_of_pool, what="GpuFailed, and the pool's GPU 1 failed")
        assert [g["state"] for g in (await pool_node(allocator, node))["gpus"]] == ["ready", "failed", "ready", "ready"]

        # Bad input: what and where.
        async with aiohttp.ClientSession() as http, http.post(f"{base}/drain") as r:  # no body at all
            err = msgspec.json.decode(await r.read())
            assert (r.status, err["path"]) == (400, "$.reason") and "reason" in err["detail"], err
            assert "malformed" not in err["detail"], err
        status, err = await post(f"{base}/gpus/1/recover", {})
        assert (status, err["path"]) == (400, "$.reason"), err
        status, err = await post(f"{base}/gpus/1/recover", {"reason": "  "})
        assert (status, err["path"]) == (422, "$.reason"), err
        status, err = await post(f"{base}/gpus/one/recover", {"reason": "r"})
        assert (status, err["path"]) == (400, "{index}"), err
        status, err = await post(f"{base}/gpus/4/recover", {"reason": "r"})
        assert status == 404 and "GPUs 0..3" in err["detail"], err
        status, err = await post(f"{controller.http_url}/health/nodes/nope-{node}/drain", {"reason": "r"})
        assert status == 404 and "nope-" in err["detail"], err

        status, body = await post(f"{base}/gpus/1/recover", {"reason": "GPU reset by nvidia-smi -r"})
        assert (status, body["outcome"], body["events"]) == (200, "done", ["GpuRecovered", "Uncordoned"]), body
        [recovered] = await published(bus, GpuRecovered, node)
        assert (recovered.gpu_index, recovered.reason) == (1, "GPU reset by nvidia-smi -r")
        assert [(u.scope, u.gpu_index) for u in await published(bus, Uncordoned, node)] == [("gpu", 1)]
        status, body = await post(f"{base}/gpus/1/recover", {"reason": "again"})
        assert (status, body["outcome"], body["events"]) == (200, "nothing_to_do", []), body
        _, view = await get_json(base)
        assert view["gpus"] == []

        async def not_cordoned_in_pool() -> bool:
            return (await pool_node(allocator, node))["gpus"][1]["state"] != "cordoned"

        await eventually(not_cordoned_in_pool, what="the pool's cordon of GPU 1 lifted")


async def test_a_recovered_gpu_is_granted_again_by_the_pool(stack: StackInfo, bus: Bus, store: Store) -> None:
    async with setup(stack, bus, store) as (allocator, controller, node, model):
        await bus.publish(xid(node, 2, 48))

        async def gpu_failed() -> bool:
            return (await pool_node(allocator, node))["gpus"][2]["state"] == "failed"

        await eventually(gpu_failed, what="the pool's GPU 2 failed")
        status, body = await post(f"{controller.http_url}/health/nodes/{node}/gpus/2/recover", {"reason": "replaced"})
        assert (status, body["outcome"]) == (200, "done"), body

        async def granted_again() -> bool:
            return await grant_all(allocator, node, model) is not None

        await eventually(granted_again, timeout_s=5, what="the pool granting GPU 2 again")


async def test_an_operator_drain_holds_until_an_operator_recovers_and_a_standby_answers_409(
    stack: StackInfo, bus: Bus, store: Store
) -> None:
    async with setup(stack, bus, store) as (allocator, controller, node, model):
        base = f"{controller.http_url}/health/nodes/{node}"
        status, body = await post(f"{base}/drain", {"reason": "firmware update", "by": "bob"})
        assert (status, body["events"]) == (200, ["Cordoned", "DrainRequested"]), body
        status, body = await post(f"{base}/drain", {"reason": "firmware update"})
        assert (status, body["outcome"]) == (200, "nothing_to_do"), body

        async def draining_in_pool() -> bool:
            return (await pool_node(allocator, node))["state"] == "draining"

        await eventually(draining_in_pool, what="the pool's node draining")
        assert await grant_all(allocator, node, model) is None
        _, view = await get_json(base)
        assert view["operator_drain"] == "firmware update (by bob)"

        # A second replica stands by: it names the leader instead of acting.
        kit = controller_kit(bus, store, durable_prefix=controller.kit.config.durable_prefix,
                             leader_key=controller.kit.config.leader_key, instance="standby", **LENIENT)  # fmt: skip
        async with running("standby", kit, controller_bootstrap) as standby:
            status, err = await post(f"{standby.http_url}/health/nodes/{node}/recover", {"reason": "r"})
            assert status == 409 and controller.kit.source in err["detail"], err

        status, body = await post(f"{base}/recover", {"reason": "firmware done"})
        assert (status, body["events"]) == (200, ["Uncordoned"]), body

        async def granted_again() -> bool:
            return await grant_all(allocator, node, model) is not None

        await eventually(granted_again, what="the pool granting the drained node again")


async def test_an_operator_cordon_stops_new_grants_keeps_the_allocation_there_and_uncordon_lifts_it(
    stack: StackInfo, bus: Bus, store: Store
) -> None:
    async with setup(stack, bus, store) as (allocator, controller, node, model):
        base = f"{controller.http_url}/health/nodes/{node}"
        body = {"job_id": f"op-{uuid.uuid4().hex[:8]}", "tenant": "t", "queue": "q",
                "request": {"kind": "whole", "gpus": 1, "gpu_model": model}}  # fmt: skip
        status, held = await post(f"{allocator.http_url}/v1/allocations", body)
        assert status == 201, held

        status, answer = await post(f"{base}/cordon", {"reason": "suspect fan", "by": "carol"})
        assert (status, answer["outcome"], answer["events"]) == (200, "done", ["Cordoned"]), answer
        status, again = await post(f"{base}/cordon", {"reason": "suspect fan"})
        assert (status, again["outcome"]) == (200, "nothing_to_do"), again

        async def cordoned_in_pool() -> bool:
            return (await pool_node(allocator, node))["state"] == "cordoned"

        await eventually(cordoned_in_pool, what="the pool's node cordoned")
        status, refused = await post(f"{allocator.http_url}/v1/allocations", {**body, "job_id": "op-new"})
        assert status != 201, refused
        # The work there stays: the allocation is still live, nothing was requeued.
        status, alloc = await get_json(f"{allocator.http_url}/v1/allocations/{held['allocation_id']}")
        assert status == 200 and alloc["nodes"] == [node], alloc
        _, view = await get_json(base)
        assert (view["cordoned"], view["operator_cordon"], view["operator_drain"]) == (
            True,
            "suspect fan (by carol)",
            "",
        ), view

        status, gpu = await post(f"{base}/gpus/9/cordon", {"reason": "x"})
        assert status == 404, gpu

        status, lifted = await post(f"{base}/uncordon", {"reason": "fan fine"})
        assert (status, lifted["outcome"], lifted["events"]) == (200, "done", ["Uncordoned"]), lifted

        async def ready_again() -> bool:
            return (await pool_node(allocator, node))["state"] == "ready"

        await eventually(ready_again, what="the pool's node ready again")
        async with (
            aiohttp.ClientSession() as http,
            http.delete(f"{allocator.http_url}/v1/allocations/" + held["allocation_id"]) as r,
        ):
            assert r.status == 200
