"""Pool domain: the GPU ledger's commands and the allocation events others subscribe to."""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from .message import Command, Event, Timestamp

AllocationKind = Literal["whole", "fraction", "mig", "gang", "remote"]
QuotaScope = Literal["tenant", "queue"]
RejectReason = Literal["stale", "conflict", "over_quota", "node_not_ready", "would_exceed_capacity", "invalid"]
# What a gang's allocation does when one member's node or GPU fails: "restart" revokes every member
# (the job is requeued whole); "replace" revokes the failed member only, and the scheduler asks for a
# new host in its place (`ReplaceGangMember`), the other members running on.
MemberFailure = Literal["restart", "replace"]


class GpuAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU (or a share of it) on one node. `milli` 1000 is the whole GPU."""

    node_id: str
    gpu_index: int
    milli: int = 1000
    memory_mib: int | None = None
    mig_profile: str | None = None


class ResourceRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What an allocation asks for: `hosts` hosts with `gpus` whole GPUs on each host (a gang when
    `hosts` > 1), or with `milli` < 1000 one share of one GPU (`memory_mib` of its memory) or a MIG
    slice (`mig_profile`); `gpu_model` null = any model. The job's GPUs are hosts x gpus. `gpus` is
    per host: in code it is `gpus_per_host`, as everywhere in ibpool; the wire keeps the name of the
    released v1 contract."""

    kind: AllocationKind
    gpus_per_host: int = msgspec.field(default=1, name="gpus")
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
    """What to run under the grant: a command for the process launcher, or a simulated duration.

    `env`: environment the scheduler asks for every member of the workload (e.g. NCCL's CollNet /
    SHARP settings when the placement is under a SHARP-capable subtree). The node agent adds it to
    the process's environment; the grant's enforcement variables and the rank variables it derives
    from `AllocationGranted.nodes` take precedence over it.
    """

    command: list[str] = []
    simulated_runtime_s: float | None = None
    simulated_memory_mib: int | None = None
    env: dict[str, str] = {}


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
    # For remote use: the host the client runs on (the grant records the fabric distance to it).
    client_node_id: str | None = None
    # Host CPU and memory held on each node of the assignment, beside its GPUs.
    cpu_milli: int = 0
    host_memory_mib: int = 0
    # Fencing: the proposer's leadership term within its scheduler group. The allocator refuses
    # (`stale`) a proposal whose term is below the highest it granted for that group.
    scheduler_group: str = ""
    fencing_term: int | None = None
    # A gang's declaration (see MemberFailure); kept by the allocation.
    on_member_failure: MemberFailure = "restart"


class PlacementItem(msgspec.Struct, frozen=True, kw_only=True):
    """One placement of a `ProposePlacements` batch: the fields of a `ProposePlacement` of its own.
    `id` is that proposal's id (the allocation id when granted; the answer's `command_id`)."""

    id: str
    job_id: str
    tenant: str
    queue: str
    assignments: list[GpuAssignment]
    lease_s: float = 300.0
    workload: WorkloadSpec | None = None
    client_node_id: str | None = None
    cpu_milli: int = 0
    host_memory_mib: int = 0
    on_member_failure: MemberFailure = "restart"


class ProposePlacements(Command, frozen=True, kw_only=True, tag="io.ibpool.pool.placements.propose.v1"):
    key_name: ClassVar[str] = "scheduler_group"
    summary: ClassVar[str] = (
        "A scheduler proposes many exact assignments at once (one cycle's), all computed on one ledger version."
    )

    ledger_version: int
    placements: list[PlacementItem]
    # Fencing, for the whole batch: see ProposePlacement.
    scheduler_group: str = ""
    fencing_term: int | None = None

    def proposals(self) -> list[ProposePlacement]:
        """The batch as single proposals, in order: each is decided and answered as if sent alone
        (its own id, so a repeated batch gets the same answers again)."""
        return [
            ProposePlacement(
                id=p.id,
                source=self.source,
                occurred_at=self.occurred_at,
                key=p.job_id,
                job_id=p.job_id,
                tenant=p.tenant,
                queue=p.queue,
                ledger_version=self.ledger_version,
                assignments=p.assignments,
                lease_s=p.lease_s,
                workload=p.workload,
                client_node_id=p.client_node_id,
                cpu_milli=p.cpu_milli,
                host_memory_mib=p.host_memory_mib,
                scheduler_group=self.scheduler_group,
                fencing_term=self.fencing_term,
                on_member_failure=p.on_member_failure,
            )
            for p in self.placements
        ]


class ReplaceGangMember(Command, frozen=True, kw_only=True, tag="io.ibpool.pool.member.replace.v1"):
    key_name: ClassVar[str] = "allocation_id"
    summary: ClassVar[str] = (
        "A scheduler replaces the failed member of a gang that declared `replace`: the failed node's share"
        " of the allocation is revoked and a new host granted into the same allocation, at the same rank."
    )

    allocation_id: str
    job_id: str
    # The member to replace: its share is revoked if the allocator has not revoked it already.
    failed_node_id: str
    # The new host's GPUs (one node, whole GPUs, as many as each member holds), computed on `ledger_version`.
    assignments: list[GpuAssignment]
    ledger_version: int
    # What the new member runs (the allocation's other members run it already).
    workload: WorkloadSpec | None = None
    reason: str = ""
    # Fencing: see ProposePlacement.
    scheduler_group: str = ""
    fencing_term: int | None = None


