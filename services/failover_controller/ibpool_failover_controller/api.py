"""The failover controller's HTTP API: node verdicts, the verdict history, the cluster summary, and the
operator's actions (recover a GPU, recover a node, drain a node), which only the deciding replica takes."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import msgspec
from aiohttp import web

from ibpool_core.health.decide import NodeHealth, NodeStatus, max_failed_nodes
from ibpool_core.health.operator import (
    CordonNode,
    DrainNode,
    OperatorAction,
    Outcome,
    RecoverGpu,
    RecoverNode,
    UncordonNode,
)
from ibpool_runtime.http import BadBody, ErrorBody, GpuIndex, Unprocessable, documented, json_response, read_body

from . import state
from .service import FailoverController, NotDeciding

STATUSES: tuple[NodeStatus, ...] = ("healthy", "suspect", "failed")
MAX_LIMIT = 1000


class GpuView(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    failed: bool
    cordoned: bool
    reason: str
    xid: int | None
    # Who cordoned it and why; empty when no operator did.
    operator_cordon: str = ""


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    status: NodeStatus
    reason: str
    since: dt.datetime | None
    last_beat: dt.datetime | None
    cordoned: bool
    needs_reboot: bool
    failures: int
    hold_s: float
    gpus: list[GpuView]
    rails_cordoned: list[int]
    leaf_cordoned: bool
    # Who drained it and why; empty when no operator did.
    operator_drain: str
    # Who cordoned it (no new work, its work stays) and why; empty when no operator did.
    operator_cordon: str = ""


class OperatorBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Why (a ticket, what was done to the hardware); it goes into the events and the verdict history.
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]
    # Who (optional; the API token names a role, not a person).
    by: Annotated[str, msgspec.Meta(max_length=200)] = ""


class OperatorResult(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome
    detail: str
    # The events published for it (none when there was nothing to do).
    events: list[str]
    event_ids: list[str]


class ClusterSummary(msgspec.Struct, frozen=True, kw_only=True):
    nodes: dict[str, int]
    degraded: bool
    max_failed: int
    topology_version: int
    links_with_problems: int
    flagged_jobs: list[str]
    deciding: bool
    leader_term: int | None


def node_view(n: NodeHealth) -> NodeView:
    return NodeView(
        node_id=n.node_id,
        status=n.status,
        reason=n.reason,
        since=n.since,
        last_beat=n.last_beat,
        cordoned=n.cordoned,
        needs_reboot=n.needs_reboot,
        failures=n.failures,
        hold_s=n.hold_s,
        gpus=[
            GpuView(
                index=g.index,
                failed=g.failed,
                cordoned=g.cordoned,
                reason=g.reason,
                xid=g.xid,
                operator_cordon=g.operator_cordon,
            )
            for _, g in sorted(n.gpus.items())
        ],
        rails_cordoned=sorted(n.rail_cordons),
        leaf_cordoned=bool(n.leaf_cordons),
        operator_drain=n.operator_drain,
        operator_cordon=n.operator_cordon,
    )


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", "100")
    try:
        value = int(raw)
    except ValueError:
        raise BadBody(f"query parameter `limit` must be an integer, got {raw!r}", "?limit") from None
    if not 1 <= value <= MAX_LIMIT:
        raise BadBody(f"query parameter `limit` must be between 1 and {MAX_LIMIT}, got {value}", "?limit")
    return value


def _gpu_index(request: web.Request) -> int:
    """The path's GPU index, checked against `GpuIndex` before the handler ran."""
    return int(request.match_info["index"])


async def _reason(request: web.Request) -> str:
    if not await request.read():  # no body at all: say what is missing rather than "malformed JSON"
        raise BadBody('a body is required: {"reason": "why", "by": "who"} (`reason` may not be blank)', "$.reason")
    try:
        body = await read_body(request, OperatorBody)
    except BadBody as e:
        if e.path is None and "`reason`" in e.detail:  # msgspec names no path for a missing field
            raise BadBody(e.detail, "$.reason") from None
        raise
    if not body.reason.strip():
        raise Unprocessable("`reason` must say why (it may not be blank)", "$.reason")
    return f"{body.reason} (by {body.by})" if body.by else body.reason


async def _operate(controller: FailoverController, action: OperatorAction) -> web.Response:
    reply = await controller.operate(action)
    if isinstance(reply, NotDeciding):
        who = f"the leader is {reply.leader}" if reply.leader else "no replica leads right now; retry shortly"
        detail = f"this replica does not decide; send operator actions to the leader ({who})"
        return json_response(ErrorBody(error="not the leader", detail=detail), status=409)
    if reply.outcome == "not_found":
        return json_response(ErrorBody(error="not found", detail=reply.detail), status=404)
    return json_response(
        OperatorResult(
            outcome=reply.outcome,
            detail=reply.detail,
            events=[type(e).__name__ for e in reply.events],
            event_ids=[e.id for e in reply.events],
        )
    )


OPERATOR_RESPONSES = {200: OperatorResult, 404: ErrorBody, 409: ErrorBody}


