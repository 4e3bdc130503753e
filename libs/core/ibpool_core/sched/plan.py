"""The scheduling decision, one pure function: `plan(PlanRequest) -> PlanReply`.

Both callers make their decision here: the scheduler service (`pool_cycle.plan_cycle` builds the
request from the pool ledger and the job records, then picks exact GPU indices) and the simulator
(`ibpool_sim.cluster_sim` builds it from its simulated cluster). Data in: the queues (each with its
policy and cycle config), the running jobs, the free capacity per host, the placer and the fabric's
SHARP limits and trees in use. Data out: the starts, each placed in full (hosts in rank order, the
tier of the switch group that covers them, SHARP on or off and why, the NCCL settings, the trees
reserved), the preemptions and kills, and a typed `Wait` for every job that stays queued.

Several queues are decided in turn, the queue whose oldest job has waited longest first, each by
its own policy on what the queues before it left (`after`). The placer is the only state carried
from one call to the next (`FrameworkPlacer`: an accelerator that keeps its view between cycles;
the same decision without it, `test_plan.py` checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from ibpool_core.sched.cycle import (
    CycleConfig,
    Preemption,
    SchedulingReply,
    SchedulingRequest,
    Start,
    schedule,
)
from ibpool_core.sched.framework_placer import FrameworkPlacer
from ibpool_core.sched.jobs import FreeCapacity, Job, QueueStats, RunningJob
from ibpool_core.sched.placer import FreeView, Placer
from ibpool_core.sched.queueing import QueuePolicy
from ibpool_core.sched.records import JobPlacement
from ibpool_core.sched.sharp import SharpDecision, SharpLimits, SharpTree, SharpTrees, decide_sharp
from ibpool_core.sched.waits import Wait

# The reasons a placement has no SHARP when the framework did not decide it (`placement = "leaf"`).
LEAF_PLACER_NO_SHARP = 'the leaf placer (placement = "leaf") does not place for SHARP'
SINGLE_HOST_NO_SHARP = "single-node job: its reductions stay on NVLink inside the host"


class QueueRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One queue of the cycle: its waiting jobs, the policy that orders them and its cycle config.
    `stats` and `order` are for policies that choose their order from the queue's state
    (`QueuePolicy.choose_order`); the default is the policy's first order."""

    name: str = ""
    jobs: Sequence[Job]
    policy: QueuePolicy
    config: CycleConfig = CycleConfig()
    stats: QueueStats = QueueStats()
    order: str | None = None


class PlanRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one decision reads.

    `cluster`: free and total GPUs per host index and each host's leaf; `names`: host index -> host
    name (the placer's and the fabric's); `running`: jobs holding GPUs (`running_sorted_by_end`:
    already in planned-end order). `placer`: None for the core's `LeafPlacer`. `sharp_limits`: how
    many SHARP trees the fabric runs at once (None: no bound); `sharp_held`: the trees running jobs
    hold, by job id (a job this plan preempts or kills gives its trees back to the starts).
    `fabric_version`: the published fabric the decision is made on, recorded in every placement.
    `free_view`, `overruns`: see `cycle.SchedulingRequest` (for the first queue decided; the
    queues after it see the cluster that queue left).
    """

    now: float
    queues: list[QueueRequest]
    running: Sequence[RunningJob] = ()
    running_sorted_by_end: bool = False
    cluster: FreeCapacity
    names: list[str]
    fairshare: Mapping[str, float] = {}
    placer: Placer | None = None
    sharp_limits: SharpLimits | None = None
    sharp_held: Mapping[str, SharpTree] = {}
    fabric_version: int | None = None
    free_view: FreeView | None = None
    overruns: Sequence[str] | None = None


class PlannedStart(msgspec.Struct, frozen=True, kw_only=True):
    """One start: GPUs per host index (`hosts`, the core's order), its placement (host names in rank
    order, tier, SHARP and why, NCCL settings, trees), when it should end, and its leaf span
    (`leaves`) against the fewest leaves that could hold it (`min_leaves`)."""

    job_id: str
    hosts: list[tuple[int, int]]
    placement: JobPlacement
    planned_end: float
    leaves: int = 1
    min_leaves: int = 1


class PlanReply(msgspec.Struct, frozen=True, kw_only=True):
    starts: list[PlannedStart] = []
    preemptions: list[Preemption] = []
    kills: list[str] = []
    waiting: dict[str, Wait] = {}
    order: str = ""


def plan(request: PlanRequest) -> PlanReply:
    """Decide one cycle; see the module docstring. `request.queues` holds one queue at least (an
    empty one still kills the jobs past their time limit and reserves for none); ValueError if not."""
    if not request.queues:
        raise ValueError("a plan needs one queue at least (an empty queue with the cluster's policy)")
    queues = request.queues
    if len(queues) > 1:
        queues = sorted(queues, key=lambda q: (min((j.submit_time for j in q.jobs), default=0.0), q.name))
    cluster, running = request.cluster, request.running
    free_view, overruns = request.free_view, request.overruns
    replies: list[SchedulingReply] = []
    for i, q in enumerate(queues):
        one = SchedulingRequest(
            now=request.now,
            queue=q.jobs,
            running=running,
            running_sorted_by_end=request.running_sorted_by_end and i == 0,
            cluster=cluster,
            policy=q.policy,
            config=q.config,
            stats=q.stats,
            queue_order=q.order,
            fairshare=request.fairshare,
            placer=request.placer,
            free_view=free_view if i == 0 else None,
            overruns=overruns if i == 0 else None,
        )
        reply = schedule(one)
        replies.append(reply)
        if i + 1 < len(queues):
            cluster, running = after(reply, one)
    reply = merged(replies)
    placer = request.placer
    waiting = dict(reply.waiting)
    if isinstance(placer, FrameworkPlacer):
        # Say what the plugins found missing when no future frees it (a GPU model, a dataset's holders).
        for job_id, why in waiting.items():
            if why.code == "unresolvable" and (found := placer.reasons.get(job_id)):
                waiting[job_id] = why.with_found(found)
    return PlanReply(
        starts=placed_starts(request, reply),
        preemptions=list(reply.preemptions),
        kills=list(reply.kills),
        waiting=waiting,
        order=reply.order,
    )


def placed_starts(request: PlanRequest, reply: SchedulingReply) -> list[PlannedStart]:
    """Every start of `reply` placed in full. With the framework: the placement it admitted for the
    job (or, when that is not the start's host set, one decided again on its view: rank order along
    the fabric, the covering tier, SHARP), trees reserved in start order while the limits have room.
    With the leaf placer: hosts in index order, no SHARP."""
    placer = request.placer
    names = request.names
    out: list[PlannedStart] = []
    if not isinstance(placer, FrameworkPlacer):
        for s in reply.starts:
            hosts = [names[h] for h, _ in s.hosts]
            reason = LEAF_PLACER_NO_SHARP if len(hosts) > 1 else SINGLE_HOST_NO_SHARP
            out.append(_start(s, JobPlacement(ranks=hosts, sharp_reason=reason)))
        return out
    view = placer.view
    trees = (
        SharpTrees(view.index, request.sharp_limits, held_after(request.sharp_held, reply))
        if request.sharp_limits is not None
        else None
    )
    for s in reply.starts:
        hosts = [names[h] for h, _ in s.hosts]
        result = placer.results.get(s.job_id)
        if result is not None and sorted(result.hosts) == sorted(hosts):
            ranked = list(result.hosts)
            decision = SharpDecision(enabled=result.sharp, reason=result.sharp_reason, env=dict(result.nccl_env))
            tier = result.covering_level
        else:
            ranked = sorted(hosts, key=view.rank_key)
            covering = view.covering(ranked) if len(ranked) > 1 else None
            decision = decide_sharp(view.index, len(ranked), None, covering)
            tier = covering.level if covering is not None else None
        if trees is not None:
            decision = trees.reserve(ranked, decision)
        placement = JobPlacement(
            ranks=ranked,
            sharp=decision.enabled,
            sharp_reason=decision.reason,
            nccl_env=decision.env,
            fabric_version=request.fabric_version,
            tier=tier if len(ranked) > 1 else None,
            sharp_tree=decision.tree,
        )
        out.append(_start(s, placement))
    return out


def held_after(held: Mapping[str, SharpTree], reply: SchedulingReply) -> list[SharpTree]:
    """The SHARP trees still held once `reply` is carried out: the jobs it preempts or kills give
    theirs back before its starts reserve any (as their GPUs are free for the starts)."""
    gone = set(reply.kills) | {p.job_id for p in reply.preemptions}
    return [tree for job_id, tree in held.items() if job_id not in gone]


def _start(s: Start, placement: JobPlacement) -> PlannedStart:
    return PlannedStart(
        job_id=s.job_id,
        hosts=list(s.hosts),
        placement=placement,
        planned_end=s.planned_end,
        leaves=s.leaves,
        min_leaves=s.min_leaves,
    )


def after(reply: SchedulingReply, request: SchedulingRequest) -> tuple[FreeCapacity, list[RunningJob]]:
    """The cluster and the running jobs once `reply` is carried out: kills and preemptions free
    their GPUs, starts take theirs (for the next queue of the same cycle)."""
    free = list(request.cluster.free)
    gone = set(reply.kills) | {p.job_id for p in reply.preemptions}
    running = []
    for r in request.running:
        if r.job.id in gone:
            for h, g in r.hosts:
                free[h] += g
        else:
            running.append(r)
    by_id = {j.id: j for j in request.queue}
    for start in reply.starts:
        for h, g in start.hosts:
            free[h] -= g
        running.append(
            RunningJob(
                job=by_id[start.job_id],
                hosts=tuple(start.hosts),
                started_at=request.now,
                planned_end=start.planned_end,
            )
        )
    return msgspec.structs.replace(request.cluster, free=free), running


def merged(replies: Sequence[SchedulingReply]) -> SchedulingReply:
    """One reply for the queues of one cycle, in the order they were decided."""
    if len(replies) == 1:
        return replies[0]
    starts: list[Start] = []
    preemptions: list[Preemption] = []
    kills: list[str] = []
    waiting: dict[str, Wait] = {}
    for r in replies:
        starts.extend(r.starts)
        preemptions.extend(r.preemptions)
        kills.extend(k for k in r.kills if k not in kills)
        waiting.update(r.waiting)
    return SchedulingReply(
        order=",".join(r.order for r in replies), starts=starts, preemptions=preemptions, kills=kills, waiting=waiting
    )
