"""Job domain: the life of a job from submission to exit."""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from .message import Command, Event
from .pool import ResourceRequest, WorkloadSpec

ExitReason = Literal["completed", "failed", "oom", "xid", "signal", "revoked", "lost"]


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    tenant: str
    queue: str = "default"
    priority: int = 0
    request: ResourceRequest
    runtime_limit_s: float | None = None
    workload: WorkloadSpec | None = None


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
