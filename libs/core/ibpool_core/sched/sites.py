"""Multi-site: the site (cluster) for a job that names several, by estimated start and data locality. Pure.

A job may name several sites. For each the caller gives the site's free capacity, its running jobs
(with their planned ends), the jobs already waiting there in its queue's order, and the datasets
the site holds. The job goes to the site where it is estimated to start first, where a site that
does not hold the job's dataset first pays `transfer_s` to bring it (so holding the data wins a
tie, and wins outright unless another site starts the job more than `transfer_s` sooner); equal
estimates keep the order in which the job named the sites.

Estimated start at one site (`estimate_start`): now, if the job fits the free capacity left after
every queued job that fits now (what a backfilling cycle would start). Otherwise list scheduling
of the site's queue ahead of the job and then the job, in order, on the site's free capacity: each
is placed (the cycle's `Placer`, `LeafPlacer` by default) as soon as enough running or
earlier-placed jobs have ended at their planned ends (`RunningJob.planned_end`; a job already past
it is expected to run as long again as it has, runtimes being heavy-tailed; placed jobs end after
`estimated_runtime` x `safety_margin`). Past the first job that waits no backfill is assumed, so
the estimate may err late; at most `depth` queued jobs are list-scheduled, and the work of the
rest (GPU-seconds over the site's GPUs) is added. None: the job never fits the site, even empty.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import msgspec

from .jobs import FreeCapacity, Job, RunningJob, estimated_runtime
from .placer import FreeView, LeafPlacer, Placer, min_leaf_span


class Site(msgspec.Struct, frozen=True, kw_only=True):
    """One site as the chooser sees it. `queue`: its waiting jobs in its policy's order."""

    name: str
    cluster: FreeCapacity
    running: Sequence[RunningJob] = ()
    queue: Sequence[Job] = ()
    datasets: frozenset[str] = frozenset()
    hosts_per_leaf: int = 8


class SiteChoice(msgspec.Struct, frozen=True, kw_only=True):
    """`site`: the chosen site's name (None: the job fits none); `start_at` its estimated start
    (transfer included); `estimates`: every named site -> its estimate (None: never fits there);
    `reason`: one sentence for a person."""

    site: str | None
    start_at: float | None
    estimates: dict[str, float | None]
    reason: str


def estimate_start(
    site: Site,
    job: Job,
    now: float,
    *,
    placer: Placer | None = None,
    safety_margin: float = 1.5,
    depth: int = 64,
) -> float | None:
    """When `job` would start at `site` behind its queue (see the module docstring), or None."""
    placer = placer or LeafPlacer()
    cluster = site.cluster
    if job.gpus > sum(cluster.capacity):
        return None

    def span(j: Job) -> int | None:
        return min_leaf_span(j.hosts, site.hosts_per_leaf) if j.hosts > 1 and j.topology == "required" else None

    # What the site's cycle would start now, backfill included: every queued job that fits now, in
    # order; if the job still fits after them it starts now (the in-order pass below errs late).
    view = FreeView.of(cluster)
    for j in site.queue[:depth]:
        placement = placer.place(view, j, span(j))
        if placement is not None:
            view.apply(placement)
    if placer.place(view, job, span(job)) is not None:
        return now
    view = FreeView.of(cluster)
    ends: list[tuple[float, int, tuple[tuple[int, int], ...]]] = []
    for i, r in enumerate(site.running):
        # A job past its planned end has outlived its estimate: expect it to run as long again as it
        # has (runtimes are heavy-tailed), not to end now, which would make a stuck site look free.
        ends.append((r.planned_end if r.planned_end > now else now + (now - r.started_at), i, r.hosts))
    heapq.heapify(ends)
    seq = len(ends)
    t = now
    # The queue past `depth` is ahead of the job too: its work, spread over the whole site (a fluid
    # bound), delays the job's start; ignoring it would make a long queue look as short as `depth`.
    backlog_s = sum(j.gpus * estimated_runtime(j, safety_margin) for j in site.queue[depth:]) / sum(cluster.capacity)
    for j in [*site.queue[:depth], job]:
        while True:
            placement = placer.place(view, j, span(j))
            if placement is not None:
                view.apply(placement)
                heapq.heappush(ends, (t + estimated_runtime(j, safety_margin), seq, tuple(placement)))
                seq += 1
                break
            if not ends:
                if j is job:
                    return None
                break  # a queued job that never fits here: it does not hold the job up
            end, _, hosts = heapq.heappop(ends)
            t = max(t, end)
            for host, gpus in hosts:
                view.give(host, gpus)
    return t + backlog_s


def choose_site(
    job: Job,
    sites: Sequence[Site],
    now: float,
    *,
    dataset: str | None = None,
    transfer_s: float = 0.0,
    placer: Placer | None = None,
    safety_margin: float = 1.5,
) -> SiteChoice:
    """The site for `job` among `sites` (in the order the job named them); see the module docstring."""
    if not sites:
        raise ValueError(f"job {job.id}: names no site")
    names = [s.name for s in sites]
    if len(set(names)) != len(names):
        raise ValueError(f"job {job.id}: a site is named twice in {names}")
    estimates: dict[str, float | None] = {}
    best: tuple[float, int] | None = None
    for i, site in enumerate(sites):
        start = estimate_start(site, job, now, placer=placer, safety_margin=safety_margin)
        if start is not None and dataset is not None and dataset not in site.datasets:
            start += transfer_s
        estimates[site.name] = start
        if start is not None and (best is None or (start, i) < best):
            best = (start, i)
    if best is None:
        return SiteChoice(site=None, start_at=None, estimates=estimates, reason="fits none of the sites it names")
    chosen = sites[best[1]]
    has_data = dataset is None or dataset in chosen.datasets
    where = "holds its dataset" if dataset is not None and has_data else "has no copy of its dataset"
    wait = best[0] - now
    why = f"earliest estimated start ({wait:.0f} s from now)" + (f"; {where}" if dataset is not None else "")
    return SiteChoice(site=chosen.name, start_at=best[0], estimates=estimates, reason=why)
