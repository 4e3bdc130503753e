"""What the scheduling cycle reasons about: waiting jobs, running jobs and the free capacity. Pure data.

Hosts are dense indices 0..N-1 into `FreeCapacity`; callers keep the mapping to host names. Times are
seconds on the caller's clock (POSIX seconds in the service, trace seconds in the simulator).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .runtime import RuntimeEstimate

TopologyConstraint = Literal["required", "preferred"]


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """A job as the queue sees it.

    `gpus` is the whole job's GPU count; `hosts` the hosts its gang spans (1 = single host). The GPUs
    are spread evenly over the hosts (see `host_shares`). `priority` is the priority class, higher
    first. `attained_gpu_s` is the GPU-seconds of service the job already received in earlier runs
    (non-zero after a preemption); attained-service policies order by it. `true_runtime_s` is the
    remaining runtime known only to a simulator's oracle policies; real callers leave it None.
    `topology` and `topology_level`: a gang's hosts under one switch group of the fabric at that
    tier (1 = a leaf group, 2 = a spine group / scalable unit, 3 = core), as Kueue's topology-aware
    scheduling and Slurm's tree plugin define it: "required" never lands wider; "preferred" waits
    for the tightest tier the fabric could give it (its level, or the lowest tier whose largest
    group holds the gang) until it waited `CycleConfig.span_relax_after_s`, then takes the lowest
    tier that has room. (The `LeafPlacer`, which knows leaves only, reads both as the fewest leaves.)
    """

    id: str
    tenant: str
    gpus: int
    hosts: int = 1
    priority: int = 0
    submit_time: float
    time_limit_s: float | None = None
    requested_runtime_s: float | None = None
    predicted: RuntimeEstimate | None = None
    attained_gpu_s: float = 0.0
    true_runtime_s: float | None = None
    topology: TopologyConstraint = "preferred"
    topology_level: int = 1


def host_shares(job: Job) -> list[int]:
    """GPUs per host of the job's gang: `gpus` spread over `hosts` hosts, the larger shares first."""
    base, extra = divmod(job.gpus, job.hosts)
    return [base + 1] * extra + [base] * (job.hosts - extra)


def estimated_runtime(job: Job, safety_margin: float = 1.0) -> float:
    """The runtime a scheduler may plan with: the requested runtime, else p90 x margin, capped by the limit.

    With none of those known it is the time limit, and with no limit either, one hour times the margin.
    """
    if job.requested_runtime_s is not None:
        estimate = job.requested_runtime_s
    elif job.predicted is not None:
        estimate = job.predicted.p90 * safety_margin
    elif job.time_limit_s is not None:
        estimate = job.time_limit_s
    else:
        estimate = 3600.0 * safety_margin
    return min(estimate, job.time_limit_s) if job.time_limit_s is not None else estimate


class RunningJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job holding GPUs since `started_at`; `hosts` is (host index, GPUs) per gang member.

    `planned_end` is when the scheduler expects it to end (the `Start.planned_end` of the cycle that
    started it); backfill releases running jobs in that order.
    """

    job: Job
    hosts: tuple[tuple[int, int], ...]
    started_at: float
    planned_end: float


class FreeCapacity(msgspec.Struct, frozen=True, kw_only=True):
    """Free capacity per host, and which leaf switch each host hangs off.

    `free[h]` is the free GPUs of host h (0 for a host that is down); `capacity[h]` its GPU count;
    `leaf_of[h]` the index of its leaf switch. The three sequences have one entry per host.
    The scheduling cycle never mutates them: a caller may keep one list and update it in place
    between cycles (the simulator does), which keeps the view incremental.
    """

    free: list[int]
    capacity: list[int]
    leaf_of: list[int]


class QueueStats(msgspec.Struct, frozen=True, kw_only=True):
    """Live state a dynamic policy reads; the caller maintains it incrementally.

    `recent_wait_p90_s` is the 90th percentile of the queueing delay of recently started jobs.
    """

    queue_len: int = 0
    waiting_gpus: int = 0
    utilisation: float = 0.0
    oldest_wait_s: float = 0.0
    recent_wait_p90_s: float = 0.0
