"""The pool allocator against real NATS and Postgres: commands in, ledger events out, leases, quotas, the API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from ibpool_core.fabric.formats import export_topology
from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.model import Topology, content_hash, rename_hosts
from ibpool_core.pool.placement import PlacementRequest, first_fit
from ibpool_pool_allocator.bootstrap import bootstrap
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_pool_allocator.service import PoolAllocator
from ibpool_proto import decode, new_id
from ibpool_proto.fabric import TopologyPublished
from ibpool_proto.health import NodeFailed
from ibpool_proto.job import JobExited, JobStarted
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationRejected,
    AllocationRevoked,
    GpuAssignment,
    LeaseRenewed,
    ProposePlacement,
    RenewLease,
    ResourceRequest,
)
from ibpool_runtime.bus import Bus, envelope_headers
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service
from ibpool_runtime.store import Store
from ibpool_runtime.streams import DLQ_STREAM
from tests.integration.agent_support import running_agent, unique_prefix
from tests.integration.helpers import eventually, job_news, own_store, stream_messages
from tests.integration.pool_support import MODEL, registered, unique

# One durable name for every test: each test sees only what was published after the last one stopped.
DURABLES = "pool-allocator-test"


@asynccontextmanager
async def running_allocator(bus: Bus, store: Store, **overrides: Any) -> AsyncIterator[tuple[Service, PoolAllocator]]:
    cfg = PoolAllocatorConfig(
        **{"instance": "test", "expiry_interval_s": 0.1, "durable_prefix": DURABLES, "consumer_batch": 16, **overrides}
    )
    kit = Kit(name="pool_allocator", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("pool_allocator"))
    spec = await bootstrap(kit)
    allocator = spec.tasks[0].__self__  # type: ignore[attr-defined]
    service = Service(kit, spec)
    await service.start()
    try:
        yield service, allocator
    finally:
        await service.stop()


def propose(job: str, node_id: str, gpu: int, version: int, lease_s: float = 300.0) -> ProposePlacement:
    return ProposePlacement(
        source="test",
        key=job,
        job_id=job,
        tenant="t",
        queue="q",
        ledger_version=version,
        assignments=[GpuAssignment(node_id=node_id, gpu_index=gpu)],
        lease_s=lease_s,
    )


JSON = {"Content-Type": "application/json"}


async def get(service: Service, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{service.http_url}{path}") as r:
        return r.status, await r.json()


async def send(service: Service, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else msgspec.json.encode(body) if body is not None else None
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, f"{service.http_url}{path}", data=data, headers=JSON) as r,
    ):
        return r.status, await r.json()


async def pool_node(service: Service, node_id: str) -> dict[str, Any] | None:
    _, pool = await get(service, "/v1/pool")
    return next((n for n in pool["nodes"] if n["node_id"] == node_id), None)


async def register(bus: Bus, service: Service, *node_ids: str, gpus: int = 4) -> int:
    """Publish the nodes' registrations, wait until the ledger has them; returns the ledger version."""
    for n in node_ids:
        await bus.publish(registered(n, gpus))

    async def known() -> bool:
        return all([await pool_node(service, n) is not None for n in node_ids])

    await eventually(known, what="nodes registered")
    _, pool = await get(service, "/v1/pool")
    return pool["ledger_version"]


async def events(bus: Bus, cls: type, key: str) -> list:
    return [decode(m.data) for m in await stream_messages(bus.js, "IBPOOL_POOL", cls.subject(key))]


async def test_two_competing_proposals_one_wins_one_conflicts(bus: Bus, store: Store) -> None:
    node = unique("n")
    async with running_allocator(bus, store) as (service, _):
        version = await register(bus, service, node)
        a, b = unique("ja"), unique("jb")
        await bus.publish(propose(a, node, 0, version))
        await bus.publish(propose(b, node, 0, version))

        async def answered() -> bool:
            granted = await events(bus, AllocationGranted, node)
            rejected = await events(bus, AllocationRejected, a) + await events(bus, AllocationRejected, b)
            return len(granted) + len(rejected) >= 2

        await eventually(answered, what="both proposals answered")
        granted = await events(bus, AllocationGranted, node)
        rejected = await events(bus, AllocationRejected, a) + await events(bus, AllocationRejected, b)
        assert len(granted) == 1 and len(rejected) == 1
        assert {granted[0].job_id, rejected[0].job_id} == {a, b}
        assert rejected[0].reason == "conflict"
        n = await pool_node(service, node)
        assert n is not None and n["allocated_milli"] == 1000


