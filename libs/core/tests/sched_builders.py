"""Small builders for the scheduling-core tests: clusters of 8-GPU hosts in leaves, jobs, running jobs."""

from __future__ import annotations

from ibpool_core.sched.cycle import CycleConfig, SchedulingReply, SchedulingRequest, schedule
from ibpool_core.sched.jobs import FreeCapacity, Job, RunningJob
from ibpool_core.sched.queueing import QueuePolicy, make_policy
from ibpool_core.sched.runtime import RuntimeEstimate


def cluster(hosts: int, *, per_leaf: int = 4, gpus: int = 8, busy: dict[int, int] | None = None) -> FreeCapacity:
    busy = busy or {}
    return FreeCapacity(
        free=[gpus - busy.get(h, 0) for h in range(hosts)],
        capacity=[gpus] * hosts,
        leaf_of=[h // per_leaf for h in range(hosts)],
    )


def job(
    name: str,
    gpus: int = 1,
    *,
    submit: float = 0.0,
    p50: float | None = None,
    p90: float | None = None,
    true: float | None = None,
    priority: int = 0,
    tenant: str = "t",
    attained: float = 0.0,
    limit: float | None = None,
) -> Job:
    predicted = None
    if p50 is not None:
        predicted = RuntimeEstimate(p50=p50, p90=p90 if p90 is not None else p50)
    return Job(
        id=name,
        tenant=tenant,
        gpus=gpus,
        hosts=max(1, -(-gpus // 8)),
        priority=priority,
        submit_time=submit,
        predicted=predicted,
        true_runtime_s=true,
        attained_gpu_s=attained,
        time_limit_s=limit,
    )


def running(j: Job, hosts: list[tuple[int, int]], *, started: float = 0.0, end: float | None = None) -> RunningJob:
    return RunningJob(
        job=j, hosts=tuple(hosts), started_at=started, planned_end=end if end is not None else started + 3600
    )


def run_cycle(
    queue: list[Job],
    view: FreeCapacity,
    *,
    policy: str | QueuePolicy = "fifo",
    now: float = 100.0,
    running_jobs: list[RunningJob] | None = None,
    **config: object,
) -> SchedulingReply:
    pol = make_policy(policy) if isinstance(policy, str) else policy
    return schedule(
        SchedulingRequest(
            now=now,
            queue=queue,
            running=running_jobs or [],
            cluster=view,
            policy=pol,
            config=CycleConfig(hosts_per_leaf=4, **config),  # type: ignore[arg-type]
        )
    )


def started(reply: SchedulingReply) -> list[str]:
    return [s.job_id for s in reply.starts]
