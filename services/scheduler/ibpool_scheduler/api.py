"""The scheduler's HTTP API: submit, list, show (with why a job waits), cancel; the queues; the scheduler itself."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

import msgspec
from aiohttp import web

from ibpool_core.fabric.view import FabricAbout
from ibpool_core.pool.mig import MIG_PROFILES
from ibpool_core.sched.records import LIVE, JobPlacement, JobRecord, JobState, RuntimePrediction, env_problem
from ibpool_core.sched.usage import UsageKey, UsageReply, UsageRequest, usage
from ibpool_core.sched.waits import WaitCode
from ibpool_proto import new_id
from ibpool_proto.job import JobSpec, TopologyConstraint
from ibpool_proto.pool import GpuAssignment, MemberFailure, ResourceRequest, WorkloadSpec
from ibpool_runtime.http import BadBody, ErrorBody, SafeId, Unprocessable, documented, json_response, read_body

from . import state
from .predictor import ModelStatus, status_of
from .service import IdTaken, Scheduler

JobId = SafeId
# A dataset's name, as the registry stores it (a path segment here, so without "/").
DatasetName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]{1,512}$")]
# The longest time limit a job may name (a year): it becomes a planned end, a number far beyond any
# job's life is a mistake.
MAX_TIME_LIMIT_S = 365 * 86_400.0
_STATES = ("queued", "proposed", "scheduled", "running", "completed", "failed", "cancelled", "killed")


class TopologyBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`required`: a gang never spans more groups at `level` (1 = leaf) than it must; `preferred`:
    it may after waiting `span_relax_after_s`."""

    constraint: TopologyConstraint = "preferred"
    level: Annotated[int, msgspec.Meta(ge=1, le=3)] = 1


SiteName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class JobBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """POST /v1/jobs. Either `gpus` on one host (`hosts` 1), or `hosts` x `gpus_per_host` (a gang;
    `gpus`, the job's total, must be their product when given too), or `fraction` of one GPU, or
    one `mig` instance (a profile such as "1g.10gb")."""

    id: JobId | None = None
    name: Annotated[str, msgspec.Meta(max_length=256)] = ""
    tenant: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    queue: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "default"
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    gpus: Annotated[int, msgspec.Meta(ge=1, le=65_536)] | None = None
    hosts: Annotated[int, msgspec.Meta(ge=1, le=8192)] = 1
    gpus_per_host: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    fraction: Annotated[float, msgspec.Meta(gt=0.0, lt=1.0)] | None = None
    # One MIG instance of this profile (e.g. "1g.10gb"), on a GPU model that has it.
    mig: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    memory_mib: Annotated[int, msgspec.Meta(ge=1)] | None = None
    topology: TopologyBody = TopologyBody()
    dataset: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None
    gpu_model: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None
    time_limit_s: Annotated[float, msgspec.Meta(gt=0.0, le=MAX_TIME_LIMIT_S)] | None = None
    workload: WorkloadSpec | None = None
    # A gang's answer to a failed member: "restart" the gang, or "replace" only the failed member
    # (elastic or hot-spare-capable multi-node jobs); not for single-host jobs.
    on_member_failure: MemberFailure = "restart"
    # Sites the job may run at, most preferred first (a node's site: its `ibpool.io/site` label).
    sites: Annotated[list[SiteName], msgspec.Meta(max_length=16)] = []


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    name: str
    tenant: str
    queue: str
    state: JobState
    priority: int
    # The job's GPUs in all, on `hosts` hosts with `gpus_per_host` each.
    gpus: int
    hosts: int
    gpus_per_host: int
    milli: int
    # One MIG instance of this profile instead (null: whole GPUs or a share).
    mig_profile: str | None = None
    topology: TopologyConstraint
    # The fabric tier the gang's hosts must (required) or should (preferred) sit under: 1 = one leaf group.
    topology_level: int
    dataset: str | None
    time_limit_s: float | None
    # The sites it may run at; the one the scheduler chose (None: not yet, or it fits none) and why.
    sites: list[str]
    site: str | None
    site_reason: str
    submitted_at: dt.datetime
    attempt: int
    # Why it waits (the last cycle's explanation, or the allocator's last refusal) or how it ended.
    reason: str
    # Why it waits, typed: unschedulable, unresolvable, reservation, over_quota (null: not waiting).
    wait_code: WaitCode | None
    not_before: dt.datetime | None
    allocation_id: str | None
    # The nodes it was granted (node ids).
    nodes: list[str]
    assignments: list[GpuAssignment]
    scheduled_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    exit_code: int | None
    runtime_s: float
    # The learned runtime (p50/p90 s, model version; 0: the per-tenant median before any model) the
    # scheduling cycle planned with; null until a cycle has looked at the job or with prediction off.
    predicted_runtime: RuntimePrediction | None = None
    # Once placed: the hosts in rank order (host i is rank i), whether SHARP is on and why (not).
    placement: JobPlacement | None = None
    on_member_failure: MemberFailure = "restart"
    # Members replaced so far, and the member being replaced now (its node), if any.
    replacements: int = 0
    replacing: str | None = None


