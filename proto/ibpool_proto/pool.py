"""Pool domain: the GPU ledger's commands and the allocation events others subscribe to."""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from .message import Command, Event, Timestamp

AllocationKind = Literal["whole", "fraction", "mig", "gang", "remote"]
RejectReason = Literal["stale", "conflict", "over_quota", "node_not_ready", "would_exceed_capacity", "invalid"]


class GpuAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU (or a share of it) on one node. `milli` 1000 is the whole GPU."""

    node_id: str
    gpu_index: int
    milli: int = 1000
    memory_mib: int | None = None
    mig_profile: str | None = None


class ResourceRequest(msgspec.Struct, frozen=True, kw_only=True):
    kind: AllocationKind
    gpus: int = 1
    milli: int = 1000
    memory_mib: int | None = None
    mig_profile: str | None = None
    hosts: int = 1
    gpu_model: str | None = None


class Enforcement(msgspec.Struct, frozen=True, kw_only=True):
    """What the node agent applies so the holder cannot use more than it was granted."""

    env: dict[str, str] = {}
    visible_devices: list[str] = []
    memory_limit_mib: int | None = None
    mig_instances: list[str] = []


class WorkloadSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What to run under the grant: a command for the process launcher, or a simulated duration."""

    command: list[str] = []
    simulated_runtime_s: float | None = None
    simulated_memory_mib: int | None = None


class ProposePlacement(Command, frozen=True, kw_only=True, tag="io.ibpool.pool.placement.propose.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "A scheduler proposes an exact assignment computed on a given ledger version."

    job_id: str
    tenant: str
    queue: str
    ledger_version: int
    assignments: list[GpuAssignment]
    lease_s: float = 300.0
    workload: WorkloadSpec | None = None


class RequestAllocation(Command, frozen=True, kw_only=True, tag="io.ibpool.pool.allocation.request.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "Ask the allocator to place a request itself with its packing policy."

    job_id: str
    tenant: str
    queue: str
    request: ResourceRequest
    lease_s: float = 300.0
    workload: WorkloadSpec | None = None


class ReleaseAllocation(Command, frozen=True, kw_only=True, tag="io.ibpool.pool.allocation.release.v1"):
    key_name: ClassVar[str] = "allocation_id"
    summary: ClassVar[str] = "The holder gives an allocation back."

    allocation_id: str
    reason: str = "done"


class RenewLease(Command, frozen=True, kw_only=True, tag="io.ibpool.pool.lease.renew.v1"):
    key_name: ClassVar[str] = "allocation_id"
    summary: ClassVar[str] = "The holder extends the lease of an allocation."

    allocation_id: str
    holder: str
    extend_s: float = 300.0


class AllocationGranted(Event, frozen=True, kw_only=True, tag="io.ibpool.pool.allocation.granted.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "GPUs on one node were committed to a job; one event per node of a gang."

    allocation_id: str
    job_id: str
    node_id: str
    kind: AllocationKind
    assignments: list[GpuAssignment]
    enforcement: Enforcement
    lease_expires_at: Timestamp
    ledger_version: int
    tenant: str = ""
    workload: WorkloadSpec | None = None


class AllocationRejected(Event, frozen=True, kw_only=True, tag="io.ibpool.pool.allocation.rejected.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "A proposal or request was not committed, with the reason."

    command_id: str
    job_id: str
    reason: RejectReason
    detail: str = ""
    ledger_version: int = 0


class AllocationReleased(Event, frozen=True, kw_only=True, tag="io.ibpool.pool.allocation.released.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "An allocation was given back by its holder."

    allocation_id: str
    job_id: str
    node_id: str
    ledger_version: int
    reason: str = "done"


class AllocationRevoked(Event, frozen=True, kw_only=True, tag="io.ibpool.pool.allocation.revoked.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "An allocation was taken back (node failure, preemption) with the reason."

    allocation_id: str
    job_id: str
    node_id: str
    ledger_version: int
    reason: str


class AllocationExpired(Event, frozen=True, kw_only=True, tag="io.ibpool.pool.allocation.expired.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "A lease ran out without renewal and the allocation was released."

    allocation_id: str
    job_id: str
    node_id: str
    ledger_version: int