async def test_same_command_twice_is_one_grant(bus: Bus, store: Store) -> None:
    node = unique("n")
    async with running_allocator(bus, store) as (service, _):
        version = await register(bus, service, node)
        cmd = propose(unique("j"), node, 1, version)
        body = msgspec.json.encode(cmd)
        for i in range(2):
            headers = envelope_headers(cmd)
            headers["Nats-Msg-Id"] = f"{cmd.id}-copy-{i}"
            await bus.js.publish(cmd.subject_of(), body, headers=headers)

        async def settled() -> bool:
            info = await bus.js.consumer_info("IBPOOL_POOL", f"{DURABLES}-commands")
            return (
                info.num_pending == 0 and info.num_ack_pending == 0 and bool(await events(bus, AllocationGranted, node))
            )

        await eventually(settled, what="both copies handled")
        granted = await events(bus, AllocationGranted, node)
        assert [g.allocation_id for g in granted] == [cmd.id]
        n = await pool_node(service, node)
        assert n is not None and n["allocated_milli"] == 1000


async def test_short_lease_expires_and_frees_the_gpu(bus: Bus, store: Store) -> None:
    node = unique("n")
    async with running_allocator(bus, store) as (service, _):
        version = await register(bus, service, node)
        cmd = propose(unique("j"), node, 0, version, lease_s=0.5)
        await bus.publish(cmd)

        async def expired() -> bool:
            return bool(await events(bus, AllocationExpired, node))

        await eventually(expired, what="AllocationExpired")
        (ev,) = await events(bus, AllocationExpired, node)
        assert ev.allocation_id == cmd.id
        n = await pool_node(service, node)
        assert n is not None and n["allocated_milli"] == 0 and n["free_milli"] == 4000
        status, _ = await get(service, f"/v1/allocations/{cmd.id}")
        assert status == 404


async def test_renewed_lease_outlives_its_first_expiry(bus: Bus, store: Store) -> None:
    node = unique("n")
    async with running_allocator(bus, store) as (service, _):
        version = await register(bus, service, node)
        cmd = propose(unique("j"), node, 0, version, lease_s=1.0)
        await bus.publish(cmd)
        await bus.publish(RenewLease(source="test", key=cmd.id, allocation_id=cmd.id, holder=cmd.job_id, extend_s=30))

        async def renewed() -> bool:
            return bool(await events(bus, LeaseRenewed, cmd.id))

        await eventually(renewed, what="LeaseRenewed")
        await asyncio.sleep(1.5)
        assert await events(bus, AllocationExpired, node) == []
        status, _ = await get(service, f"/v1/allocations/{cmd.id}")
        assert status == 200


async def test_node_failure_revokes_its_allocations(bus: Bus, store: Store) -> None:
    node, other = unique("n"), unique("n")
    async with running_allocator(bus, store) as (service, _):
        version = await register(bus, service, node, other)
        on_node = [propose(unique("j"), node, i, version) for i in range(2)]
        elsewhere = propose(unique("j"), other, 0, version)
        for c in [*on_node, elsewhere]:
            await bus.publish(c)

        async def all_granted() -> bool:
            return len(await events(bus, AllocationGranted, node)) == 2 and bool(
                await events(bus, AllocationGranted, other)
            )

        await eventually(all_granted, what="three grants")
        await bus.publish(NodeFailed(source="test", key=node, node_id=node, reason="xid storm"))

        async def revoked() -> bool:
            return len(await events(bus, AllocationRevoked, node)) == 2

        await eventually(revoked, what="both allocations on the failed node revoked")
        revs = await events(bus, AllocationRevoked, node)
        assert {r.allocation_id for r in revs} == {c.id for c in on_node}
        assert await events(bus, AllocationRevoked, other) == []
        n = await pool_node(service, node)
        assert n is not None and n["state"] == "failed" and n["free_milli"] == 0
        status, alloc = await get(service, f"/v1/allocations/{elsewhere.id}")
        assert status == 200 and alloc["nodes"] == [other]