class QueueView(msgspec.Struct, frozen=True, kw_only=True):
    queue: str
    # The queue's own policy and backfill (`queue_policies`), else the scheduler's.
    policy: str = ""
    backfill: str = ""
    queued: int = 0
    proposed: int = 0
    scheduled: int = 0
    running: int = 0
    waiting_gpus: int = 0
    running_gpus: int = 0
    oldest_wait_s: float = 0.0


class QueuesView(msgspec.Struct, frozen=True, kw_only=True):
    policy: str
    backfill: str
    served: list[str]
    queues: list[QueueView]
    # tenant -> fair-share factor of the last cycle (1: used nothing, 0.5: used its share, towards 0 above).
    fairshare: dict[str, float] = {}


class DatasetBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """PUT /v1/datasets/{name}: the nodes holding a copy (replaces the stored list; empty removes it)."""

    nodes: list[Annotated[str, msgspec.Meta(min_length=1, max_length=256)]]


class SchedulerView(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    leader: bool
    term: int | None
    scheduler_group: str
    ledger_version: int
    ledger_caught_up: bool
    nodes: int
    cycles: int
    last_order: str | None
    # The published topology placement decides on (version, origin, hosts, tiers, SHARP switches);
    # null while none is known, or while it names none of the pool's nodes (the node labels are the
    # fabric then; `fabric_published` is what was published).
    fabric: FabricAbout | None = None
    fabric_published: FabricAbout | None = None
    # Links whose newest verdict is not "up".
    links_not_up: int = 0


def job_view(job: JobRecord) -> JobView:
    return JobView(
        job_id=job.job_id,
        name=job.name,
        tenant=job.tenant,
        queue=job.queue,
        state=job.state,
        priority=job.priority,
        gpus=job.gpus,
        hosts=job.hosts,
        gpus_per_host=job.gpus_per_host,
        milli=job.milli,
        mig_profile=job.mig_profile,
        topology=job.topology,
        topology_level=job.topology_level,
        dataset=job.dataset,
        time_limit_s=job.time_limit_s,
        sites=job.sites,
        site=job.site,
        site_reason=job.site_reason,
        submitted_at=job.submitted_at,
        attempt=job.attempt,
        reason=job.reason,
        wait_code=job.wait_code if job.state == "queued" else None,
        not_before=job.not_before,
        allocation_id=job.allocation_id,
        nodes=job.nodes,
        assignments=job.assignments,
        scheduled_at=job.scheduled_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        exit_code=job.exit_code,
        runtime_s=job.runtime_s,
        predicted_runtime=job.predicted,
        placement=job.placement,
        on_member_failure=job.on_member_failure,
        replacements=job.replacements,
        replacing=job.replacing,
    )


def spec_of(body: JobBody) -> JobSpec:
    """The JobSpec of a valid body; BadBody naming the field when the shape does not add up."""
    if body.workload is not None and (bad := env_problem(body.workload.env)) is not None:
        raise Unprocessable(bad[1], f"$.workload.env.{bad[0]}" if bad[0] else "$.workload.env")
    if body.mig is not None:
        if body.fraction is not None or body.hosts != 1 or (body.gpus or 1) != 1 or (body.gpus_per_host or 1) != 1:
            why = "a MIG instance is one slice of one GPU on one host (no fraction, gang or gpus)"
            raise Unprocessable(why, "$.mig")
        models = sorted(m for m, profiles in MIG_PROFILES.items() if body.mig in profiles)
        if not models or (body.gpu_model is not None and body.gpu_model not in models):
            known = sorted({p for profiles in MIG_PROFILES.values() for p in profiles})
            where = f" on {body.gpu_model}" if body.gpu_model is not None and models else ""
            raise Unprocessable(f"no GPU model has MIG profile {body.mig!r}{where}; known: {', '.join(known)}", "$.mig")
        request = ResourceRequest(kind="mig", gpus_per_host=1, mig_profile=body.mig, gpu_model=body.gpu_model)
    elif body.fraction is not None:
        if body.hosts != 1 or (body.gpus or 1) != 1 or (body.gpus_per_host or 1) != 1:
            raise Unprocessable("a fraction is a share of one GPU on one host", "$.fraction")
        request = ResourceRequest(
            kind="fraction",
            gpus_per_host=1,
            milli=max(1, round(body.fraction * 1000)),
            memory_mib=body.memory_mib,
            gpu_model=body.gpu_model,
        )
    elif body.hosts > 1:
        if body.gpus_per_host is None:
            if body.gpus is None or body.gpus % body.hosts:
                raise Unprocessable("a gang needs gpus_per_host (or gpus divisible by hosts)", "$.gpus_per_host")
            per_host = body.gpus // body.hosts
        else:
            per_host = body.gpus_per_host
            if body.gpus is not None and body.gpus != per_host * body.hosts:
                raise Unprocessable(
                    f"gpus {body.gpus} is not hosts x gpus_per_host = {per_host * body.hosts}", "$.gpus"
                )
        request = ResourceRequest(kind="gang", gpus_per_host=per_host, hosts=body.hosts, gpu_model=body.gpu_model)
    else:
        if body.gpus is not None and body.gpus_per_host is not None and body.gpus != body.gpus_per_host:
            raise Unprocessable("on one host, gpus and gpus_per_host must agree", "$.gpus")
        request = ResourceRequest(
            kind="whole", gpus_per_host=body.gpus or body.gpus_per_host or 1, gpu_model=body.gpu_model
        )
    if body.memory_mib is not None and body.fraction is None:
        raise Unprocessable("memory_mib goes with a fraction (whole GPUs come with all their memory)", "$.memory_mib")
    if body.on_member_failure == "replace" and request.kind != "gang":
        raise Unprocessable(
            "on_member_failure 'replace' is for multi-host jobs (hosts >= 2): a single-host job has no other"
            " member to keep running, it restarts",
            "$.on_member_failure",
        )
    return JobSpec(
        name=body.name,
        tenant=body.tenant,
        queue=body.queue,
        priority=body.priority,
        request=request,
        runtime_limit_s=body.time_limit_s,
        workload=body.workload,
        topology=body.topology.constraint,
        topology_level=body.topology.level,
        dataset=body.dataset,
        on_member_failure=body.on_member_failure,
        sites=body.sites,
    )


def queue_views(
    live: list[JobRecord], now: dt.datetime, rules: dict[str, tuple[str, str]] | None = None
) -> list[QueueView]:
    """Per queue (every queue with live jobs, and every queue of `rules`): counts, and its policy
    and backfill from `rules` (queue -> (policy, backfill); "" for a queue not in it)."""
    rules = rules or {}
    counts: dict[str, dict[str, float]] = {q: {} for q in rules}
    for job in live:
        c = counts.setdefault(job.queue, {})
        c[job.state] = c.get(job.state, 0) + 1
        if job.state == "queued":
            c["waiting_gpus"] = c.get("waiting_gpus", 0) + job.gpus
            c["oldest"] = max(c.get("oldest", 0.0), (now - job.queued_at).total_seconds())
        elif job.holding:
            c["running_gpus"] = c.get("running_gpus", 0) + job.gpus
    return [
        QueueView(
            queue=q,
            policy=rules.get(q, ("", ""))[0],
            backfill=rules.get(q, ("", ""))[1],
            queued=int(c.get("queued", 0)),
            proposed=int(c.get("proposed", 0)),
            scheduled=int(c.get("scheduled", 0)),
            running=int(c.get("running", 0)),
            waiting_gpus=int(c.get("waiting_gpus", 0)),
            running_gpus=int(c.get("running_gpus", 0)),
            oldest_wait_s=round(c.get("oldest", 0.0), 3),
        )
        for q, c in sorted(counts.items())
    ]


# `?state=`: job states separated by commas (empty items ignored).
StateList = Annotated[str, msgspec.Meta(pattern=rf"^,*(?:(?:{'|'.join(_STATES)})(?:,+|$))*$")]


def _query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"\d+", text) or not low <= int(text) <= high:
        raise BadBody(f"query parameter {name} must be an integer in {low}..{high}", None)
    return int(text)


