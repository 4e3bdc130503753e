"""A job as the scheduler keeps it (one row of `jobs`), and the transitions of its life. Pure data.

    queued -> proposed -> scheduled -> running -> completed | failed | killed
       ^         |            |           |
       +---------+------------+-----------+   (rejected; revoked, lease expired, requeue requested, preempted)
    any live state -> cancelled

A transition returns a new record; the caller writes it and the events the handler publishes.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Literal

import msgspec

from ibpool_core.sched.sharp import SharpTree
from ibpool_core.sched.waits import WaitCode
from ibpool_proto.job import FinalState, JobSpec, TopologyConstraint
from ibpool_proto.pool import GpuAssignment, MemberFailure, WorkloadSpec

JobState = Literal["queued", "proposed", "scheduled", "running", "completed", "failed", "cancelled", "killed"]
LIVE: tuple[JobState, ...] = ("queued", "proposed", "scheduled", "running")
HOLDING: tuple[JobState, ...] = ("scheduled", "running")


class JobPlacement(msgspec.Struct, frozen=True, kw_only=True):
    """Where the scheduler placed a job and how: `ranks`, its nodes in rank order (`ranks[i]` is
    rank i's node: ring and tree neighbours close on the fabric; see `ibpool_core.sched.rank_order`), whether SHARP
    (in-network reduction) is on for it, and why or why not (`ibpool_core.sched.sharp`);
    `nccl_env`: what the proposal added to the workload's environment to turn it on;
    `fabric_version`: the published topology version it was decided on (None: the node labels);
    `tier`: the tier of the smallest switch group holding its hosts (1 = one leaf group, 2 = one
    spine group, ...; None for a single host); `sharp_tree`: the SHARP trees it holds while it
    lives (`ibpool_core.sched.sharp.SharpTrees`)."""

    ranks: list[str] = []
    sharp: bool = False
    sharp_reason: str = ""
    nccl_env: dict[str, str] = {}
    fabric_version: int | None = None
    tier: int | None = None
    sharp_tree: SharpTree | None = None


class RuntimePrediction(msgspec.Struct, frozen=True, kw_only=True):
    """The learned runtime quantiles of a job (seconds) and the model version that gave them
    (0: no model trained yet, the per-tenant median of finished jobs answered)."""

    p50_s: float
    p90_s: float
    model_version: int = 0


class HeldSpan(msgspec.Struct, frozen=True, array_like=True):
    """An earlier attempt's allocation: granted at `start`, lost (requeued) at `end`."""

    start: dt.datetime
    end: dt.datetime


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the scheduler knows of one job.

    `gpus_per_host` x `hosts` whole GPUs, or with `milli` < 1000 one share of one GPU, or with
    `mig_profile` one MIG instance of that profile (on a GPU the scheduler counts as taken). `submitted_at`
    never changes (a requeued job keeps its place); `queued_at` is when it last entered the queue.
    `reason` says why it waits (from the last cycle that examined it) or how it ended.
    `proposal_id`/`proposal`: the placement in flight (also the allocation id if granted).
    `placement`: the proposed (then granted) placement's rank order and SHARP decision; kept when
    the job ends, cleared when it goes back to the queue.
    """

    job_id: str
    name: str = ""
    tenant: str
    queue: str
    priority: int = 0
    gpus_per_host: int = 1
    hosts: int = 1
    milli: int = 1000
    memory_mib: int | None = None
    mig_profile: str | None = None
    topology: TopologyConstraint = "preferred"
    topology_level: int = 1
    dataset: str | None = None
    gpu_model: str | None = None
    # The sites it may run at (empty: anywhere), the one chosen for it and why (`plan.plan_sites`).
    sites: list[str] = []
    site: str | None = None
    site_reason: str = ""
    time_limit_s: float | None = None
    workload: WorkloadSpec | None = None
    submitted_at: dt.datetime
    queued_at: dt.datetime
    state: JobState = "queued"
    attempt: int = 0
    not_before: dt.datetime | None = None
    # The node a failure took its last allocation from (RequeueRequested, AllocationRevoked): not
    # placed there again until `avoid_until`. The release of that allocation may reach the pool
    # allocator before the node's failure does, and free the dead node's GPUs meanwhile.
    avoid: list[str] = []
    avoid_until: dt.datetime | None = None
    reason: str = ""
    # Why it waits, typed (`ibpool_core.sched.waits.WaitCode`; `reason` is its words); None: not waiting.
    wait_code: WaitCode | None = None
    proposal_id: str | None = None
    proposal: list[GpuAssignment] = []
    proposal_term: int | None = None
    allocation_id: str | None = None
    nodes: list[str] = []
    assignments: list[GpuAssignment] = []
    scheduled_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    exited_nodes: list[str] = []
    finished_at: dt.datetime | None = None
    exit_code: int | None = None
    runtime_s: float = 0.0
    rejections: int = 0
    # A gang's answer to a failed member (see members.py): with "replace", `replacing` is the member
    # lost and not replaced yet, `replace_id`/`replace_proposal` the ReplaceGangMember in flight for it,
    # `replacements` how many members were replaced in this allocation's life.
    on_member_failure: MemberFailure = "restart"
    replacing: str | None = None
    replace_id: str | None = None
    replace_proposal: list[GpuAssignment] = []
    replace_retries: int = 0
    replacements: int = 0
    predicted: RuntimePrediction | None = None
    placement: JobPlacement | None = None
    # The allocations its earlier attempts held (grant to requeue), oldest first: what accounting
    # (`ibpool_core.sched.usage`) charges beside the current attempt's `scheduled_at` to its end.
    held: list[HeldSpan] = []

    @property
    def gpus(self) -> int:
        """Whole GPUs the job holds (a fraction holds one GPU's share, counted as one)."""
        return self.gpus_per_host * self.hosts

    @property
    def live(self) -> bool:
        return self.state in LIVE

    @property
    def holding(self) -> bool:
        return self.state in HOLDING

    @property
    def member_to_replace(self) -> bool:
        """Held, with a member lost (`replacing`) and no replacement proposed for it yet."""
        return self.state in HOLDING and self.replacing is not None and self.replace_id is None


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_ENV_BYTES = 64 * 1024


# What a submission asks, field by field: two submissions under one job id are the same job only
# when these agree (the job's state, times and placement are not asked for).
SPEC_FIELDS = (
    "name",
    "tenant",
    "queue",
    "priority",
    "gpus_per_host",
    "hosts",
    "milli",
    "memory_mib",
    "topology",
    "topology_level",
    "dataset",
    "gpu_model",
    "sites",
    "time_limit_s",
    "workload",
    "on_member_failure",
)


def spec_differences(stored: JobRecord, asked: JobRecord) -> list[str]:
    """The fields of `asked` (a new submission's record) that differ from the job stored under the
    same id, as `field: stored -> asked`; empty when it is the same submission again."""
    out = []
    for name in SPEC_FIELDS:
        a, b = getattr(stored, name), getattr(asked, name)
        if a != b:
            out.append(f"{name}: {msgspec.json.encode(a).decode()} -> {msgspec.json.encode(b).decode()}")
    return out


def env_problem(env: dict[str, str]) -> tuple[str, str] | None:
    """(the variable, what is wrong) for an environment no process could be started with, else None:
    names are letters, digits and `_` (not starting with a digit), values hold no NUL byte, and all of
    it fits in 64 KiB."""
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            return name, f"environment variable name {name!r}: letters, digits and _ only, not starting with a digit"
        if "\0" in value:
            return name, f"environment variable {name}: its value holds a NUL byte"
    if sum(len(k) + len(v) + 2 for k, v in env.items()) > MAX_ENV_BYTES:
        return "", f"the environment is over {MAX_ENV_BYTES // 1024} KiB"
    return None


def workload_with_env(workload: WorkloadSpec | None, env: dict[str, str]) -> WorkloadSpec | None:
    """The job's workload as proposed: `env` (the placement's NCCL/SHARP settings) added to its
    environment; a variable the job set itself keeps its value (a job may turn CollNet off)."""
    if not env:
        return workload
    if workload is None:
        return WorkloadSpec(env=dict(env))
    return msgspec.structs.replace(workload, env={**env, **workload.env})


def proposed(
    job: JobRecord,
    proposal_id: str,
    assignments: list[GpuAssignment],
    term: int | None,
    placement: JobPlacement | None = None,
) -> JobRecord:
    return msgspec.structs.replace(
        job,
        state="proposed",
        proposal_id=proposal_id,
        proposal=assignments,
        proposal_term=term,
        reason="",
        wait_code=None,
        placement=placement,
    )


def rejected(job: JobRecord, why: str, not_before: dt.datetime | None) -> JobRecord:
    """Back to the queue (its place kept) after the allocator refused the proposal."""
    return msgspec.structs.replace(
        job,
        state="queued",
        proposal_id=None,
        proposal=[],
        proposal_term=None,
        reason=why,
        not_before=not_before,
        rejections=job.rejections + 1,
        placement=None,
    )


def avoided(job: JobRecord, now: dt.datetime) -> frozenset[str]:
    """The nodes `job` is not to be placed on at `now` (see `JobRecord.avoid`)."""
    if not job.avoid or job.avoid_until is None or job.avoid_until <= now:
        return frozenset()
    return frozenset(job.avoid)


def granted(job: JobRecord, allocation_id: str, nodes: list[str], at: dt.datetime) -> JobRecord:
    return msgspec.structs.replace(
        job,
        state="scheduled",
        avoid=[],
        avoid_until=None,
        allocation_id=allocation_id,
        nodes=nodes,
        assignments=job.proposal,
        scheduled_at=at,
        exited_nodes=[],
        reason="",
    )


def requeued(
    job: JobRecord,
    why: str,
    at: dt.datetime,
    not_before: dt.datetime | None,
    avoid: tuple[str, dt.datetime] | None = None,
) -> JobRecord:
    """Its allocation is gone (failure, lost lease, preemption): waiting again, in its old place.
    `avoid`: (the node a failure took it from, until when it is not placed there again)."""
    held = [*job.held, HeldSpan(start=job.scheduled_at, end=at)] if job.scheduled_at is not None else job.held
    return msgspec.structs.replace(
        job,
        state="queued",
        attempt=job.attempt + 1,
        held=held,
        queued_at=at,
        not_before=not_before,
        avoid=[avoid[0]] if avoid is not None else [],
        avoid_until=avoid[1] if avoid is not None else None,
        reason=why,
        proposal_id=None,
        proposal=[],
        proposal_term=None,
        allocation_id=None,
        nodes=[],
        assignments=[],
        scheduled_at=None,
        started_at=None,
        exited_nodes=[],
        placement=None,
        replacing=None,
        replace_id=None,
        replace_proposal=[],
        replace_retries=0,
        replacements=0,
    )


def finished(
    job: JobRecord, state: FinalState, why: str, at: dt.datetime, exit_code: int | None = None, runtime_s: float = 0.0
) -> JobRecord:
    return msgspec.structs.replace(
        job, state=state, reason=why, finished_at=at, exit_code=exit_code, runtime_s=runtime_s, proposal=[]
    )


def record_from_spec(job_id: str, spec: JobSpec, now: dt.datetime) -> JobRecord | str:
    """The new job's record, or what is wrong with the spec."""
    r = spec.request
    if r.kind == "remote":
        return "request kind 'remote' is not scheduled here; ask the pool allocator"
    if (r.kind == "mig") != (r.mig_profile is not None):
        return "a MIG request is kind 'mig' with its mig_profile"
    if r.mig_profile is not None and (r.hosts != 1 or r.gpus_per_host != 1 or r.milli != 1000):
        return "a MIG request is one instance of one GPU on one host"
    if r.hosts < 1 or r.gpus_per_host < 1 or not 1 <= r.milli <= 1000:
        return "request needs hosts >= 1, gpus (per host) >= 1 and milli in 1..1000"
    if r.milli < 1000 and (r.gpus_per_host != 1 or r.hosts != 1):
        return "a fraction is one share of one GPU on one host"
    if spec.on_member_failure == "replace" and r.hosts < 2:
        return "on_member_failure 'replace' is for multi-host jobs (hosts >= 2); a single-host job restarts"
    if spec.workload is not None and (bad := env_problem(spec.workload.env)) is not None:
        return bad[1]
    if len(set(spec.sites)) != len(spec.sites) or not all(spec.sites):
        return f"sites must be distinct, non-empty names, got {spec.sites}"
    return JobRecord(
        job_id=job_id,
        name=spec.name,
        tenant=spec.tenant,
        queue=spec.queue,
        priority=spec.priority,
        gpus_per_host=r.gpus_per_host,
        hosts=r.hosts,
        milli=r.milli,
        memory_mib=r.memory_mib,
        mig_profile=r.mig_profile,
        topology=spec.topology,
        topology_level=spec.topology_level,
        dataset=spec.dataset,
        gpu_model=r.gpu_model,
        sites=list(spec.sites),
        time_limit_s=spec.runtime_limit_s,
        workload=spec.workload,
        submitted_at=now,
        queued_at=now,
        on_member_failure=spec.on_member_failure,
    )
