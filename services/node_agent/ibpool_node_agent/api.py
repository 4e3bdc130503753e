"""The node agent's HTTP API: what it hosts and what runs there."""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ibpool_core.workload import Workload
from ibpool_proto.node import GpuInfo, GpuSample
from ibpool_runtime.http import ErrorBody, GpuIndex, documented, json_response, read_body

from . import state
from .enforcers import Applied
from .service import NodeAgent


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    hostname: str
    backend: str
    gpus: list[GpuInfo]
    running: list[Workload]
    # The grants' limits in force on the node (MIG instances, environment), by allocation.
    enforcement: list[Applied] = []
    # The GPUs of its newest telemetry sample (the one last published); empty before the first.
    telemetry: list[GpuSample] = []


class XidBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # The XID code the GPU reports, e.g. 79 (fallen off the bus) or 48 (double-bit ECC error).
    code: Annotated[int, msgspec.Meta(ge=1, le=65535)]


class XidInjected(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    gpu_index: int
    xid: int


class AgentView(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    nodes: int
    heartbeats_sent: int
    exits_by_reason: dict[str, int]
    # Telemetry waiting for the bus, dropped because the buffer was full, and heartbeats skipped while away.
    telemetry_pending: int = 0
    telemetry_dropped: int = 0
    heartbeats_skipped: int = 0


def routes(agent: NodeAgent) -> web.RouteTableDef:
    r = web.RouteTableDef()
    pool = agent.kit.store.pool

    @r.get("/v1/agent")
    @documented("This agent", {200: AgentView})
    async def get_agent(_: web.Request) -> web.Response:
        return json_response(
            AgentView(
                source=agent.kit.source,
                nodes=len(agent.node_ids),
                heartbeats_sent=agent.heartbeats_sent,
                exits_by_reason=await state.exits_by_reason(pool),
                telemetry_pending=len(agent.telemetry.pending),
                telemetry_dropped=agent.telemetry.dropped,
                heartbeats_skipped=agent.heartbeats_skipped,
            )
        )

    @r.get("/v1/nodes")
    @documented("The nodes this agent hosts and what runs there", {200: list[NodeView]})
    async def list_nodes(_: web.Request) -> web.Response:
        work = await state.running(pool)
        return json_response(
            [
                NodeView(
                    node_id=n.node_id,
                    hostname=n.hostname,
                    backend=n.backend,
                    gpus=n.gpus,
                    running=[w for w in work if w.node_id == n.node_id],
                    enforcement=agent.backends[n.node_id].enforcer.in_force(),
                )
                for n in await state.nodes(pool)
                if n.node_id in agent.backends
            ]
        )

    @r.get("/v1/nodes/{node_id}")
    @documented("A node hosted here", {200: NodeView, 404: ErrorBody})
    async def get_node(request: web.Request) -> web.Response:
        node_id = request.match_info["node_id"]
        for n in await state.nodes(pool):
            if n.node_id == node_id and node_id in agent.backends:
                work = await state.running(pool, [node_id])
                return json_response(
                    NodeView(
                        node_id=n.node_id,
                        hostname=n.hostname,
                        backend=n.backend,
                        gpus=n.gpus,
                        running=work,
                        enforcement=agent.backends[node_id].enforcer.in_force(),
                        telemetry=list(agent.latest_gpus.get(node_id, [])),
                    )
                )
        return json_response({"error": "not found", "detail": f"node {node_id!r} is not hosted here"}, status=404)

    @r.get("/metrics/dcgm")
    @documented(
        "Each hosted GPU's newest sample under dcgm-exporter's metric names and labels (Prometheus text)",
        {200: str},
        content_type=CONTENT_TYPE_LATEST.split(";")[0],
    )
    async def dcgm_metrics(_: web.Request) -> web.Response:
        # In a thread: an agent hosting thousands of simulated nodes takes a while to format (dcgm.py).
        body = await asyncio.to_thread(generate_latest, agent.dcgm_registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @r.post("/v1/nodes/{node_id}/gpus/{index}/xid")
    @documented(
        "A fault drill: the GPU reports the XID",
        {202: XidInjected, 403: ErrorBody, 409: ErrorBody},
        body=XidBody,
        path={"index": GpuIndex},
    )
    async def inject_xid(request: web.Request) -> web.Response:
        """A fault drill (config `fault_injection`, simulated backend): the GPU reports the XID at once."""
        if not agent.cfg.fault_injection:
            return json_response({"error": "forbidden", "detail": "fault injection is off on this agent"}, status=403)
        node_id, index = request.match_info["node_id"], request.match_info["index"]  # index: a GpuIndex
        body = await read_body(request, XidBody)
        try:
            agent.inject_xid(node_id, int(index), body.code)
        except ValueError as e:
            return json_response({"error": "conflict", "detail": str(e)}, status=409)
        return json_response(XidInjected(node_id=node_id, gpu_index=int(index), xid=body.code), status=202)

    return r