# `?by=`: what a usage row is.
UsageBy = Literal["tenant", "queue", "tenant,queue", "queue,tenant"]
USAGE_BY: dict[str, tuple[UsageKey, ...]] = {
    "tenant": ("tenant",),
    "queue": ("queue",),
    "tenant,queue": ("tenant", "queue"),
    "queue,tenant": ("tenant", "queue"),
}
# The longest usage window one request reads (every job that ended in it is read).
MAX_USAGE_WINDOW = dt.timedelta(days=366)


# `?since=`/`?until=`: an RFC 3339 time with its zone (2026-12-05T10:00:00Z, ...+02:00).
AwareTime = Annotated[dt.datetime, msgspec.Meta(tz=True)]


def _query_time(request: web.Request, name: str, default: dt.datetime) -> dt.datetime:
    text = request.query.get(name)
    if text is None:
        return default
    try:  # checked against AwareTime before the handler ran (`documented`)
        return msgspec.convert(text, AwareTime, strict=False)
    except msgspec.ValidationError as e:
        raise BadBody(f"query parameter `{name}`: {e}", f"?{name}") from None


def usage_request(request: web.Request, jobs: list[JobRecord], now: dt.datetime) -> UsageRequest:
    """The window and grouping of GET /v1/usage (default: the last 24 hours by tenant and queue)."""
    until = _query_time(request, "until", now)
    since = _query_time(request, "since", until - dt.timedelta(days=1))
    if since > until:
        raise Unprocessable(f"`since` ({since.isoformat()}) is after `until` ({until.isoformat()})", "?since")
    if until - since > MAX_USAGE_WINDOW:
        raise Unprocessable(f"the window may be at most {MAX_USAGE_WINDOW.days} days", "?since")
    by = request.query.get("by", "tenant,queue")
    if by not in USAGE_BY:
        raise BadBody(f"`by` must be one of {', '.join(USAGE_BY)}, got {by!r}", "?by")
    return UsageRequest(jobs=jobs, since=since, until=until, now=now, by=USAGE_BY[by])