def ask(job: str, tenant: str, gpus: int) -> dict[str, Any]:
    return {"job_id": job, "tenant": tenant, "queue": "q", "request": {"kind": "whole", "gpus": gpus}}


async def test_quota_refuses_over_nominal_and_lends_inside_a_cohort(bus: Bus, store: Store) -> None:
    node = unique("n")
    solo, borrower, lender = unique("solo"), unique("bor"), unique("len")
    memory = 1_000_000
    async with running_allocator(bus, store) as (service, _):
        await register(bus, service, node, gpus=8)
        status, _ = await send(
            service, "PUT", f"/v1/quotas/{solo}", {"gpu_model": MODEL, "nominal": {"milli": 1000, "memory_mib": memory}}
        )
        assert status == 200
        for t in (borrower, lender):
            status, _ = await send(
                service,
                "PUT",
                f"/v1/quotas/{t}",
                {"gpu_model": MODEL, "nominal": {"milli": 1000, "memory_mib": memory}, "cohort": "c1"},
            )
            assert status == 200
        _, quotas = await get(service, "/v1/quotas")
        assert {q["quota"]["name"] for q in quotas} >= {solo, borrower, lender}

        status, body = await send(service, "POST", "/v1/allocations", ask(unique("j"), solo, 2))
        assert status == 409 and body["error"] == "over_quota", body
        status, _ = await send(service, "POST", "/v1/allocations", ask(unique("j"), solo, 1))
        assert status == 201
        # The borrower takes the lender's idle share: 2 GPUs on a nominal of 1.
        status, body = await send(service, "POST", "/v1/allocations", ask(unique("j"), borrower, 2))
        assert status == 201, body
        # The cohort has nothing more to lend.
        status, body = await send(service, "POST", "/v1/allocations", ask(unique("j"), borrower, 1))
        assert status == 409 and body["error"] == "over_quota", body
        _, quotas = await get(service, "/v1/quotas")
        used = {q["quota"]["name"]: q["used"]["milli"] for q in quotas}
        assert used[borrower] == 2000 and used[solo] == 1000 and used.get(lender, 0) == 0


async def test_a_quota_named_by_a_short_model_name_is_set_read_and_removed(bus: Bus, store: Store) -> None:
    node, tenant = unique("n"), unique("t")
    short = "H100"  # of MODEL, "H100-80GB"
    async with running_allocator(bus, store) as (service, _):
        await register(bus, service, node, gpus=8)
        status, body = await send(
            service, "PUT", f"/v1/quotas/{tenant}", {"gpu_model": short.lower(), "nominal": {"milli": 1000}}
        )
        assert status == 200 and body["gpu_model"] == MODEL, body
        status, body = await send(
            service, "PUT", f"/v1/quotas/{tenant}", {"gpu_model": "B200", "nominal": {"milli": 1}}
        )
        assert status == 422 and body["path"] == "$.gpu_model" and MODEL in body["detail"], body
        status, body = await send(service, "POST", "/v1/allocations", ask(unique("j"), tenant, 2))
        assert status == 409 and body["error"] == "over_quota", body
        status, body = await send(service, "DELETE", f"/v1/quotas/{tenant}")
        assert status == 400 and body["error"] == "invalid query parameter" and body["path"] == "?gpu_model", body
        status, body = await send(service, "DELETE", f"/v1/quotas/{tenant}?gpu_model={short}")
        assert status == 200 and body["name"] == tenant and body["gpu_model"] == MODEL, body
        _, quotas = await get(service, "/v1/quotas")
        assert tenant not in {q["quota"]["name"] for q in quotas}
        status, body = await send(service, "DELETE", f"/v1/quotas/{tenant}?gpu_model={short}")
        assert status == 404 and f"no tenant quota of '{tenant}'" in body["detail"], body
        status, body = await send(service, "POST", "/v1/allocations", ask(unique("j"), tenant, 2))
        assert status == 201, body  # no longer limited