def routes(controller: FailoverController) -> web.RouteTableDef:
    r = web.RouteTableDef()

    @r.post("/health/nodes/{node_id}/gpus/{index}/recover")
    @documented(
        "The GPU was reset or replaced: clear its failure and cordon (GpuRecovered, Uncordoned);"
        " 200 with outcome nothing_to_do when it is fine; 409 on a replica that does not decide",
        OPERATOR_RESPONSES,
        body=OperatorBody,
        path={"index": GpuIndex},
    )
    async def recover_gpu(request: web.Request) -> web.Response:
        index = _gpu_index(request)
        reason = await _reason(request)
        return await _operate(
            controller, RecoverGpu(node_id=request.match_info["node_id"], gpu_index=index, reason=reason)
        )

    @r.post("/health/nodes/{node_id}/recover")
    @documented(
        "Put a failed, suspected, held or drained node back at once (NodeRecovered, Uncordoned);"
        " 200 with outcome nothing_to_do when it is healthy; 409 on a replica that does not decide",
        OPERATOR_RESPONSES,
        body=OperatorBody,
    )
    async def recover_node(request: web.Request) -> web.Response:
        reason = await _reason(request)
        return await _operate(controller, RecoverNode(node_id=request.match_info["node_id"], reason=reason))

    @r.post("/health/nodes/{node_id}/drain")
    @documented(
        "Drain a node: cordon it, ask that its work move (Cordoned, DrainRequested, RequeueRequested);"
        " held until an operator recovers it; 409 on a replica that does not decide",
        OPERATOR_RESPONSES,
        body=OperatorBody,
    )
    async def drain_node(request: web.Request) -> web.Response:
        reason = await _reason(request)
        return await _operate(controller, DrainNode(node_id=request.match_info["node_id"], reason=reason))

    @r.post("/health/nodes/{node_id}/cordon")
    @documented(
        "Cordon a node: no new work there, its work stays (Cordoned); held through every verdict until an"
        " operator uncordons or recovers it; 409 on a replica that does not decide",
        OPERATOR_RESPONSES,
        body=OperatorBody,
    )
    async def cordon_node(request: web.Request) -> web.Response:
        reason = await _reason(request)
        return await _operate(controller, CordonNode(node_id=request.match_info["node_id"], reason=reason))

    @r.post("/health/nodes/{node_id}/uncordon")
    @documented(
        "Lift an operator's cordon (Uncordoned); a failure's or a drain's cordon stays (recover lifts those);"
        " 200 with outcome nothing_to_do when no operator cordoned it; 409 on a replica that does not decide",
        OPERATOR_RESPONSES,
        body=OperatorBody,
    )
    async def uncordon_node(request: web.Request) -> web.Response:
        reason = await _reason(request)
        return await _operate(controller, UncordonNode(node_id=request.match_info["node_id"], reason=reason))

    @r.post("/health/nodes/{node_id}/gpus/{index}/cordon")
    @documented(
        "Cordon one GPU: no new work on it, its work stays (Cordoned gpu); held until an operator lifts it;"
        " 409 on a replica that does not decide",
        OPERATOR_RESPONSES,
        body=OperatorBody,
        path={"index": GpuIndex},
    )
    async def cordon_gpu(request: web.Request) -> web.Response:
        index = _gpu_index(request)
        reason = await _reason(request)
        return await _operate(
            controller, CordonNode(node_id=request.match_info["node_id"], gpu_index=index, reason=reason)
        )

    @r.post("/health/nodes/{node_id}/gpus/{index}/uncordon")
    @documented(
        "Lift an operator's cordon of one GPU (Uncordoned gpu); a failed GPU stays cordoned;"
        " 409 on a replica that does not decide",
        OPERATOR_RESPONSES,
        body=OperatorBody,
        path={"index": GpuIndex},
    )
    async def uncordon_gpu(request: web.Request) -> web.Response:
        index = _gpu_index(request)
        reason = await _reason(request)
        return await _operate(
            controller, UncordonNode(node_id=request.match_info["node_id"], gpu_index=index, reason=reason)
        )

    @r.get("/health/nodes")
    @documented("Every node's verdict", {200: list[NodeView]}, query={"status": NodeStatus})
    async def list_nodes(request: web.Request) -> web.Response:
        wanted = request.query.get("status")
        if wanted is not None and wanted not in STATUSES:
            raise BadBody(f"status must be one of {', '.join(STATUSES)}, got {wanted!r}", "?status")
        nodes = controller.state.nodes
        return json_response([node_view(n) for _, n in sorted(nodes.items()) if wanted is None or n.status == wanted])

    @r.get("/health/nodes/{node_id}")
    @documented("A node's verdict", {200: NodeView, 404: ErrorBody})
    async def get_node(request: web.Request) -> web.Response:
        n = controller.state.nodes.get(request.match_info["node_id"])
        if n is None:
            detail = f"no node {request.match_info['node_id']!r} is known to the failover controller"
            return json_response({"error": "not found", "detail": detail}, status=404)
        return json_response(node_view(n))

    @r.get("/health/verdicts")
    @documented(
        "The verdict history, newest first",
        {200: list[state.VerdictRow]},
        query={"limit": Annotated[int, msgspec.Meta(ge=1, le=MAX_LIMIT)], "type": str, "key": str},
    )
    async def list_verdicts(request: web.Request) -> web.Response:
        rows = await state.verdicts(
            controller.kit.store.pool, _limit(request), request.query.get("type"), request.query.get("key")
        )
        return json_response(rows)

    @r.get("/health/cluster")
    @documented("The cluster summary", {200: ClusterSummary})
    async def cluster(_: web.Request) -> web.Response:
        s = controller.state
        counts: dict[str, int] = {status: 0 for status in STATUSES}
        for n in s.nodes.values():
            counts[n.status] += 1
        return json_response(
            ClusterSummary(
                nodes=counts,
                degraded=s.degraded,
                max_failed=max_failed_nodes(s.nodes.values(), controller.core),
                topology_version=s.topology_version,
                links_with_problems=len(s.link_problems),
                flagged_jobs=sorted(j.job_id for j in s.jobs.values() if j.flagged),
                deciding=controller.deciding,
                leader_term=controller.leadership.term if controller.leadership is not None else None,
            )
        )

    return r
