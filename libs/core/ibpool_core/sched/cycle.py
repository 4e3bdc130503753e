"""One scheduling cycle as one pure function: `schedule(SchedulingRequest) -> SchedulingReply`.

The request carries the waiting queue, the running jobs, the free capacity per host, the time and
the policy; the reply says which jobs start where, which are preempted or killed, the reservation
held for the blocked head, and why each examined job waits. The service and the simulator call the
same function; nothing here does I/O or keeps state between calls.

One cycle, in order:
1. Kill running jobs past their time limit (their GPUs count as free for this cycle).
2. Walk the queue in the policy's order (re-sorting only when the caller's `queue_order` is not the
   order the policy chooses now), at most `scan_depth` jobs, and start what fits:
   `backfill="none"` stops at the first job that does not fit (strict order), `"greedy"` starts
   every job that fits, `"easy"` reserves for the first job that does not fit and then starts only
   jobs that do not delay that reservation (see backfill.py).
3. Preemptive policies: for up to `preempt_depth` jobs still waiting, in order, preempt the cheapest
   eligible victim set (see preemption.py) and start the job on the freed GPUs.
4. Explaining (`config.explain`): every examined job that does not start gets a typed `waits.Wait`;
   when no GPU was free for it, the first such job is still given its earliest estimated start
   (reserved as step 2 would, on the view after this cycle's starts, their GPUs released at their
   planned ends), unless the cycle preempted or killed.
Gangs are placed whole or not at all by the placer; a gang waits for its minimal leaf span until it
waited `span_relax_after_s` (topology "preferred"), then takes any span.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from .backfill import Backfill, Reservation, reserve
from .jobs import FreeCapacity, Job, QueueStats, RunningJob, estimated_runtime, host_shares
from .placer import FreeView, LeafPlacer, Placement, Placer, leaves_spanned, min_leaf_span
from .preemption import choose_victims
from .queueing import QueuePolicy
from .waits import Wait

BackfillMode = Literal["none", "greedy", "easy"]


class CycleConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Knobs of one cycle; defaults are the ones the simulator's table uses.

    `scan_depth` caps the queue positions examined per cycle (what keeps a cycle O(depth) on a queue
    of thousands); `safety_margin` multiplies p90 predictions for backfill; `min_runtime_s` protects
    a just-started job from preemption; `hosts_per_leaf` is used for the minimal leaf span.
    """

    backfill: BackfillMode = "easy"
    scan_depth: int = 128
    safety_margin: float = 1.5
    preempt_depth: int = 2
    min_runtime_s: float = 300.0
    span_relax_after_s: float = 86_400.0
    hosts_per_leaf: int = 8
    explain: bool = True


class Start(msgspec.Struct, frozen=True, kw_only=True):
    """Start `job_id` on `hosts`; `planned_end` is what the caller puts in its `RunningJob`."""

    job_id: str
    hosts: list[tuple[int, int]]
    leaves: int
    min_leaves: int
    planned_end: float