async def test_malformed_command_goes_to_dlq_and_nothing_is_granted(bus: Bus, store: Store) -> None:
    node = unique("n")
    async with running_allocator(bus, store) as (service, _):
        await register(bus, service, node)
        job = unique("bad")
        subject = ProposePlacement.subject(job)
        await bus.js.publish(subject, b"{not json", headers={"Nats-Msg-Id": new_id()})
        dlq = f"ibpool.dlq.{DURABLES}-commands"

        async def dead() -> list:
            return [
                m for m in await stream_messages(bus.js, DLQ_STREAM, dlq) if m.headers["ibpool-dlq-subject"] == subject
            ]

        async def arrived() -> bool:
            return bool(await dead())

        await eventually(arrived, what="malformed command in the DLQ")
        (m,) = await dead()
        assert m.headers["ibpool-dlq-reason"].startswith("decode")
        assert await events(bus, AllocationRejected, job) == []
        n = await pool_node(service, node)
        assert n is not None and n["allocated_milli"] == 0


async def test_http_request_read_release_and_bad_bodies(bus: Bus, store: Store) -> None:
    node = unique("n")
    async with running_allocator(bus, store) as (service, _):
        await register(bus, service, node)
        job = unique("j")
        status, body = await send(service, "POST", "/v1/allocations", ask(job, "t", 2))
        assert status == 201, body
        alloc_id = body["allocation_id"]
        assert [a["gpu_index"] for a in body["grants"][0]["assignments"]] == [0, 1]
        status, listed = await get(service, f"/v1/allocations?owner={job}")
        assert status == 200 and [a["allocation_id"] for a in listed] == [alloc_id]
        status, one = await get(service, f"/v1/allocations/{alloc_id}")
        assert status == 200 and one["owner"] == job and one["kind"] == "whole"
        _, pool = await get(service, "/v1/pool")
        model = next(m for m in pool["models"] if m["model"] == MODEL)
        assert model["allocated_milli"] >= 2000

        async def published() -> bool:
            return bool(await events(bus, AllocationGranted, node))

        await eventually(published, what="the API's grant on the bus")
        async with aiohttp.ClientSession() as s, s.get(f"{service.http_url}/metrics") as r:
            metrics = await r.text()
        assert f'ibpool_pool_allocated_milli{{model="{MODEL}"}}' in metrics
        assert 'ibpool_pool_grants_total{kind="whole"} 1.0' in metrics
        assert "ibpool_pool_commit_seconds_count" in metrics
        status, _ = await send(service, "DELETE", f"/v1/allocations/{alloc_id}")
        assert status == 200
        status, _ = await get(service, f"/v1/allocations/{alloc_id}")
        assert status == 404
        n = await pool_node(service, node)
        assert n is not None and n["allocated_milli"] == 0

        status, body = await send(service, "DELETE", "/v1/allocations/nope")
        assert status == 404
        status, body = await send(service, "POST", "/v1/allocations", {"job_id": 1})
        assert status == 400 and body["path"] is not None
        status, body = await send(service, "POST", "/v1/allocations", raw=b"{oops")
        assert status == 400 and "malformed JSON" in body["detail"]
        status, body = await send(
            service, "PUT", "/v1/quotas/t", {"gpu_model": MODEL, "nominal": {"milli": -1, "memory_mib": 0}}
        )
        assert status == 422 and "negative" in body["detail"]
        status, body = await send(service, "PUT", "/v1/quotas/t", {"nominal": {"milli": 1}})
        assert status == 400  # no gpu_model: the schema requires one
        status, body = await send(service, "POST", "/v1/allocations", {**ask(unique("j"), "t", 1), "lease_s": 0})
        assert status == 400