class RequestAllocation(Command, frozen=True, kw_only=True, tag="io.ibpool.pool.allocation.request.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = "Ask the allocator to place a request itself with its packing policy."

    job_id: str
    tenant: str
    queue: str
    request: ResourceRequest
    lease_s: float = 300.0
    workload: WorkloadSpec | None = None
    client_node_id: str | None = None
    cpu_milli: int = 0
    host_memory_mib: int = 0
    # A job holds one live allocation; true asks for another one beside it (e.g. an inference
    # service's second replica under the same job id).
    additional: bool = False


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
    queue: str = ""
    # The ProposePlacement / RequestAllocation this grant answers (also the allocation id).
    command_id: str = ""
    # Every node of the allocation (a gang has one grant per node), in RANK ORDER: the order of the
    # proposal's assignments (the scheduler orders a gang so ring/tree neighbours are close on the
    # fabric); node i is rank i, the first is the rendezvous host.
    nodes: list[str] = []
    cpu_milli: int = 0
    host_memory_mib: int = 0
    # Remote use: the client's host, the serving endpoint and the fabric hops between them.
    client_node_id: str | None = None
    endpoint: str | None = None
    hops: int | None = None
    # The fencing term of the proposal granted, and its scheduler group (see ProposePlacement).
    scheduler_group: str = ""
    fencing_term: int | None = None
    # The gang's declaration (see MemberFailure).
    on_member_failure: MemberFailure = "restart"
    # Set on the grant of a replaced gang member: the node it replaces (its rank in `nodes` is the
    # replaced one's); `command_id` is then the ReplaceGangMember's id.
    replaces: str | None = None


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


class LeaseRenewed(Event, frozen=True, kw_only=True, tag="io.ibpool.pool.lease.renewed.v1"):
    key_name: ClassVar[str] = "allocation_id"
    summary: ClassVar[str] = "The holder of an allocation extended its lease."

    allocation_id: str
    job_id: str
    lease_expires_at: Timestamp
    ledger_version: int
    command_id: str = ""


class PoolGpu(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_capable: bool = False
    nvlink_domain: str | None = None
    failed: bool = False
    cordoned: bool = False


class PoolNodeUpdated(Event, frozen=True, kw_only=True, tag="io.ibpool.pool.node.updated.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = (
        "The allocator's record of a node changed: its inventory, or whether it is cordoned, draining or failed."
    )

    node_id: str
    ledger_version: int
    hostname: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: list[PoolGpu] = []
    labels: dict[str, str] = {}
    api_url: str | None = None
    failed: bool = False
    # `cordoned`: nothing new lands here. `leaf_cordoned`: the node's leaf has a degraded link, so no
    # new multi-node work lands here; single-node work still does. Each is lifted by its own scope.
    cordoned: bool = False
    leaf_cordoned: bool = False
    draining: bool = False
    removed: bool = False
    reason: str = ""


class Share(msgspec.Struct, frozen=True, kw_only=True):
    """An amount of GPU: compute in milli-GPU (1000 = one whole GPU) and memory in MiB."""

    milli: int = 0
    memory_mib: int = 0

    def __add__(self, other: Share) -> Share:
        return Share(milli=self.milli + other.milli, memory_mib=self.memory_mib + other.memory_mib)

    def __sub__(self, other: Share) -> Share:
        return Share(milli=self.milli - other.milli, memory_mib=self.memory_mib - other.memory_mib)

    @property
    def is_zero(self) -> bool:
        return self.milli == 0 and self.memory_mib == 0


class Quota(msgspec.Struct, frozen=True, kw_only=True):
    """What one tenant or queue may hold of one GPU model.

    borrowing_limit  how far past `nominal` it may go by borrowing from its cohort; None: as far
                     as the cohort lends (without a cohort it never goes past `nominal`)
    lending_limit    how much of its idle nominal share the cohort may borrow; None: all of it
    """

    scope: QuotaScope
    name: str
    gpu_model: str
    nominal: Share
    borrowing_limit: Share | None = None
    lending_limit: Share | None = None
    cohort: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.scope, self.name, self.gpu_model)

    @property
    def lendable(self) -> Share:
        if self.lending_limit is None:
            return self.nominal
        return Share(
            milli=min(self.lending_limit.milli, self.nominal.milli),
            memory_mib=min(self.lending_limit.memory_mib, self.nominal.memory_mib),
        )

    @property
    def limit(self) -> Share | None:
        """The most it can ever hold; None when only its cohort's lending bounds it."""
        if self.cohort is None:
            return self.nominal
        if self.borrowing_limit is None:
            return None
        return self.nominal + self.borrowing_limit


class SetQuota(Command, frozen=True, kw_only=True, tag="io.ibpool.pool.quota.set.v1"):
    key_name: ClassVar[str] = "name"
    summary: ClassVar[str] = "Set (or, with `remove`, remove) the quota of a tenant or a queue on one GPU model."

    quota: Quota
    # Remove the quota of `quota`'s scope, name and GPU model (its amounts are not read): no longer limited.
    remove: bool = False


class QuotaChanged(Event, frozen=True, kw_only=True, tag="io.ibpool.pool.quota.changed.v1"):
    key_name: ClassVar[str] = "name"
    summary: ClassVar[str] = "The quota of a tenant or a queue on one GPU model was set, or removed."

    quota: Quota
    ledger_version: int
    command_id: str = ""
    # The quota of that scope, name and GPU model was removed: no longer limited.
    removed: bool = False