class Preemption(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    for_job_id: str


class SchedulingRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one cycle decides from.

    `queue`: waiting jobs; if `queue_order` names the order the policy chooses for `stats`, the
    caller guarantees they are sorted by that order's key and the cycle does not sort (O(scan_depth)
    instead of O(Q log Q)). `fairshare`: tenant -> factor in [0, 1] (fairshare.py), read by the
    priority policy. `placer`: None means `LeafPlacer`. `running_sorted_by_end`: the caller keeps
    `running` sorted by `planned_end`, so the reservation needs no sort.
    `free_view`: the caller's `FreeView.of(cluster)`, kept from cycle to cycle; the cycle changes it
    and the caller undoes that (its `journal`, `rollback`), so no view of every host is built.
    `overruns`: the ids of the running jobs past their time limit at `now`, when the caller keeps
    them by deadline (None: the cycle finds them, a walk over every running job).
    """

    now: float
    queue: Sequence[Job]
    running: Sequence[RunningJob]
    cluster: FreeCapacity
    policy: QueuePolicy
    config: CycleConfig = CycleConfig()
    stats: QueueStats = QueueStats()
    queue_order: str | None = None
    fairshare: Mapping[str, float] = {}
    placer: Placer | None = None
    running_sorted_by_end: bool = False
    free_view: FreeView | None = None
    overruns: Sequence[str] | None = None


class SchedulingReply(msgspec.Struct, frozen=True, kw_only=True):
    """What to do now. `waiting` has a typed reason (`waits.Wait`) for every examined job that does
    not start (when `config.explain`); jobs further back were not examined this cycle."""

    order: str
    starts: list[Start] = []
    preemptions: list[Preemption] = []
    kills: list[str] = []
    reservation: Reservation | None = None
    waiting: dict[str, Wait] = {}


def needs_of(job: Job) -> str:
    """What a job needs, as its wait reasons say it."""
    if job.hosts <= 1:
        return f"{job.gpus} GPUs on one host"
    return f"{job.hosts} hosts with {host_shares(job)[0]} free GPUs"


class _Cycle:
    def __init__(self, request: SchedulingRequest) -> None:
        self.req = request
        self.cfg = request.config
        self.now = request.now
        self.placer: Placer = request.placer if request.placer is not None else LeafPlacer()
        self.view = request.free_view if request.free_view is not None else FreeView.of(request.cluster)
        self.starts: list[Start] = []
        self.started_ids: set[str] = set()
        self.waiting: dict[str, Wait] = {}
        self.kills: list[str] = []
        self.running: Sequence[RunningJob] = request.running

    def max_leaves(self, job: Job) -> int | None:
        if job.hosts <= 1:
            return None
        relaxed = job.topology == "preferred" and self.now - job.submit_time >= self.cfg.span_relax_after_s
        return None if relaxed else min_leaf_span(job.hosts, self.cfg.hosts_per_leaf)

    def kill_overruns(self) -> None:
        now, named = self.now, self.req.overruns
        if named is None:
            over = [
                r for r in self.running if r.job.time_limit_s is not None and now >= r.started_at + r.job.time_limit_s
            ]
        elif named:
            wanted = set(named)
            over = [r for r in self.running if r.job.id in wanted]
        else:
            return
        if not over:
            return
        for run in over:
            self.kills.append(run.job.id)
            for host, gpus in run.hosts:
                self.view.give(host, gpus)
        killed = set(self.kills)
        self.running = [r for r in self.running if r.job.id not in killed]

    def start(self, job: Job, placement: Placement) -> None:
        self.view.apply(placement)
        self.starts.append(
            Start(
                job_id=job.id,
                hosts=placement,
                leaves=leaves_spanned(placement, self.view.leaf_of),
                min_leaves=min_leaf_span(job.hosts, self.cfg.hosts_per_leaf),
                planned_end=self.now + estimated_runtime(job, self.cfg.safety_margin),
            )
        )
        self.started_ids.add(job.id)

    def try_place(self, view: FreeView, job: Job) -> Placement | None:
        if job.gpus > view.total_free:
            return None
        return self.placer.place(view, job, self.max_leaves(job))

    def explain(self, job: Job, why: Wait) -> None:
        if self.cfg.explain:
            self.waiting[job.id] = why

    def fill(self, queue: Sequence[Job]) -> tuple[Reservation | None, list[Job]]:
        """Step 2; returns the reservation (easy) and the examined jobs still waiting."""
        cfg = self.cfg
        backfill: Backfill | None = None
        left: list[Job] = []
        for position, job in enumerate(queue):
            if position >= cfg.scan_depth:
                break
            if self.view.total_free == 0 and not self.req.policy.preemptive:
                if cfg.explain:
                    self.explain(job, Wait(code="unschedulable", needs=needs_of(job), no_free_gpus=True))
                    continue
                break
            if backfill is None:
                placement = self.try_place(self.view, job)
                if placement is not None:
                    self.start(job, placement)
                    continue
                left.append(job)
                if cfg.backfill == "none":
                    self.explain(job, Wait(code="unschedulable", needs=needs_of(job)))
                    break
                if cfg.backfill == "easy":
                    backfill = self.reserve_head(job)
                    if backfill is None:
                        continue
                else:
                    self.explain(job, Wait(code="unschedulable", needs=needs_of(job)))
                continue
            if job.gpus > self.view.total_free:
                left.append(job)
                self.explain(job, Wait(code="reservation", behind=backfill.reservation.job_id))
                continue
            outlasts = not backfill.ends_before_shadow(job, self.now, cfg.safety_margin)
            placement = self.try_place(backfill.restricted if outlasts else self.view, job)
            if placement is None:
                left.append(job)
                self.explain(job, Wait(code="reservation", behind=backfill.reservation.job_id, delays=outlasts))
                continue
            self.start(job, placement)
            backfill.record(placement, self.view, outlasts)
        return (backfill.reservation if backfill is not None else None), left

    def reserve_head(self, job: Job) -> Backfill | None:
        found = reserve(
            self.view,
            self.running,
            job,
            self.now,
            self.placer,
            max_leaves=self.max_leaves(job),
            sorted_by_end=self.req.running_sorted_by_end,
        )
        if found is None:
            self.explain(job, Wait(code="unresolvable", needs=needs_of(job)))
            return None
        reservation, free_at_shadow = found
        span = "" if job.hosts <= 1 else f" under {self.max_leaves(job) or 'any number of'} leaves"
        self.explain(job, Wait(code="unschedulable", needs=needs_of(job), span=span, start_at=reservation.start_at))
        return Backfill(reservation, free_at_shadow, self.view)

    def estimate_first_without_free_gpus(self, queue: Sequence[Job]) -> None:
        """Step 4: the earliest estimated start of the first job told only that no GPU was free."""
        head = next((j for j in queue if (w := self.waiting.get(j.id)) is not None and w.no_free_gpus), None)
        if head is None:
            return
        by_id = {j.id: j for j in queue}
        running = list(self.running)
        running += [
            RunningJob(job=by_id[s.job_id], hosts=tuple(s.hosts), started_at=self.now, planned_end=s.planned_end)
            for s in self.starts
        ]
        max_leaves = self.max_leaves(head)
        found = reserve(self.view, running, head, self.now, self.placer, max_leaves=max_leaves)
        if found is not None:
            span = "" if head.hosts <= 1 else f" under {max_leaves or 'any number of'} leaves"
            self.waiting[head.id] = Wait(
                code="unschedulable", needs=needs_of(head), span=span, start_at=found[0].start_at
            )

    def preempt(self, waiting: list[Job]) -> list[Preemption]:
        policy, now = self.req.policy, self.now
        # Ranks of the running jobs old enough to be victims, computed once per cycle.
        ranks = {
            r.job.id: policy.running_rank(r, now) for r in self.running if now - r.started_at >= self.cfg.min_runtime_s
        }
        if not ranks:
            return []
        worst = max(ranks.values())
        preemptions: list[Preemption] = []
        gone: set[str] = set()
        for job in waiting[: self.cfg.preempt_depth]:
            rank = policy.waiting_rank(job)
            if rank >= worst:
                continue

            def eligible(run: RunningJob, rank: float = rank) -> bool:
                return run.job.id not in gone and ranks.get(run.job.id, -math.inf) > rank

            chosen = choose_victims(
                job,
                self.running,
                self.view,
                self.now,
                eligible=eligible,
                placer=self.placer,
                hosts_per_leaf=self.cfg.hosts_per_leaf,
                max_leaves=self.max_leaves(job),
            )
            if chosen is None:
                continue
            victims, placement = chosen
            for run in victims:
                gone.add(run.job.id)
                preemptions.append(Preemption(job_id=run.job.id, for_job_id=job.id))
                for host, gpus in run.hosts:
                    self.view.give(host, gpus)
            self.start(job, placement)
            self.waiting.pop(job.id, None)
        return preemptions


def ordered_queue(request: SchedulingRequest, order: str) -> Sequence[Job]:
    """The queue in `order`: as given when the caller says it is already so, else sorted."""
    if request.queue_order == order:
        return request.queue
    policy, fairshare = request.policy, request.fairshare
    return sorted(request.queue, key=lambda job: policy.order_key(order, job, fairshare))


def schedule(request: SchedulingRequest) -> SchedulingReply:
    """Decide one cycle; see the module docstring for the steps and `SchedulingRequest` for inputs."""
    order = request.policy.choose_order(request.stats)
    cycle = _Cycle(request)
    cycle.kill_overruns()
    queue = ordered_queue(request, order)
    reservation, left = cycle.fill(queue)
    preemptions = cycle.preempt(left) if request.policy.preemptive and left else []
    if request.config.explain and not preemptions and not cycle.kills:
        cycle.estimate_first_without_free_gpus(queue)
    return SchedulingReply(
        order=order,
        starts=cycle.starts,
        preemptions=preemptions,
        kills=cycle.kills,
        reservation=reservation,
        waiting=cycle.waiting,
    )
