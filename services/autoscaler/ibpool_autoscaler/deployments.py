"""The autoscaler's records and its pure glue: request body -> core deployment, metric events -> samples,
a decision -> the commands and events it sends. No I/O here, so all of it is tested without a bus or database.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

import msgspec

from ibpool_core.scale.model import (
    WHOLE_GPU_MILLI,
    Deployment,
    MetricName,
    MetricSample,
    MetricTarget,
    PolicyConfig,
    PredictiveConfig,
    ReactiveConfig,
    Replica,
    ReplicaShape,
    ReplicaState,
    ScalerMemory,
    ScalingReply,
)
from ibpool_core.scale.policies import POLICIES
from ibpool_proto import Message
from ibpool_proto.job import CancelJob, JobSpec, SubmitJob, TopologyConstraint
from ibpool_proto.pool import ResourceRequest, WorkloadSpec
from ibpool_proto.scale import DeploymentMetricsReported, ScaleDecided

# A deployment's name is the prefix of its replicas' job ids (`<name>-r<N>`), and a subject token.
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,100}$"
DeploymentName = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
Positive = Annotated[float, msgspec.Meta(gt=0.0)]


class InvalidDeployment(Exception):
    """The body decodes but does not add up; `path` names the field (msgspec's path notation)."""

    def __init__(self, detail: str, path: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.path = path


class TargetsBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the deployment is scaled on; at least one. Each one alone gives a replica count (the HPA
    formula); the largest wins."""

    # Requests/s one replica serves at its target.
    requests_per_s: Positive | None = None
    # Waiting requests per replica.
    queue_length: Positive | None = None
    # The wanted mean GPU utilisation of the ready replicas, 0..1.
    gpu_utilization: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    # The wanted p99 latency of the deployment (also the SLO the GET view compares against).
    p99_latency_ms: Positive | None = None


class DeploymentBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """PUT /v1/deployments/{name}: the whole deployment (a PUT replaces it; replicas and the scaler's
    memory are kept). A replica holds `gpus` whole GPUs on each of `hosts` hosts, or `fraction` of one
    GPU (with `memory_mib` of its memory). A replica on several hosts (a tensor-parallel model larger
    than a node) is one gang job that must stay under one leaf switch."""

    tenant: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    queue: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "default"
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    min_replicas: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 1
    max_replicas: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 10
    gpus: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    hosts: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    fraction: Annotated[float, msgspec.Meta(gt=0.0, lt=1.0)] | None = None
    memory_mib: Annotated[int, msgspec.Meta(ge=1)] | None = None
    targets: TargetsBody = TargetsBody(requests_per_s=1.0)
    cold_start_s: Annotated[float, msgspec.Meta(ge=0.0)] = 120.0
    scale_to_zero: bool = False
    idle_window_s: Positive = 900.0
    cold_start_budget_s: Annotated[float, msgspec.Meta(ge=0.0)] = 300.0
    policy: Literal["reactive", "predictive"] = "reactive"
    # The policy's knobs (ibpool_core.scale.model); unset fields keep the core's defaults.
    reactive: ReactiveConfig = ReactiveConfig()
    predictive: PredictiveConfig = PredictiveConfig()
    # What a replica runs: a command for the process launcher; none: a long simulated workload.
    workload: WorkloadSpec | None = None


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    at: dt.datetime
    current: int
    desired: int
    # What the policy computed before stabilisation and rate limits.
    recommended: int
    reason: str
    forecast_requests_per_s: float | None = None


class DeploymentRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One deployment as stored: what was PUT, the scaler's memory between decisions, the last decision."""

    name: str
    body: DeploymentBody
    created_at: dt.datetime
    updated_at: dt.datetime
    memory: ScalerMemory = ScalerMemory()
    last: Decision | None = None


class ReplicaRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A replica alive: its job submitted and neither finished nor cancelled by us. `starting` until the
    agent's JobStarted (again after a requeue), `ready` after; `since` is when it entered that state."""

    job_id: str
    deployment: str
    state: ReplicaState
    since: dt.datetime
    submitted_at: dt.datetime
    allocation_id: str | None = None
    nodes: list[str] = []
    # The hosts its job spans (the shape when it was submitted), and those of them where the workload
    # of its allocation started: it is ready once every host started.
    hosts: int = 1
    started: list[str] = []

    def core(self) -> Replica:
        return Replica(replica_id=self.job_id, state=self.state, since=self.since)


def shape_of(body: DeploymentBody) -> ReplicaShape:
    if body.fraction is not None:
        if body.gpus is not None:
            raise InvalidDeployment("a replica holds whole GPUs or a fraction of one, not both", "$.fraction")
        if body.hosts > 1:
            raise InvalidDeployment("a fraction of a GPU is on one host; hosts must be 1", "$.hosts")
        milli = round(body.fraction * WHOLE_GPU_MILLI)
        if not 0 < milli < WHOLE_GPU_MILLI:
            raise InvalidDeployment("a fraction must round to 1..999 thousandths of a GPU", "$.fraction")
        return ReplicaShape(gpus=0, gpu_milli=milli, memory_mib=body.memory_mib or 0)
    if body.memory_mib is not None:
        raise InvalidDeployment(
            "memory_mib goes with a fraction (whole GPUs come with all their memory)", "$.memory_mib"
        )
    return ReplicaShape(gpus=body.gpus or 1, hosts=body.hosts)


def core_deployment(name: str, body: DeploymentBody) -> Deployment:
    """The core's view of the deployment; InvalidDeployment naming the field when the body does not add up."""
    if body.min_replicas > body.max_replicas:
        raise InvalidDeployment(
            f"min_replicas {body.min_replicas} is above max_replicas {body.max_replicas}", "$.min_replicas"
        )
    t = body.targets
    wanted: list[tuple[MetricName, float | None]] = [
        ("requests_per_s", t.requests_per_s),
        ("queue_length", t.queue_length),
        ("gpu_utilization", t.gpu_utilization),
        ("p99_latency_s", None if t.p99_latency_ms is None else t.p99_latency_ms / 1000.0),
    ]
    targets = [MetricTarget(metric=metric, value=value) for metric, value in wanted if value is not None]
    if not targets:
        raise InvalidDeployment("a deployment needs at least one target", "$.targets")
    return Deployment(
        name=name,
        min_replicas=body.min_replicas,
        max_replicas=body.max_replicas,
        shape=shape_of(body),
        targets=targets,
        cold_start_s=body.cold_start_s,
        scale_to_zero=body.scale_to_zero,
        idle_window_s=body.idle_window_s,
        cold_start_budget_s=body.cold_start_budget_s,
    )


def policy_of(body: DeploymentBody) -> PolicyConfig:
    if body.policy not in POLICIES:  # the Literal admits only registered names; a guard against drift
        raise InvalidDeployment(f"unknown policy {body.policy!r}", "$.policy")
    return PolicyConfig(name=body.policy, reactive=body.reactive, predictive=body.predictive)


def sample_of(ev: DeploymentMetricsReported) -> MetricSample:
    """The core's sample of a metrics event (latency in seconds there, milliseconds on the bus)."""
    return MetricSample(
        at=ev.occurred_at,
        requests_per_s=ev.requests_per_s,
        queue_length=ev.queue_length,
        gpu_utilization=ev.gpu_utilization,
        p99_latency_s=None if ev.p99_latency_ms is None else ev.p99_latency_ms / 1000.0,
    )


def replica_job_id(deployment: str, number: int) -> str:
    return f"{deployment}-r{number}"


def replica_job(record: DeploymentRecord, default_runtime_s: float) -> JobSpec:
    """What the scheduler runs for one replica: the replica's GPU shape, the deployment's tenant, queue
    and priority. On one host a multi-GPU replica stays within that node's NVLink domain; a replica on
    several hosts is a gang whose hosts must all hang off one leaf switch (topology `required` at level
    1), so its tensor-parallel traffic never crosses the spine, and which restarts whole when a member
    fails (a tensor-parallel model cannot lose a shard)."""
    body = record.body
    shape = shape_of(body)
    topology: TopologyConstraint = "preferred"
    if shape.hosts > 1:
        request = ResourceRequest(kind="gang", gpus_per_host=shape.gpus, hosts=shape.hosts)
        topology = "required"
    elif shape.gpus:
        request = ResourceRequest(kind="whole", gpus_per_host=shape.gpus)
    else:
        request = ResourceRequest(
            kind="fraction", gpus_per_host=1, milli=shape.gpu_milli, memory_mib=shape.memory_mib or None
        )
    return JobSpec(
        name=f"{record.name} replica",
        tenant=body.tenant,
        queue=body.queue,
        priority=body.priority,
        request=request,
        workload=body.workload or WorkloadSpec(simulated_runtime_s=default_runtime_s),
        topology=topology,
        topology_level=1,
        on_member_failure="restart",
    )


def decision_messages(
    record: DeploymentRecord,
    reply: ScalingReply,
    current: int,
    new_job_ids: list[str],
    source: str,
    default_runtime_s: float,
) -> list[Message]:
    """The commands and event one decision sends: a SubmitJob per new replica, a CancelJob per removed
    one, and ScaleDecided when the replica count changes."""
    assert len(new_job_ids) == reply.add, "one job id per replica added"
    out: list[Message] = []
    if reply.desired_replicas != current:
        out.append(
            ScaleDecided(
                source=source,
                key=record.name,
                deployment=record.name,
                current_replicas=current,
                target_replicas=reply.desired_replicas,
                reason=reply.reason,
            )
        )
    spec = replica_job(record, default_runtime_s) if new_job_ids else None
    for job_id in new_job_ids:
        assert spec is not None
        out.append(SubmitJob(source=source, key=job_id, job_id=job_id, spec=spec))
    for job_id in reply.remove:
        out.append(CancelJob(source=source, key=job_id, job_id=job_id, reason=f"scaled down: {reply.reason}"))
    return out


class ReplicaCounts(msgspec.Struct, frozen=True, kw_only=True):
    # The last decision's target (the current count before any decision).
    wanted: int
    starting: int
    ready: int


class DeploymentView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    spec: DeploymentBody
    replicas: ReplicaCounts
    replica_jobs: list[ReplicaRecord]
    last_decision: Decision | None
    created_at: dt.datetime
    updated_at: dt.datetime


def deployment_view(record: DeploymentRecord, replicas: list[ReplicaRecord]) -> DeploymentView:
    starting = sum(1 for r in replicas if r.state == "starting")
    return DeploymentView(
        name=record.name,
        spec=record.body,
        replicas=ReplicaCounts(
            wanted=record.last.desired if record.last is not None else len(replicas),
            starting=starting,
            ready=len(replicas) - starting,
        ),
        replica_jobs=replicas,
        last_decision=record.last,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )
