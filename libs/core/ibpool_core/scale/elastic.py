"""Batch elasticity: elastic training jobs grown into idle GPUs, shrunk when more important work waits.

`decide_elasticity(ElasticityRequest) -> ElasticityReply`, pure. The request is the count of idle
GPUs, the elastic jobs (current, min and max workers, GPUs per worker, priority) and the waiting
work (GPUs asked, priority). Rules, in this order:

1. Waiting work, highest priority first (then in the order given): if the idle GPUs cover it, they
   are reserved for it. Otherwise elastic jobs of strictly lower priority give back workers, lowest
   priority first (then the job with the most workers above its minimum, then by id), never below
   their `min_workers`, until the shortfall is covered; the work then gets the idle GPUs plus the
   freed ones. If shrinking every such job could not cover it, nothing is shrunk for it (a partial
   gang cannot start, so freeing GPUs for it would only idle them) and it stays unmet.
2. Growth, highest priority first (then by id): a job gets whole workers from the GPUs still idle,
   up to its `max_workers`. A job never grows while work of its priority or higher is unmet (those
   GPUs are kept for that work), and a job shrunk in this decision does not grow back in it.

A job with equal priority never shrinks for waiting work: elasticity trades between priorities,
not within one (that is the queue's fair share).
"""

from __future__ import annotations

import math

import msgspec


class ElasticJob(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    workers: int
    min_workers: int
    max_workers: int
    gpus_per_worker: int = 1
    priority: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.workers <= self.max_workers or self.gpus_per_worker < 1:
            raise ValueError(f"{self.job_id}: need 1 <= min_workers <= workers <= max_workers, gpus_per_worker >= 1")


class WaitingWork(msgspec.Struct, frozen=True, kw_only=True):
    work_id: str
    gpus: int
    priority: int = 0


class ElasticityRequest(msgspec.Struct, frozen=True, kw_only=True):
    idle_gpus: int
    jobs: list[ElasticJob] = []
    waiting: list[WaitingWork] = []


class WorkerChange(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    workers_from: int
    workers_to: int
    reason: str

    @property
    def delta(self) -> int:
        return self.workers_to - self.workers_from


class ElasticityReply(msgspec.Struct, frozen=True, kw_only=True):
    changes: list[WorkerChange] = []
    # work id -> GPUs set aside for it (idle ones and those freed by shrinking)
    reserved: dict[str, int] = {}
    unmet: list[str] = []
    idle_left: int = 0


def decide_elasticity(request: ElasticityRequest) -> ElasticityReply:
    """Who grows and who shrinks; see the module docstring for the rules."""
    idle = request.idle_gpus
    jobs = {j.job_id: j for j in request.jobs}
    workers = {j.job_id: j.workers for j in request.jobs}
    shrink_for: dict[str, list[str]] = {}
    reserved: dict[str, int] = {}
    unmet: list[WaitingWork] = []

    order = sorted(enumerate(request.waiting), key=lambda iw: (-iw[1].priority, iw[0]))
    for _, work in order:
        if work.gpus <= idle:
            reserved[work.work_id] = work.gpus
            idle -= work.gpus
            continue
        shortfall = work.gpus - idle
        donors = sorted(
            (j for j in jobs.values() if j.priority < work.priority and workers[j.job_id] > j.min_workers),
            key=lambda j: (j.priority, -(workers[j.job_id] - j.min_workers) * j.gpus_per_worker, j.job_id),
        )
        plan: dict[str, int] = {}
        freed = 0
        for j in donors:
            if freed >= shortfall:
                break
            take = min(workers[j.job_id] - j.min_workers, math.ceil((shortfall - freed) / j.gpus_per_worker))
            plan[j.job_id] = take
            freed += take * j.gpus_per_worker
        if freed < shortfall:
            unmet.append(work)
            continue
        for job_id, take in plan.items():
            workers[job_id] -= take
            shrink_for.setdefault(job_id, []).append(work.work_id)
        reserved[work.work_id] = work.gpus
        idle = idle + freed - work.gpus

    top_unmet = max((w.priority for w in unmet), default=None)
    grown: set[str] = set()
    for j in sorted(jobs.values(), key=lambda j: (-j.priority, j.job_id)):
        if j.job_id in shrink_for or (top_unmet is not None and j.priority <= top_unmet):
            continue
        more = min(j.max_workers - workers[j.job_id], idle // j.gpus_per_worker)
        if more > 0:
            workers[j.job_id] += more
            idle -= more * j.gpus_per_worker
            grown.add(j.job_id)

    changes: list[WorkerChange] = []
    for j in request.jobs:
        if workers[j.job_id] == j.workers:
            continue
        if j.job_id in grown:
            reason = f"grown into {(workers[j.job_id] - j.workers) * j.gpus_per_worker} idle GPUs"
        else:
            reason = "shrunk for higher-priority " + ", ".join(shrink_for[j.job_id])
        changes.append(
            WorkerChange(job_id=j.job_id, workers_from=j.workers, workers_to=workers[j.job_id], reason=reason)
        )
    return ElasticityReply(changes=changes, reserved=reserved, unmet=[w.work_id for w in unmet], idle_left=idle)
