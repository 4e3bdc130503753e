"""Job domain: the life of a job from submission to exit."""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from .message import Command, Event, Timestamp
from .pool import GpuAssignment, MemberFailure, ResourceRequest, WorkloadSpec

ExitReason = Literal["completed", "failed", "oom", "xid", "signal", "revoked", "lost"]
TopologyConstraint = Literal["required", "preferred"]
# How a job's life ended: its work ended (completed/failed), it was cancelled, or it overran its limit.
FinalState = Literal["completed", "failed", "cancelled", "killed"]


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    tenant: str
    queue: str = "default"
    priority: int = 0
    request: ResourceRequest
    runtime_limit_s: float | None = None
    workload: WorkloadSpec | None = None
    # A gang's span on the fabric: "required" never spans more leaf groups than the minimum at
    # `topology_level` (1 = leaf), "preferred" may after waiting long enough.
    topology: TopologyConstraint = "preferred"
    topology_level: int = 1
    # The data set the job reads (placement prefers nodes that hold it).
    dataset: str | None = None
    # A gang's answer to a failed member: "restart" the whole gang, or "replace" the failed member
    # only (elastic or hot-spare-capable multi-node jobs; see ibpool_proto.pool.MemberFailure).
    on_member_failure: MemberFailure = "restart"
    # Sites (clusters) the job may run at, most preferred first; empty: anywhere. The scheduler
    # picks one by estimated start and data locality (a node's site is its `ibpool.io/site` label).
    sites: list[str] = []


class SubmitJob(Command, frozen=True, kw_only=True, tag="io.ibpool.job.job.submit.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "Submit a job to the scheduler."

    job_id: str
    spec: JobSpec


class CancelJob(Command, frozen=True, kw_only=True, tag="io.ibpool.job.job.cancel.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "Cancel a queued or running job."

    job_id: str
    reason: str = "cancelled by user"


class JobStarted(Event, frozen=True, kw_only=True, tag="io.ibpool.job.job.started.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "A node agent started the workload of an allocation."

    job_id: str
    allocation_id: str
    node_id: str
    launcher: str
    pid: int | None = None


class JobExited(Event, frozen=True, kw_only=True, tag="io.ibpool.job.job.exited.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "The workload of an allocation ended, with its exit code and why."

    job_id: str
    allocation_id: str
    node_id: str
    exit_code: int
    reason: ExitReason
    detail: str = ""
    runtime_s: float = 0.0


class JobStartedV2(JobStarted, frozen=True, kw_only=True, tag="io.ibpool.job.job.started.v2"):
    """JobStarted keyed by the node, not the job: a node agent allowed only its own nodes' subjects
    (a NATS user per agent) can report only its own nodes' work. What agents publish since v2; v1
    is still read."""

    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "A node agent started the workload of an allocation (keyed by node)."

    schema_version: int = 2


class JobExitedV2(JobExited, frozen=True, kw_only=True, tag="io.ibpool.job.job.exited.v2"):
    """JobExited keyed by the node, not the job (see JobStartedV2)."""

    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "The workload of an allocation ended, with its exit code and why (keyed by node)."

    schema_version: int = 2


class JobQueued(Event, frozen=True, kw_only=True, tag="io.ibpool.job.job.queued.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "The scheduler accepted a job into one of its queues (again, after a requeue)."

    job_id: str
    tenant: str
    queue: str
    priority: int = 0
    gpus: int = 0
    hosts: int = 1
    # 0 on first submission; the number of times the job went back to its queue otherwise.
    attempt: int = 0


class JobScheduled(Event, frozen=True, kw_only=True, tag="io.ibpool.job.job.scheduled.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "The allocator granted the scheduler's placement of a job; it starts on these nodes."

    job_id: str
    allocation_id: str
    tenant: str
    queue: str
    nodes: list[str]
    assignments: list[GpuAssignment] = []
    # Seconds from (re)queueing to the grant.
    waited_s: float = 0.0
    attempt: int = 0
    # The scheduler's leadership term that proposed it.
    scheduler_term: int | None = None


class JobPreempted(Event, frozen=True, kw_only=True, tag="io.ibpool.job.job.preempted.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = (
        "The scheduler took a running job's GPUs for a more deserving one (checkpoint notice); it is requeued."
    )

    job_id: str
    allocation_id: str
    for_job_id: str
    reason: str = ""


class JobRequeued(Event, frozen=True, kw_only=True, tag="io.ibpool.job.job.requeued.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = (
        "A job lost its allocation (hardware failure, revocation, preemption) and waits again, keeping its place."
    )

    job_id: str
    allocation_id: str
    reason: str
    # How many times the job went back to its queue, this time included.
    attempt: int = 1
    # It is not placed again before this time.
    not_before: Timestamp | None = None


class JobFinished(Event, frozen=True, kw_only=True, tag="io.ibpool.job.job.finished.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "A job left the scheduler for good: completed, failed, cancelled or killed at its limit."

    job_id: str
    state: FinalState
    reason: str = ""
    allocation_id: str | None = None
    exit_code: int | None = None
    runtime_s: float = 0.0
    attempt: int = 0