async def test_http_inputs_are_bounded_and_an_id_reused_for_another_body_is_409(bus: Bus, store: Store) -> None:
    node = unique("n")
    async with running_allocator(bus, store) as (service, allocator):
        await register(bus, service, node)
        # Numbers that would overflow a timestamp, and ids that are not subject- and path-safe.
        for bad, path in (
            ({"lease_s": 1e16}, "$.lease_s"),
            ({"lease_s": 31 * 86_400}, "$.lease_s"),
            ({"id": "a b.c*>"}, "$.id"),
            ({"id": "../../v1/quotas/evil"}, "$.id"),
            ({"job_id": "j.1"}, "$.job_id"),
            ({"cpu_milli": -1}, "$.cpu_milli"),
        ):
            status, body = await send(service, "POST", "/v1/allocations", {**ask(unique("j"), "t", 1), **bad})
            assert status == 400 and body["path"] == path, (bad, body)
        # A bus command with a lease beyond the bound is refused by the core (no OverflowError).
        version = allocator.ledger.version
        cmd = propose(unique("j"), node, 3, version, lease_s=1e16)
        await bus.publish(cmd)

        async def refused() -> bool:
            return any("lease_s must be within" in r.detail for r in await events(bus, AllocationRejected, cmd.job_id))

        await eventually(refused, what="the overlong lease refused")
        # The same id: the same body gets the first answer, another body 409 naming why.
        job = unique("j")
        first = {**ask(job, "t", 1), "id": unique("a")}
        status, granted = await send(service, "POST", "/v1/allocations", first)
        assert status == 201, granted
        status, again = await send(service, "POST", "/v1/allocations", first)
        assert status == 200 and again == granted
        for other in ({**first, "job_id": unique("j")}, {**first, "tenant": "u"}):
            status, body = await send(service, "POST", "/v1/allocations", other)
            assert status == 409 and body["error"] == "allocation id taken" and body["path"] == "$.id", body
        # One live allocation per job: a second one under a new id is refused unless it says additional.
        status, body = await send(service, "POST", "/v1/allocations", {**first, "id": unique("a")})
        assert status == 409 and body["error"] == "conflict" and "already holds" in body["detail"], body
        status, body = await send(service, "POST", "/v1/allocations", {**first, "id": unique("a"), "additional": True})
        assert status == 201, body


async def test_two_replicas_never_grant_one_gpu_twice(bus: Bus, store: Store) -> None:
    node = unique("n")
    async with running_allocator(bus, store) as (first, _), running_allocator(bus, store, instance="second") as (_, b):
        version = await register(bus, first, node)
        jobs = [unique("j") for _ in range(8)]
        for j in jobs:
            await bus.publish(propose(j, node, 0, version))

        async def answered() -> bool:
            rejected = [r for j in jobs for r in await events(bus, AllocationRejected, j)]
            return len(await events(bus, AllocationGranted, node)) + len(rejected) >= len(jobs)

        await eventually(answered, what="every proposal answered")
        granted = await events(bus, AllocationGranted, node)
        rejected = [r for j in jobs for r in await events(bus, AllocationRejected, j)]
        assert len(granted) == 1 and len(rejected) == len(jobs) - 1
        assert {r.reason for r in rejected} == {"conflict"}
        # The other replica's cache catches up from the log on its next change.
        decision = await b.submit(propose(unique("j"), node, 1, version))
        assert decision.granted and granted[0].allocation_id in b.ledger.allocations


async def test_rolled_back_change_is_forgotten_by_the_cache(bus: Bus, store: Store) -> None:
    node = unique("n")
    async with running_allocator(bus, store) as (service, allocator):
        version = await register(bus, service, node)
        first, second = propose(unique("j"), node, 0, version), propose(unique("j"), node, 0, version)
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                decision = await allocator.commit(tx, allocator.decider(first))
                assert decision.granted
                raise RuntimeError("the batch is rolled back")
        assert first.id in allocator.ledger.allocations  # the cache ran ahead of the log
        decision = await allocator.submit(second)
        assert [g.allocation_id for g in decision.granted] == [second.id]
        assert first.id not in allocator.ledger.allocations and allocator.rebuilds == 1


