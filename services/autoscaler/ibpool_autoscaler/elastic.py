"""Batch elasticity, the autoscaler's glue: elastic training jobs as declared, their worker jobs, and one
round of `ibpool_core.scale.elastic.decide_elasticity` turned into the commands and events it sends.

An elastic training job is declared (PUT /v1/elastic-jobs/{name}) with its workers' bounds and shape,
and runs as worker jobs submitted to the scheduler, one per worker (job id `<name>-w<N>`, `gpus_per_worker`
whole GPUs on one host). Every round the leader plans all elastic jobs together (`plan_round`):

1. Bounds first: workers above `max_workers` are cancelled (newest first), missing ones up to
   `min_workers` are submitted (a job is never left below its minimum).
2. Idle GPUs are the pool's free whole GPUs (the ledger replica) minus those the job's own unplaced
   workers (submitted, holding nothing in the ledger yet) are about to take. If that is negative, the
   unplaced workers cannot all start: the newest of them are withdrawn (never below the minimum).
3. The core decides on those idle GPUs and the waiting work (jobs queued at the scheduler that hold
   nothing, the job's own workers excepted): a job grows into idle GPUs while nothing of its priority
   or higher waits, and is shrunk (newest workers cancelled first, never below its minimum) when
   higher-priority work waits that the idle GPUs do not cover.

No I/O here: all of it is tested without a bus or a database.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Literal

import msgspec

from ibpool_core.scale.elastic import ElasticityRequest, ElasticJob, WaitingWork, decide_elasticity
from ibpool_proto import Message
from ibpool_proto.job import CancelJob, JobSpec, SubmitJob
from ibpool_proto.pool import ResourceRequest, WorkloadSpec
from ibpool_proto.scale import ElasticJobResized

WorkerState = Literal["queued", "running"]


class ElasticJobBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """PUT /v1/elastic-jobs/{name}: the whole declaration (a PUT replaces it; its workers are kept and
    brought within the new bounds by the next round). A worker holds `gpus_per_worker` whole GPUs on one
    host; the job runs with `min_workers` to `max_workers` of them."""

    tenant: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    queue: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "default"
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    min_workers: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 1
    max_workers: Annotated[int, msgspec.Meta(ge=1, le=10_000)]
    gpus_per_worker: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # What a worker runs: a command for the process launcher; none: a long simulated workload.
    workload: WorkloadSpec | None = None


class InvalidElasticJob(Exception):
    """The body decodes but does not add up; `path` names the field."""

    def __init__(self, detail: str, path: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.path = path


def check_body(body: ElasticJobBody) -> None:
    if body.min_workers > body.max_workers:
        raise InvalidElasticJob(
            f"min_workers {body.min_workers} is above max_workers {body.max_workers}", "$.min_workers"
        )


class Resize(msgspec.Struct, frozen=True, kw_only=True):
    at: dt.datetime
    workers_from: int
    workers_to: int
    reason: str


class ElasticJobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One elastic training job as stored: what was PUT, and the last resize."""

    name: str
    body: ElasticJobBody
    created_at: dt.datetime
    updated_at: dt.datetime
    last: Resize | None = None


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A worker alive: its job submitted and neither finished nor cancelled by us. `queued` until the
    agent's JobStarted (again after a requeue), `running` after; `since` is when it entered that state."""

    job_id: str
    elastic_job: str
    state: WorkerState
    since: dt.datetime
    submitted_at: dt.datetime
    allocation_id: str | None = None
    nodes: list[str] = []
    # As a replica's (see ReplicaRecord): a worker is on one host today.
    hosts: int = 1
    started: list[str] = []


def worker_job_id(elastic_job: str, number: int) -> str:
    return f"{elastic_job}-w{number}"


def _number(job_id: str) -> int:
    m = re.search(r"-w(\d+)$", job_id)
    return int(m.group(1)) if m else 0


def oldest_first(workers: list[WorkerRecord]) -> list[WorkerRecord]:
    return sorted(workers, key=lambda w: (w.submitted_at, _number(w.job_id), w.job_id))


class Waiting(msgspec.Struct, frozen=True, kw_only=True):
    """A job queued at the scheduler (JobQueued, or requeued) and not scheduled since."""

    job_id: str
    gpus: int
    priority: int = 0


class JobPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What one round does to one elastic job: `add` new workers, cancel these ones."""

    name: str
    workers_from: int
    workers_to: int
    add: int
    cancel: list[str]
    reason: str


class RoundInput(msgspec.Struct, frozen=True, kw_only=True):
    jobs: list[ElasticJobRecord]
    # elastic job name -> its live workers
    workers: dict[str, list[WorkerRecord]]
    # the pool's free whole GPUs, and the jobs holding an allocation, from the ledger replica
    free_gpus: int
    placed: frozenset[str]
    waiting: list[Waiting]


def plan_round(inp: RoundInput) -> list[JobPlan]:
    """One elasticity round over every elastic job; see the module docstring for the steps."""
    kept: dict[str, list[WorkerRecord]] = {}
    adds: dict[str, int] = {}
    cancels: dict[str, list[str]] = {}
    reasons: dict[str, list[str]] = {}
    by_name = {j.name: j for j in inp.jobs}
    for job in inp.jobs:
        b = job.body
        workers = oldest_first(inp.workers.get(job.name, []))
        if len(workers) > b.max_workers:
            extra = workers[b.max_workers :]
            cancels[job.name] = [w.job_id for w in reversed(extra)]
            workers = workers[: b.max_workers]
            reasons.setdefault(job.name, []).append(f"down to max_workers {b.max_workers}")
        if len(workers) < b.min_workers:
            adds[job.name] = b.min_workers - len(workers)
            reasons.setdefault(job.name, []).append(f"up to min_workers {b.min_workers}")
        kept[job.name] = workers

    def count(name: str) -> int:
        return len(kept[name]) + adds.get(name, 0)

    def unplaced(name: str) -> list[WorkerRecord]:
        return [w for w in kept[name] if w.job_id not in inp.placed]

    # The job's own unplaced workers are about to take idle GPUs; new ones too.
    idle = inp.free_gpus - sum((len(unplaced(j.name)) + adds.get(j.name, 0)) * j.body.gpus_per_worker for j in inp.jobs)
    if idle < 0:
        for job in sorted(inp.jobs, key=lambda j: (j.body.priority, j.name)):
            withdrawn = 0
            for w in reversed(unplaced(job.name)):
                if idle >= 0 or count(job.name) <= job.body.min_workers:
                    break
                kept[job.name].remove(w)
                cancels.setdefault(job.name, []).append(w.job_id)
                idle += job.body.gpus_per_worker
                withdrawn += 1
            if withdrawn:
                why = f"{withdrawn} unplaced workers withdrawn: no idle GPUs for them"
                reasons.setdefault(job.name, []).append(why)

    own = {w.job_id for ws in inp.workers.values() for w in ws}
    request = ElasticityRequest(
        idle_gpus=max(0, idle),
        jobs=[
            ElasticJob(
                job_id=j.name,
                workers=count(j.name),
                min_workers=j.body.min_workers,
                max_workers=j.body.max_workers,
                gpus_per_worker=j.body.gpus_per_worker,
                priority=j.body.priority,
            )
            for j in inp.jobs
        ],
        waiting=[
            WaitingWork(work_id=w.job_id, gpus=w.gpus, priority=w.priority) for w in inp.waiting if w.job_id not in own
        ],
    )
    for change in decide_elasticity(request).changes:
        name = change.job_id
        if change.delta > 0:
            adds[name] = adds.get(name, 0) + change.delta
        else:
            # Newest first: the ones that have done the least work (and unplaced ones, which are newest).
            keep = len(kept[name]) + change.delta
            gone = [w.job_id for w in reversed(kept[name][keep:])]
            kept[name] = kept[name][:keep]
            cancels.setdefault(name, []).extend(gone)
        reasons.setdefault(name, []).append(change.reason)

    plans: list[JobPlan] = []
    for name in sorted(set(adds) | set(cancels)):
        before = len(inp.workers.get(name, []))
        after = len(kept[name]) + adds.get(name, 0)
        plans.append(
            JobPlan(
                name=name,
                workers_from=before,
                workers_to=after,
                add=adds.get(name, 0),
                cancel=cancels.get(name, []),
                reason="; ".join(reasons.get(name, [])),
            )
        )
        assert by_name[name].body.min_workers <= after <= by_name[name].body.max_workers, (name, after)
    return plans


def worker_job(record: ElasticJobRecord, default_runtime_s: float) -> JobSpec:
    """What the scheduler runs for one worker: `gpus_per_worker` whole GPUs on one host, the job's
    tenant, queue and priority."""
    b = record.body
    return JobSpec(
        name=f"{record.name} worker",
        tenant=b.tenant,
        queue=b.queue,
        priority=b.priority,
        request=ResourceRequest(kind="whole", gpus_per_host=b.gpus_per_worker),
        workload=b.workload or WorkloadSpec(simulated_runtime_s=default_runtime_s),
    )


def plan_messages(
    record: ElasticJobRecord, plan: JobPlan, new_job_ids: list[str], source: str, default_runtime_s: float
) -> list[Message]:
    """ElasticJobResized, then a SubmitJob per new worker and a CancelJob per removed one."""
    assert len(new_job_ids) == plan.add, "one job id per worker added"
    out: list[Message] = [
        ElasticJobResized(
            source=source,
            key=record.name,
            elastic_job=record.name,
            workers_from=plan.workers_from,
            workers_to=plan.workers_to,
            reason=plan.reason,
            submitted=new_job_ids,
            cancelled=plan.cancel,
        )
    ]
    spec = worker_job(record, default_runtime_s)
    out += [SubmitJob(source=source, key=i, job_id=i, spec=spec) for i in new_job_ids]
    out += [CancelJob(source=source, key=i, job_id=i, reason=f"elastic resize: {plan.reason}") for i in plan.cancel]
    return out


class WorkerCounts(msgspec.Struct, frozen=True, kw_only=True):
    queued: int
    running: int


class ElasticJobView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    spec: ElasticJobBody
    workers: WorkerCounts
    worker_jobs: list[WorkerRecord]
    last_resize: Resize | None
    created_at: dt.datetime
    updated_at: dt.datetime


def elastic_view(record: ElasticJobRecord, workers: list[WorkerRecord]) -> ElasticJobView:
    running = sum(1 for w in workers if w.state == "running")
    return ElasticJobView(
        name=record.name,
        spec=record.body,
        workers=WorkerCounts(queued=len(workers) - running, running=running),
        worker_jobs=oldest_first(workers),
        last_resize=record.last,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )
