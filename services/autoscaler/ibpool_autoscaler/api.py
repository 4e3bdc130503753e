"""The autoscaler's HTTP API: create/replace, list, show (replicas and the last decision), delete deployments."""

from __future__ import annotations

import re

import msgspec
from aiohttp import web

from ibpool_runtime.http import BadBody, json_response, read_body

from . import state
from .deployments import NAME_PATTERN, DeploymentBody, InvalidDeployment, core_deployment, deployment_view, policy_of
from .service import Autoscaler


class AutoscalerView(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    leader: bool
    interval_s: float
    rounds: int


def checked_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not re.fullmatch(NAME_PATTERN, name):
        raise BadBody(f"deployment name must match {NAME_PATTERN}", "$.name")
    return name


def validate(name: str, body: DeploymentBody) -> None:
    """BadBody naming the field when the body decodes but does not add up."""
    try:
        core_deployment(name, body)
        policy_of(body)
    except InvalidDeployment as e:
        raise BadBody(e.detail, e.path) from None
    except ValueError as e:  # a core invariant the body checks above do not cover
        raise BadBody(str(e), "$") from None


def routes(autoscaler: Autoscaler) -> list[web.RouteDef]:
    store = autoscaler.kit.store

    async def put(request: web.Request) -> web.Response:
        name = checked_name(request)
        body = await read_body(request, DeploymentBody)
        validate(name, body)
        async with store.transaction() as tx:
            record, created = await autoscaler.put(tx, name, body)
            replicas = await state.replicas_of(tx.conn, name)
        return json_response(deployment_view(record, replicas), status=201 if created else 200)

    async def list_all(_: web.Request) -> web.Response:
        async with store.transaction() as tx:
            records = await state.list_deployments(tx.conn)
            views = [deployment_view(r, await state.replicas_of(tx.conn, r.name)) for r in records]
        return json_response(views)

    async def show(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with store.transaction() as tx:
            record = await state.get_deployment(tx.conn, name)
            replicas = await state.replicas_of(tx.conn, name)
        if record is None:
            return json_response({"error": "not found", "detail": f"no deployment {name}"}, 404)
        return json_response(deployment_view(record, replicas))

    async def delete(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with store.transaction() as tx:
            cancelled = await autoscaler.delete(tx, name)
        if cancelled is None:
            return json_response({"error": "not found", "detail": f"no deployment {name}"}, 404)
        return json_response({"deleted": name, "cancelled": cancelled})

    async def about(_: web.Request) -> web.Response:
        return json_response(
            AutoscalerView(
                instance=autoscaler.kit.source,
                leader=autoscaler.is_leader,
                interval_s=autoscaler.cfg.interval_s,
                rounds=autoscaler.rounds,
            )
        )

    return [
        web.put("/v1/deployments/{name}", put),
        web.get("/v1/deployments", list_all),
        web.get("/v1/deployments/{name}", show),
        web.delete("/v1/deployments/{name}", delete),
        web.get("/v1/autoscaler", about),
    ]