async def test_grant_reaches_the_node_agent_which_starts_the_job(stack: StackInfo, bus: Bus, store: Store) -> None:
    prefix = unique_prefix()
    node = f"{prefix}-001"
    async with (
        own_store(stack) as agent_store,
        running_agent(bus, agent_store, nodes=1, node_prefix=prefix, gpus_per_node=2),
        running_allocator(bus, store) as (service, _),
    ):

        async def registered_by_agent() -> bool:
            return await pool_node(service, node) is not None

        await eventually(registered_by_agent, what="the agent's node in the ledger")
        job = unique("j")
        body = {**ask(job, "t", 1), "workload": {"simulated_runtime_s": 0.3}}
        status, granted = await send(service, "POST", "/v1/allocations", body)
        assert status == 201, granted
        assert granted["grants"][0]["node_id"] == node

        async def started_and_exited() -> bool:
            started = await job_news(bus.js, JobStarted, job)
            exited = await job_news(bus.js, JobExited, job)
            return bool(started) and bool(exited)

        await eventually(started_and_exited, what="JobStarted and JobExited from the agent")
        (started,) = await job_news(bus.js, JobStarted, job)
        assert started.node_id == node and started.allocation_id == granted["allocation_id"]


def fabric_of(prefix: str, hosts: int = 12) -> Topology:
    """A 2-tier fat-tree of radix 8: leaf groups of four hosts <prefix>-h1..h4, h5..h8, h9..h12."""
    t = generate(f"fat_tree_2tier:hosts={hosts},radix=8")
    return rename_hosts(t, {h.name: f"{prefix}-h{i}" for i, h in enumerate(t.hosts, 1)})


