"""Priority preemption: the cheapest set of running jobs whose GPUs let a waiting job start. Pure.

A running job is a possible victim when the policy ranks it strictly below the waiting job and it
has run at least `min_runtime_s` since its last start (so a restarted job makes progress). The cost
of a victim set is compared as (GPUs taken from their jobs, work at risk), smallest first: fewest
GPUs, then least work lost (seconds run since the last start, the progress a failed checkpoint
loses). Per host, victims are taken smallest first until the host has the job's share free; a gang
takes the cheapest hosts, inside one leaf when the gang fits in one. Victims are requeued by the
caller, which charges them the checkpoint/restore cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .jobs import Job, RunningJob, host_shares
from .placer import FreeView, Placement, Placer

Cost = tuple[int, float]


def _host_plan(
    host: int, need: int, view: FreeView, victims_on: dict[int, list[RunningJob]], now: float
) -> tuple[Cost, list[RunningJob]] | None:
    missing = need - view.free[host]
    if missing <= 0:
        return (0, 0.0), []
    chosen: list[RunningJob] = []
    freed = 0
    for run in victims_on.get(host, ()):
        chosen.append(run)
        freed += sum(g for h, g in run.hosts if h == host)
        if freed >= missing:
            return (sum(r.job.gpus for r in chosen), sum(now - r.started_at for r in chosen)), chosen
    return None


def choose_victims(
    job: Job,
    running: Sequence[RunningJob],
    view: FreeView,
    now: float,
    *,
    eligible: Callable[[RunningJob], bool],
    placer: Placer,
    hosts_per_leaf: int,
    max_leaves: int | None = None,
) -> tuple[list[RunningJob], Placement] | None:
    """Victims and the placement they make possible, or None when no eligible set frees enough.

    Does not mutate `view`. The returned placement is valid on `view` once the victims' GPUs are
    given back; the whole gang is placed or nothing, on at most `max_leaves` leaves when given (the
    cycle passes the gang's minimal span while it waits for it, as when it starts on free GPUs).
    """
    victims_on: dict[int, list[RunningJob]] = {}
    for run in running:
        if eligible(run):
            for host, _ in run.hosts:
                victims_on.setdefault(host, []).append(run)
    if not victims_on:
        return None
    for runs in victims_on.values():
        runs.sort(key=lambda r: (r.job.gpus, now - r.started_at, r.job.id))
    need = host_shares(job)[0]
    plans = []
    for host in range(len(view.free)):
        host_plan = _host_plan(host, need, view, victims_on, now)
        if host_plan is not None:
            plans.append((host_plan[0], host, host_plan[1]))
    if len(plans) < job.hosts:
        return None
    plans.sort(key=lambda p: (p[0], p[1]))
    chosen_hosts = plans[: job.hosts]
    if 1 < job.hosts <= hosts_per_leaf:
        by_leaf: dict[int, list[tuple[Cost, int, list[RunningJob]]]] = {}
        for plan in plans:
            by_leaf.setdefault(view.leaf_of[plan[1]], []).append(plan)
        in_one_leaf = [ps[: job.hosts] for ps in by_leaf.values() if len(ps) >= job.hosts]
        if in_one_leaf:
            chosen_hosts = min(in_one_leaf, key=lambda ps: (sum(p[0][0] for p in ps), sum(p[0][1] for p in ps)))
    victims: dict[str, RunningJob] = {}
    for _, _, runs in chosen_hosts:
        for run in runs:
            victims[run.job.id] = run
    after = view.copy()
    for run in victims.values():
        for host, gpus in run.hosts:
            after.give(host, gpus)
    placement = placer.place(after, job, max_leaves)
    if placement is None:
        return None
    return list(victims.values()), placement
