"""The autoscaler's HTTP API: create/replace, list, show and delete deployments (with their replicas and the
last decision) and elastic jobs (with their workers and the last resize), one set of routes over `declared.Kind`."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from ibpool_runtime.http import ErrorBody, documented, json_response, read_body

from .declared import KINDS, Kind, check_deployment
from .deployments import DeploymentBody, DeploymentName
from .service import Autoscaler


class AutoscalerView(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    leader: bool
    interval_s: float
    rounds: int
    # Batch elasticity: rounds taken, and whether the pool ledger replica has caught up (no round before).
    elastic_rounds: int = 0
    pool_caught_up: bool = False


class Deleted(msgspec.Struct, frozen=True, kw_only=True):
    deleted: str
    cancelled: list[str]


def validate(name: str, body: DeploymentBody) -> None:
    """BadBody naming the field when a deployment's body decodes but does not add up."""
    check_deployment(name, body)


def declared_routes(autoscaler: Autoscaler, kind: Kind[Any, Any, Any, Any]) -> list[web.RouteDef]:
    """PUT, list, GET and DELETE of one kind of declared thing (see declared.py)."""
    store = autoscaler.kit.store
    put_doc, list_doc, show_doc, delete_doc = kind.summaries

    def not_found(name: str) -> web.Response:
        return json_response({"error": "not found", "detail": f"no {kind.noun} {name}"}, 404)

    named = {"name": DeploymentName}

    @documented(put_doc, {200: kind.view_type, 201: kind.view_type}, body=kind.body, path=named)
    async def put(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await read_body(request, kind.body)
        kind.check(name, body)
        async with store.transaction() as tx:
            record, created = await autoscaler.declare(tx, kind, name, body)
            members = await kind.members.of(tx.conn, name)
        return json_response(kind.view(record, members), status=201 if created else 200)

    @documented(list_doc, {200: list[kind.view_type]})  # type: ignore[name-defined]
    async def list_all(_: web.Request) -> web.Response:
        async with store.transaction() as tx:
            records = await kind.declarations.all(tx.conn)
            views = [kind.view(r, await kind.members.of(tx.conn, r.name)) for r in records]
        return json_response(views)

    @documented(show_doc, {200: kind.view_type, 404: ErrorBody}, path=named)
    async def show(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with store.transaction() as tx:
            record = await kind.declarations.get(tx.conn, name)
            members = await kind.members.of(tx.conn, name)
        if record is None:
            return not_found(name)
        return json_response(kind.view(record, members))

    @documented(delete_doc, {200: Deleted, 404: ErrorBody}, path=named)
    async def delete(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with store.transaction() as tx:
            cancelled = await autoscaler.withdraw(tx, kind, name)
        if cancelled is None:
            return not_found(name)
        return json_response(Deleted(deleted=name, cancelled=cancelled))

    return [
        web.put(f"{kind.path}/{{name}}", put),
        web.get(kind.path, list_all),
        web.get(f"{kind.path}/{{name}}", show),
        web.delete(f"{kind.path}/{{name}}", delete),
    ]


def routes(autoscaler: Autoscaler) -> list[web.RouteDef]:
    @documented("This autoscaler instance", {200: AutoscalerView})
    async def about(_: web.Request) -> web.Response:
        return json_response(
            AutoscalerView(
                instance=autoscaler.kit.source,
                leader=autoscaler.is_leader,
                interval_s=autoscaler.cfg.interval_s,
                rounds=autoscaler.rounds,
                elastic_rounds=autoscaler.elastic_rounds,
                pool_caught_up=autoscaler.pool.caught_up,
            )
        )

    return [*(r for kind in KINDS for r in declared_routes(autoscaler, kind)), web.get("/v1/autoscaler", about)]
