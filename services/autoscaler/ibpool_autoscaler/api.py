"""The autoscaler's HTTP API: create/replace, list, show (replicas and the last decision), delete deployments."""

from __future__ import annotations

import re

import msgspec
from aiohttp import web

from ibpool_runtime.http import BadBody, ErrorBody, documented, json_response, read_body

from . import state
from .deployments import (
    NAME_PATTERN,
    DeploymentBody,
    DeploymentView,
    InvalidDeployment,
    core_deployment,
    deployment_view,
    policy_of,
)
from .elastic import ElasticJobBody, ElasticJobView, InvalidElasticJob, check_body, elastic_view
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

    @documented("Create or replace a deployment", {200: DeploymentView, 201: DeploymentView}, body=DeploymentBody)
    async def put(request: web.Request) -> web.Response:
        name = checked_name(request)
        body = await read_body(request, DeploymentBody)
        validate(name, body)
        async with store.transaction() as tx:
            record, created = await autoscaler.put(tx, name, body)
            replicas = await state.REPLICAS.of(tx.conn, name)
        return json_response(deployment_view(record, replicas), status=201 if created else 200)

    @documented("All deployments", {200: list[DeploymentView]})
    async def list_all(_: web.Request) -> web.Response:
        async with store.transaction() as tx:
            records = await state.DEPLOYMENTS.all(tx.conn)
            views = [deployment_view(r, await state.REPLICAS.of(tx.conn, r.name)) for r in records]
        return json_response(views)

    @documented("A deployment: its replicas and the last decision", {200: DeploymentView, 404: ErrorBody})
    async def show(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with store.transaction() as tx:
            record = await state.DEPLOYMENTS.get(tx.conn, name)
            replicas = await state.REPLICAS.of(tx.conn, name)
        if record is None:
            return json_response({"error": "not found", "detail": f"no deployment {name}"}, 404)
        return json_response(deployment_view(record, replicas))

    @documented("Delete a deployment, cancelling its replicas", {200: Deleted, 404: ErrorBody})
    async def delete(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with store.transaction() as tx:
            cancelled = await autoscaler.delete(tx, name)
        if cancelled is None:
            return json_response({"error": "not found", "detail": f"no deployment {name}"}, 404)
        return json_response(Deleted(deleted=name, cancelled=cancelled))

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

    @documented(
        "Declare or replace an elastic training job", {200: ElasticJobView, 201: ElasticJobView}, body=ElasticJobBody
    )
    async def put_elastic(request: web.Request) -> web.Response:
        name = checked_name(request)
        body = await read_body(request, ElasticJobBody)
        try:
            check_body(body)
        except InvalidElasticJob as e:
            raise BadBody(e.detail, e.path) from None
        async with store.transaction() as tx:
            record, created = await autoscaler.put_elastic(tx, name, body)
            workers = await state.WORKERS.of(tx.conn, name)
        return json_response(elastic_view(record, workers), status=201 if created else 200)

    @documented("All elastic training jobs", {200: list[ElasticJobView]})
    async def list_elastic(_: web.Request) -> web.Response:
        async with store.transaction() as tx:
            records = await state.ELASTIC_JOBS.all(tx.conn)
            views = [elastic_view(r, await state.WORKERS.of(tx.conn, r.name)) for r in records]
        return json_response(views)

    @documented("An elastic training job: its workers and the last resize", {200: ElasticJobView, 404: ErrorBody})
    async def show_elastic(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with store.transaction() as tx:
            record = await state.ELASTIC_JOBS.get(tx.conn, name)
            workers = await state.WORKERS.of(tx.conn, name)
        if record is None:
            return json_response({"error": "not found", "detail": f"no elastic job {name}"}, 404)
        return json_response(elastic_view(record, workers))

    @documented("Delete an elastic training job, cancelling its workers", {200: Deleted, 404: ErrorBody})
    async def delete_elastic(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with store.transaction() as tx:
            cancelled = await autoscaler.delete_elastic(tx, name)
        if cancelled is None:
            return json_response({"error": "not found", "detail": f"no elastic job {name}"}, 404)
        return json_response(Deleted(deleted=name, cancelled=cancelled))

    return [
        web.put("/v1/elastic-jobs/{name}", put_elastic),
        web.get("/v1/elastic-jobs", list_elastic),
        web.get("/v1/elastic-jobs/{name}", show_elastic),
        web.delete("/v1/elastic-jobs/{name}", delete_elastic),
        web.put("/v1/deployments/{name}", put),
        web.get("/v1/deployments", list_all),
        web.get("/v1/deployments/{name}", show),
        web.delete("/v1/deployments/{name}", delete),
        web.get("/v1/autoscaler", about),
    ]