@asynccontextmanager
async def serving_topology(topology: Topology, version: int) -> AsyncIterator[str]:
    """A stand-in for the fabric monitor's GET /v1/topology?version=N; yields the URL of `version`."""

    async def get_topology(request: web.Request) -> web.Response:
        if request.query.get("version") != str(version):
            return web.json_response({"error": "not found"}, status=404)
        return web.Response(body=msgspec.json.encode(topology), content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/topology", get_topology)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1/topology?version={version}"
    finally:
        await runner.cleanup()


def remote_ask(job: str, client: str) -> dict[str, Any]:
    return {**ask(job, "t", 1), "request": {"kind": "remote", "milli": 500}, "client_node_id": client}


async def test_published_topology_brings_remote_grants_with_their_distance_and_gangs_under_one_leaf(
    bus: Bus, store: Store
) -> None:
    prefix = unique("f")
    h = [f"{prefix}-h{i}" for i in range(13)]  # h[1] .. h[12]
    topology = fabric_of(prefix)
    # A version above any other test's, so a late redelivery of theirs is older and not fetched.
    version = 1_000_000
    instance = unique("fabric")
    async with serving_topology(topology, version) as url:
        async with running_allocator(bus, store, instance=instance, max_remote_hops=2) as (service, allocator):
            # Leaf groups {h1..h4} and {h5..h8} have three pool nodes each, registered alternately, so
            # ledger order (first fit's) alternates between them; h1, h5 and h9..h12 are clients only.
            await register(bus, service, h[2], h[6], h[3], h[7], h[4], h[8])
            status, body = await send(service, "POST", "/v1/allocations", remote_ask(unique("j"), h[1]))
            assert status == 409 and body["error"] == "invalid" and "has none" in body["detail"], body

            await bus.publish(
                TopologyPublished(
                    source="fabric_monitor/test",
                    key=topology.name,
                    version=version,
                    content_hash=content_hash(topology),
                    hosts=len(topology.hosts),
                    switches=len(topology.switches),
                    links=len(topology.links),
                    url=url,
                )
            )

            async def fabric_loaded() -> bool:
                _, pool = await get(service, "/v1/pool")
                return pool["fabric"] is not None and pool["fabric"]["version"] == version

            await eventually(fabric_loaded, what="the published topology fetched by the allocator")
            _, pool = await get(service, "/v1/pool")
            assert pool["fabric"]["hosts"] == 12 and pool["fabric"]["leaf_groups"] == 3

            # Within 2 hops of h1: the pool nodes under its leaf.
            job = unique("j")
            status, body = await send(service, "POST", "/v1/allocations", remote_ask(job, h[1]))
            assert status == 201, body
            (grant,) = body["grants"]
            assert grant["node_id"] in {h[2], h[3], h[4]} and grant["hops"] == 2 and grant["client_node_id"] == h[1]
            _, alloc = await get(service, f"/v1/allocations/{body['allocation_id']}")
            assert alloc["kind"] == "remote" and alloc["hops"] == 2 and alloc["client_node_id"] == h[1]

            async def on_the_bus() -> bool:
                return any(g.job_id == job for g in await events(bus, AllocationGranted, grant["node_id"]))

            await eventually(on_the_bus, what="the remote grant on the bus")
            (published,) = [g for g in await events(bus, AllocationGranted, grant["node_id"]) if g.job_id == job]
            assert (published.hops, published.client_node_id) == (2, h[1])

            # h9 is under a leaf with no pool node: everything is 4 hops away, over the limit of 2.
            status, body = await send(service, "POST", "/v1/allocations", remote_ask(unique("j"), h[9]))
            assert status == 409 and body["error"] == "invalid", body
            assert "4 hops" in body["detail"] and "over the limit of 2" in body["detail"]

            # A gang of two whole hosts: first fit would take the first two free nodes in ledger order,
            # one under each leaf; the allocator keeps it under one (the tighter: two free hosts left
            # under h1's leaf, three under h5's).
            gang = {**ask(unique("g"), "t", 4), "request": {"kind": "gang", "hosts": 2, "gpus": 4}}
            want = PlacementRequest(
                request=msgspec.convert(gang["request"], ResourceRequest), nodes=tuple(allocator.ledger.nodes)
            )
            spread = {a.node_id for a in first_fit(allocator.ledger, want) or []}
            assert len({allocator.fabric.leaf_group(n) for n in spread}) == 2
            status, body = await send(service, "POST", "/v1/allocations", gang)
            assert status == 201, body
            nodes = {g["node_id"] for g in body["grants"]}
            assert len(nodes) == 2 and {allocator.fabric.leaf_group(n) for n in nodes} == {
                allocator.fabric.leaf_group(h[1])
            }

            async with aiohttp.ClientSession() as s, s.get(f"{service.http_url}/metrics") as r:
                metrics = await r.text()
            assert f'ibpool_pool_fragmentation_milli{{measure="fgd",model="{MODEL}"}}' in metrics
            _, pool = await get(service, "/v1/pool")
            assert pool["fragmentation_measure"] == "fgd" and pool["workload_types"] == 2

        # Restarted, its durable consumer is past the announcement: the newest one in the stream is loaded at start.
        async with running_allocator(bus, store, instance=instance, max_remote_hops=2) as (service, _):
            await eventually(fabric_loaded, what="the newest published topology loaded at start")


async def test_fabric_file_gives_distances_from_the_start(bus: Bus, store: Store, tmp_path: Path) -> None:
    prefix = unique("f")
    path = tmp_path / "fabric.json"
    path.write_text(export_topology("native", fabric_of(prefix, hosts=8)).text)
    async with running_allocator(bus, store, instance=unique("file"), fabric_file=str(path)) as (service, _):
        _, pool = await get(service, "/v1/pool")
        assert pool["fabric"]["origin"] == str(path) and pool["fabric"]["version"] is None
        await register(bus, service, f"{prefix}-h5")
        status, body = await send(service, "POST", "/v1/allocations", remote_ask(unique("j"), f"{prefix}-h1"))
        assert status == 201 and body["grants"][0]["hops"] == 4, body
