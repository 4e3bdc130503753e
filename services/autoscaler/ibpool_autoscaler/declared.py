"""What deployments and elastic jobs have in common: a thing declared by name (PUT, GET, DELETE) that
runs as member jobs at the scheduler (a deployment's replicas, an elastic job's workers).

A `Kind` names, for one of them, its body, record and view, its tables (`state.Declarations`,
`state.MemberJobs`), how a body is checked and what goes with the declaration when it is deleted.
The service's `declare` / `withdraw` and the API's four routes are written once over a `Kind`; only
the decisions (scaling a deployment, resizing elastic jobs) stay apart, because they differ.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import asyncpg

from ibpool_runtime.http import Unprocessable

from . import state
from .deployments import (
    DeploymentBody,
    DeploymentRecord,
    DeploymentView,
    InvalidDeployment,
    ReplicaRecord,
    core_deployment,
    deployment_view,
    policy_of,
)
from .elastic import (
    ElasticJobBody,
    ElasticJobRecord,
    ElasticJobView,
    InvalidElasticJob,
    WorkerRecord,
    check_body,
    elastic_view,
)

B = TypeVar("B", DeploymentBody, ElasticJobBody)
D = TypeVar("D", DeploymentRecord, ElasticJobRecord)
R = TypeVar("R", ReplicaRecord, WorkerRecord)
V = TypeVar("V", DeploymentView, ElasticJobView)


@dataclass(frozen=True)
class Kind(Generic[B, D, R, V]):
    # In messages: "no deployment x", "elastic job x deleted".
    noun: str
    # The collection's path: `<path>` lists, `<path>/{name}` is one.
    path: str
    body: type[B]
    # The record's class: record(name=, body=, created_at=, updated_at=).
    record: Callable[..., D]
    view_type: type[V]
    declarations: state.Declarations[D]
    members: state.MemberJobs[R]
    # BadBody naming the field when the body decodes but does not add up.
    check: Callable[[str, B], None]
    view: Callable[[D, list[R]], V]
    # Removes the declaration and whatever only it used (its members are handled by the caller).
    forget: Callable[[asyncpg.Connection, str], Awaitable[None]]
    # OpenAPI summaries: put, list, show, delete.
    summaries: tuple[str, str, str, str]


def check_deployment(name: str, body: DeploymentBody) -> None:
    """BadBody naming the field when the body decodes but does not add up."""
    try:
        core_deployment(name, body)
        policy_of(body)
    except InvalidDeployment as e:
        raise Unprocessable(e.detail, e.path) from None
    except ValueError as e:  # a core invariant the body checks above do not cover
        raise Unprocessable(str(e), "$") from None


def check_elastic_job(_: str, body: ElasticJobBody) -> None:
    try:
        check_body(body)
    except InvalidElasticJob as e:
        raise Unprocessable(e.detail, e.path) from None


DEPLOYMENTS: Kind[DeploymentBody, DeploymentRecord, ReplicaRecord, DeploymentView] = Kind(
    noun="deployment",
    path="/v1/deployments",
    body=DeploymentBody,
    record=DeploymentRecord,
    view_type=DeploymentView,
    declarations=state.DEPLOYMENTS,
    members=state.REPLICAS,
    check=check_deployment,
    view=deployment_view,
    forget=state.delete_deployment,
    summaries=(
        "Create or replace a deployment",
        "All deployments",
        "A deployment: its replicas and the last decision",
        "Delete a deployment, cancelling its replicas",
    ),
)

ELASTIC_JOBS: Kind[ElasticJobBody, ElasticJobRecord, WorkerRecord, ElasticJobView] = Kind(
    noun="elastic job",
    path="/v1/elastic-jobs",
    body=ElasticJobBody,
    record=ElasticJobRecord,
    view_type=ElasticJobView,
    declarations=state.ELASTIC_JOBS,
    members=state.WORKERS,
    check=check_elastic_job,
    view=elastic_view,
    forget=state.ELASTIC_JOBS.delete,
    summaries=(
        "Declare or replace an elastic training job",
        "All elastic training jobs",
        "An elastic training job: its workers and the last resize",
        "Delete an elastic training job, cancelling its workers",
    ),
)

KINDS: tuple[Kind[Any, Any, Any, Any], ...] = (ELASTIC_JOBS, DEPLOYMENTS)