def routes(scheduler: Scheduler) -> list[web.RouteDef]:
    store = scheduler.kit.store

    @documented("Submit a job", {201: JobView, 409: ErrorBody, 422: ErrorBody}, body=JobBody)
    async def submit(request: web.Request) -> web.Response:
        body = await read_body(request, JobBody)
        spec = spec_of(body)
        job_id = body.id or new_id()
        async with store.transaction() as tx:
            accepted = await scheduler.accept(tx, job_id, spec)
        if isinstance(accepted, str):
            return json_response({"error": "not accepted", "detail": accepted}, status=422)
        if isinstance(accepted, IdTaken):
            return json_response(ErrorBody(error="job id taken", detail=accepted.text(), path="$.id"), status=409)
        return json_response(job_view(accepted), status=201)

    @documented(
        "Jobs, filtered by state, queue and tenant",
        {200: list[JobView]},
        query={
            "state": StateList,
            "live": Literal["true", "false"],
            "queue": str,
            "tenant": str,
            "limit": Annotated[int, msgspec.Meta(ge=1, le=10_000)],
        },
    )
    async def list_jobs(request: web.Request) -> web.Response:
        states = [s for s in request.query.get("state", "").split(",") if s]  # a StateList
        if request.query.get("live") == "true":
            states = list(LIVE)
        found = await state.list_jobs(
            store.pool,
            states=states,
            queue=request.query.get("queue"),
            tenant=request.query.get("tenant"),
            limit=_query_int(request, "limit", 100, 1, 10_000),
        )
        return json_response([job_view(j) for j in found])

    @documented("A job, with why it waits", {200: JobView, 404: ErrorBody})
    async def show(request: web.Request) -> web.Response:
        job = await state.get_job(store.pool, request.match_info["job_id"])
        if job is None:
            return json_response({"error": "not found", "detail": f"no job {request.match_info['job_id']}"}, 404)
        return json_response(job_view(job))

    @documented("Cancel a job", {200: JobView, 404: ErrorBody, 409: ErrorBody})
    async def cancel(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        async with store.transaction() as tx:
            job = await scheduler.cancel(tx, job_id, "cancelled through the API")
        if job is None:
            return json_response({"error": "not found", "detail": f"no job {job_id}"}, 404)
        if job.state != "cancelled":
            return json_response({"error": "already ended", "detail": f"job {job_id} is {job.state}"}, 409)
        return json_response(job_view(job))

    @documented("The queues", {200: QueuesView})
    async def queues(_: web.Request) -> web.Response:
        live = await state.live_jobs(store.pool)
        return json_response(
            QueuesView(
                policy=scheduler.cfg.policy,
                backfill=scheduler.cfg.backfill,
                served=scheduler.cfg.queues,
                queues=queue_views(live, scheduler.clock.now(), scheduler.queue_policy_names(live)),
                fairshare={t: round(f, 4) for t, f in scheduler.fairshare_factors.items()},
            )
        )

    @documented("This scheduler instance", {200: SchedulerView})
    async def about(_: web.Request) -> web.Response:
        lead = scheduler.leadership
        plan = scheduler.last_plan
        return json_response(
            SchedulerView(
                instance=scheduler.kit.source,
                leader=scheduler.is_leader,
                term=lead.term if lead is not None else None,
                scheduler_group=scheduler.group,
                ledger_version=scheduler.feed.ledger.version,
                ledger_caught_up=scheduler.feed.caught_up,
                nodes=len(scheduler.feed.ledger.nodes),
                cycles=scheduler.cycles,
                last_order=plan.order if plan is not None else None,
                fabric=in_force.about if (in_force := scheduler.fabric_in_force()) is not None else None,
                fabric_published=scheduler.fabric.about,
                links_not_up=sum(1 for _, st in scheduler.fabric_feed.links.values() if st != "up"),
            )
        )

    @documented("The learned runtime model of this replica: version, training, holdout figures", {200: ModelStatus})
    async def model(_: web.Request) -> web.Response:
        return json_response(status_of(scheduler.predictor))

    @documented(
        "Store which nodes hold a dataset (data locality)",
        {200: dict[str, Any]},
        body=DatasetBody,
        path={"name": DatasetName},
    )
    async def put_dataset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await read_body(request, DatasetBody)
        await state.put_dataset(store.pool, name, body.nodes, scheduler.clock.now())
        scheduler.datasets_changed()
        return json_response({"dataset": name, "nodes": sorted(set(body.nodes))})

    @documented("The dataset registry: dataset -> nodes (config and stored)", {200: dict[str, list[str]]})
    async def get_datasets(_: web.Request) -> web.Response:
        stored = await state.datasets(store.pool)
        merged = {k: sorted({*v, *stored.get(k, [])}) for k, v in scheduler.cfg.datasets.items()}
        merged.update({k: sorted(v) for k, v in stored.items() if k not in merged})
        return json_response(merged)

    @documented(
        "GPU-hours held by jobs in a window, by tenant and/or queue (ibpool_core.sched.usage):"
        " `since`/`until` ISO 8601 with a zone (default the last 24 h), `by` tenant, queue or tenant,queue",
        {200: UsageReply, 422: ErrorBody},
        query={"since": AwareTime, "until": AwareTime, "by": UsageBy},
    )
    async def get_usage(request: web.Request) -> web.Response:
        now = scheduler.clock.now()
        asked = usage_request(request, [], now)  # the query checked before anything is read
        jobs = await state.jobs_for_usage(store.pool, asked.since)
        return json_response(usage(msgspec.structs.replace(asked, jobs=jobs)))

    return [
        web.put("/v1/datasets/{name}", put_dataset),
        web.get("/v1/datasets", get_datasets),
        web.post("/v1/jobs", submit),
        web.get("/v1/jobs", list_jobs),
        web.get("/v1/jobs/{job_id}", show),
        web.delete("/v1/jobs/{job_id}", cancel),
        web.get("/v1/queues", queues),
        web.get("/v1/scheduler", about),
        web.get("/v1/model", model),
        web.get("/v1/usage", get_usage),
    ]
