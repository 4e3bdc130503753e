"""The Slurm bridge's HTTP API: what the last round saw and did, the topology file written, and why a
node is (or is not) drained by ibpool."""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from ibpool_core.slurm_bridge import Cordon, wanted_drains
from ibpool_runtime.http import documented, json_response

from . import state
from .service import RoundView, SlurmBridge, TopologyView

# A fabric host name: what the failover controller's events name (no spaces, no control characters).
NodeName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]{1,253}$")]


class BridgeStatus(msgspec.Struct, frozen=True, kw_only=True):
    round: RoundView | None  # None until the first round
    topology: TopologyView


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    node: str  # the fabric host
    slurm_node: str  # its Slurm node name
    cordons: list[Cordon]  # ibpool's cordons on it in force
    drain_reason: str | None  # the reason ibpool drains it with; None: ibpool wants it in service


def routes(bridge: SlurmBridge) -> web.RouteTableDef:
    r = web.RouteTableDef()

    @r.get("/v1/slurm")
    @documented("What the last round saw and did in Slurm, and the topology file written", {200: BridgeStatus})
    async def status(_: web.Request) -> web.Response:
        return json_response(BridgeStatus(round=bridge.last, topology=bridge.topology))

    @r.get("/v1/slurm/nodes/{node}")
    @documented(
        "ibpool's cordons on a fabric host and the Slurm drain they ask for", {200: NodeView}, path={"node": NodeName}
    )
    async def node(request: web.Request) -> web.Response:
        name = request.match_info["node"]
        cordons = (await state.cordons(bridge.kit.store.pool)).get(name, ())
        reason = wanted_drains({name: cordons}, bridge.bridge).get(name)
        view = NodeView(node=name, slurm_node=bridge.names.get(name, name), cordons=list(cordons), drain_reason=reason)
        return json_response(view)

    return r
