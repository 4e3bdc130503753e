"""The pool allocator's HTTP API: the pool, allocations and quotas from the ledger; requests and releases."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import msgspec
from aiohttp import web

from ibpool_core.fabric.view import FabricAbout
from ibpool_core.pool import quotas
from ibpool_core.pool.allocate import MAX_CPU_MILLI, MAX_HOST_MEMORY_MIB, MAX_LEASE_S
from ibpool_core.pool.ledger import Allocation, Ledger
from ibpool_core.pool.pool_fragmentation import Measure, PoolFragmentation, measure_fragmentation
from ibpool_proto import new_id
from ibpool_proto.pool import (
    AllocationGranted,
    Quota,
    QuotaChanged,
    QuotaScope,
    ReleaseAllocation,
    RequestAllocation,
    ResourceRequest,
    SetQuota,
    Share,
    WorkloadSpec,
)
from ibpool_runtime.http import BadBody, ErrorBody, SafeId, Unprocessable, documented, json_response, read_body

from .service import PoolAllocator


class ModelView(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    gpus: int
    capacity_milli: int
    allocated_milli: int
    free_milli: int
    memory_mib: int
    allocated_memory_mib: int
    # Fragmented free GPU-milli of this model, by PoolView.fragmentation_measure.
    fragmentation_milli: int = 0


class GpuView(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    model: str
    state: str
    granted_milli: int
    free_milli: int
    granted_memory_mib: int
    memory_mib: int
    holders: list[str]


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    state: str
    capacity_milli: int
    allocated_milli: int
    free_milli: int
    gpus: list[GpuView]


class QuotaView(msgspec.Struct, frozen=True, kw_only=True):
    quota: Quota
    used: Share


class PoolView(msgspec.Struct, frozen=True, kw_only=True):
    """fragmentation_measure  "fgd": FGD's expected fragment for the workload mix the placer learned
                           (`workload_types` task types); "partial_free": free milli of partly
                           granted GPUs (no request seen yet)
    fabric                 the topology the allocator places gangs and remote use on; null: none yet"""

    ledger_version: int
    models: list[ModelView]
    nodes: list[NodeView]
    quotas: list[QuotaView]
    fragmentation_measure: Measure = "partial_free"
    workload_types: int = 0
    fabric: FabricAbout | None = None


class AllocationView(msgspec.Struct, frozen=True, kw_only=True):
    allocation_id: str
    owner: str
    tenant: str
    queue: str
    kind: str
    nodes: list[str]
    lease_expires_at: dt.datetime
    grants: list[dict[str, object]]
    # Remote use: the client node, the serving endpoint and the fabric hops between them.
    client_node_id: str | None = None
    endpoint: str | None = None
    hops: int | None = None


class AllocationAsk(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """POST /v1/allocations: a RequestAllocation without its envelope. `id` makes a retry idempotent:
    the same body under the same id gets the first answer again, another body 409. Ids are of the
    subject-safe alphabet (letters, digits, `_`, `-`): they name NATS subjects and URL paths."""

    job_id: SafeId
    tenant: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    queue: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    request: ResourceRequest
    lease_s: Annotated[float, msgspec.Meta(gt=0.0, le=MAX_LEASE_S)] | None = None
    workload: WorkloadSpec | None = None
    client_node_id: SafeId | None = None
    cpu_milli: Annotated[int, msgspec.Meta(ge=0, le=MAX_CPU_MILLI)] = 0
    host_memory_mib: Annotated[int, msgspec.Meta(ge=0, le=MAX_HOST_MEMORY_MIB)] = 0
    id: SafeId | None = None
    # A job holds one live allocation; true asks for another one beside it (409 otherwise).
    additional: bool = False


# A GPU model as a quota names it: its NVML name, or words of it ("H100").
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class QuotaBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """PUT /v1/quotas/{tenant}: a quota of that tenant (scope "tenant") or of a queue (scope "queue")."""

    gpu_model: str
    nominal: Share
    scope: QuotaScope = "tenant"
    borrowing_limit: Share | None = None
    lending_limit: Share | None = None
    cohort: str | None = None


class Granted(msgspec.Struct, frozen=True, kw_only=True):
    allocation_id: str
    grants: list[AllocationGranted]


class Released(msgspec.Struct, frozen=True, kw_only=True):
    released: str
    events: list[Any]  # the ledger events of the release


def pool_view(
    ledger: Ledger, fragmentation: PoolFragmentation | None = None, fabric: FabricAbout | None = None
) -> PoolView:
    """The pool; `fragmentation` measured by the caller (by default the partial-free measure)."""
    frag = fragmentation if fragmentation is not None else measure_fragmentation(ledger)
    models: dict[str, list[int]] = {}
    nodes = []
    for node in ledger.nodes.values():
        gpus = []
        for g in node.gpus:
            usable = node.ready and g.ready
            state = "failed" if g.failed else "cordoned" if g.cordoned else node.state
            free = g.free_milli if usable else 0
            gpus.append(
                GpuView(
                    index=g.index,
                    model=g.model,
                    state=state,
                    granted_milli=g.granted_milli,
                    free_milli=free,
                    granted_memory_mib=g.granted_memory_mib,
                    memory_mib=g.memory_mib,
                    holders=list(g.holders),
                )
            )
            m = models.setdefault(g.model, [0, 0, 0, 0, 0])
            for i, v in enumerate((1, g.granted_milli, free, g.memory_mib, g.granted_memory_mib)):
                m[i] += v
        nodes.append(
            NodeView(
                node_id=node.node_id,
                state=node.state,
                capacity_milli=1000 * len(gpus),
                allocated_milli=sum(g.granted_milli for g in gpus),
                free_milli=sum(g.free_milli for g in gpus),
                gpus=gpus,
            )
        )
    return PoolView(
        ledger_version=ledger.version,
        models=[
            ModelView(
                model=model,
                gpus=n,
                capacity_milli=1000 * n,
                allocated_milli=used,
                free_milli=free,
                memory_mib=mem,
                allocated_memory_mib=used_mem,
                fragmentation_milli=frag.milli.get(model, 0),
            )
            for model, (n, used, free, mem, used_mem) in sorted(models.items())
        ],
        nodes=sorted(nodes, key=lambda n: n.node_id),
        quotas=quota_views(ledger),
        fragmentation_measure=frag.measure,
        workload_types=frag.task_types,
        fabric=fabric,
    )


def quota_views(ledger: Ledger) -> list[QuotaView]:
    return [QuotaView(quota=q, used=ledger.usage.get(key, quotas.ZERO)) for key, q in sorted(ledger.quotas.items())]


def allocation_view(a: Allocation) -> AllocationView:
    return AllocationView(
        allocation_id=a.allocation_id,
        owner=a.owner,
        tenant=a.tenant,
        queue=a.queue,
        kind=a.kind,
        nodes=list(a.nodes),
        lease_expires_at=a.lease_expires_at,
        grants=[msgspec.to_builtins(g) for g in a.grants],
        client_node_id=a.client_node_id,
        endpoint=a.endpoint,
        hops=a.hops,
    )


def known_models(ledger: Ledger) -> set[str]:
    """The GPU models the pool has (its nodes' GPUs) or has quotas on: what a quota's model is read against."""
    return {g.model for n in ledger.nodes.values() for g in n.gpus} | {q.gpu_model for q in ledger.quotas.values()}


def _not_found(detail: str) -> web.Response:
    return json_response({"error": "not found", "detail": detail}, status=404)


def routes(allocator: PoolAllocator) -> web.RouteTableDef:
    r = web.RouteTableDef()
    source = allocator.kit.source

    @r.get("/v1/pool")
    @documented("The pool: models, nodes, quotas, fragmentation", {200: PoolView})
    async def get_pool(_: web.Request) -> web.Response:
        ledger = allocator.ledger
        return json_response(pool_view(ledger, allocator.fragmentation.read(ledger), allocator.fabric.about))

    @r.get("/v1/allocations")
    @documented("Live allocations", {200: list[AllocationView]}, query={"owner": str})
    async def list_allocations(request: web.Request) -> web.Response:
        owner = request.query.get("owner")
        allocs = sorted(allocator.ledger.allocations.values(), key=lambda a: a.allocation_id)
        return json_response([allocation_view(a) for a in allocs if owner is None or a.owner == owner])

    @r.get("/v1/allocations/{id}")
    @documented("A live allocation", {200: AllocationView, 404: ErrorBody})
    async def get_allocation(request: web.Request) -> web.Response:
        a = allocator.ledger.allocations.get(request.match_info["id"])
        if a is None:
            return _not_found(f"no live allocation {request.match_info['id']}")
        return json_response(allocation_view(a))

    @r.post("/v1/allocations")
    @documented("Request an allocation", {200: Granted, 201: Granted, 409: ErrorBody}, body=AllocationAsk)
    async def request_allocation(request: web.Request) -> web.Response:
        ask = await read_body(request, AllocationAsk)
        try:
            cmd = RequestAllocation(
                id=ask.id or new_id(),
                source=source,
                key=ask.job_id,
                job_id=ask.job_id,
                tenant=ask.tenant,
                queue=ask.queue,
                request=ask.request,
                lease_s=ask.lease_s if ask.lease_s is not None else allocator.cfg.default_lease_s,
                workload=ask.workload,
                client_node_id=ask.client_node_id,
                cpu_milli=ask.cpu_milli,
                host_memory_mib=ask.host_memory_mib,
                additional=ask.additional,
            )
            RequestAllocation.subject(ask.job_id)
        except ValueError as e:
            raise BadBody(str(e), "$.job_id") from None
        decision = await allocator.submit(cmd)
        if decision.conflict:
            return json_response(
                ErrorBody(error="allocation id taken", detail=decision.conflict, path="$.id"), status=409
            )
        rejection = decision.rejection
        if rejection is not None:
            return json_response(
                {"error": rejection.reason, "detail": rejection.detail, "ledger_version": rejection.ledger_version},
                status=409,
            )
        grants: list[AllocationGranted] = decision.granted
        return json_response(Granted(allocation_id=cmd.id, grants=grants), status=201 if not decision.repeat else 200)

    @r.delete("/v1/allocations/{id}")
    @documented("Release an allocation", {200: Released, 404: ErrorBody}, query={"reason": str})
    async def release_allocation(request: web.Request) -> web.Response:
        allocation_id = request.match_info["id"]
        reason = request.query.get("reason", "released through the API")
        cmd = ReleaseAllocation(source=source, key=allocation_id, allocation_id=allocation_id, reason=reason)
        decision = await allocator.submit(cmd)
        if not decision.events:
            return _not_found(decision.note or f"no allocation {allocation_id}")
        return json_response(Released(released=allocation_id, events=list(decision.events)))

    @r.get("/v1/quotas")
    @documented("Quotas and their use", {200: list[QuotaView]})
    async def list_quotas(_: web.Request) -> web.Response:
        return json_response(quota_views(allocator.ledger))

    @r.put("/v1/quotas/{tenant}")
    @documented("Set a tenant's or a queue's quota", {200: Quota}, body=QuotaBody)
    async def put_quota(request: web.Request) -> web.Response:
        body = await read_body(request, QuotaBody)
        try:
            model = quotas.resolve_model(body.gpu_model, known_models(allocator.ledger))
        except ValueError as e:
            raise Unprocessable(str(e), "$.gpu_model") from None
        quota = Quota(
            scope=body.scope,
            name=request.match_info["tenant"],
            gpu_model=model,
            nominal=body.nominal,
            borrowing_limit=body.borrowing_limit,
            lending_limit=body.lending_limit,
            cohort=body.cohort,
        )
        problems = quotas.problems(quota)
        try:
            SetQuota.subject(quota.name)
        except ValueError as e:
            problems = [f"tenant in the path: {e}", *problems]
        if problems:
            raise Unprocessable("; ".join(problems), "$")
        decision = await allocator.submit(SetQuota(source=source, key=quota.name, quota=quota))
        if not decision.events:
            raise Unprocessable(decision.note or "quota refused", "$")
        return json_response(quota)

    @r.delete("/v1/quotas/{tenant}")
    @documented(
        "Remove a tenant's or a queue's quota on one GPU model: it is no longer limited there",
        {200: Quota, 404: ErrorBody},
        query={"gpu_model": ModelName, "scope": QuotaScope},
        required_query=("gpu_model",),
    )
    async def delete_quota(request: web.Request) -> web.Response:
        asked = request.query.get("gpu_model")
        if not asked:
            raise BadBody("query parameter `gpu_model` is required (the GPU model whose quota goes)", "?gpu_model")
        ledger = allocator.ledger
        try:
            model = quotas.resolve_model(asked, known_models(ledger))
        except ValueError as e:
            return _not_found(str(e))
        # `?scope` was checked against QuotaScope before the handler (the documented query).
        scope: QuotaScope = "queue" if request.query.get("scope") == "queue" else "tenant"
        name = request.match_info["tenant"]
        gone = Quota(scope=scope, name=name, gpu_model=model, nominal=quotas.ZERO)
        decision = await allocator.submit(SetQuota(source=source, key=name, quota=gone, remove=True))
        if not decision.events:
            return _not_found(decision.note or f"no {scope} quota of {name!r} on {model!r}")
        removed = decision.events[0]
        assert isinstance(removed, QuotaChanged)
        return json_response(removed.quota)

    return r
