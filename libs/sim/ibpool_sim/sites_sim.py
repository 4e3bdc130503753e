"""Two sites, one trace: where should a job that names both go? The scheduler core decides at each site.

Every job names the sites ["a", "b"] (a first: everyone's favourite); a share of the jobs read a
dataset held only at site a, and running one of them at b first costs `transfer_s` (copying the
data, charged to its runtime there). Each site runs its own `schedule()` (FIFO with EASY backfill
on predicted runtimes, the online `RecentMedianEstimator`, or on exact ones) on its own hosts. The router, at each
job's arrival, is one of:

- `first`: the first site it names;
- `most-free`: the site with the most free GPUs less those its queue waits for (a load balancer
  blind to queues' runtimes and to data);
- `choose`: `ibpool_core.sched.sites.choose_site`, the scheduler service's choice: the earliest
  estimated start, the dataset copy counted.

Deterministic for a trace, the sites' sizes and the seed (which jobs read the dataset). Cost: a
cycle per site per instant where something happened, over at most `scan_depth` queued jobs; meant
for trace slices of a few thousand jobs.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Sequence

import msgspec

from ibpool_core.sched.cycle import CycleConfig, SchedulingRequest, schedule
from ibpool_core.sched.jobs import FreeCapacity, Job, RunningJob
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.runtime import JobFeatures, RecentMedianEstimator
from ibpool_core.sched.sites import Site, choose_site

from .cluster_sim import gang_nodes
from .traces import TraceJob

STRATEGIES = ("first", "most-free", "choose")
SITES = ("a", "b")
DATASET = "ds"


class TwoSiteConfig(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[int, int] = (40, 40)  # hosts of site a and site b
    gpus_per_node: int = 8
    hosts_per_leaf: int = 8
    reads_share: float = 0.5  # share of jobs reading the dataset held only at site a
    transfer_s: float = 600.0
    seed: int = 0
    # True: every job's runtime is known exactly at submit (a requested runtime equal to the truth),
    # which isolates the router from prediction error; False: the online median predictor.
    exact_runtimes: bool = False


class TwoSiteResult(msgspec.Struct, frozen=True, kw_only=True):
    strategy: str
    jobs: int
    avg_jct_s: float
    median_jct_s: float
    avg_queue_s: float
    placed: dict[str, int]  # jobs per site
    copies: int  # jobs that waited for their dataset to be copied


def simulate_two_sites(trace: Sequence[TraceJob], strategy: str, config: TwoSiteConfig) -> TwoSiteResult:
    """Replay `trace` on two sites routed by `strategy` (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    if not 0.0 <= config.reads_share <= 1.0:
        raise ValueError(f"reads_share must be within 0..1, got {config.reads_share}")
    gpn, hpl = config.gpus_per_node, config.hosts_per_leaf
    sizes = dict(zip(SITES, config.nodes, strict=True))
    too_big = [t.id for t in trace if gang_nodes(t.gpus, gpn) > max(sizes.values())]
    if too_big:
        raise ValueError(f"{len(too_big)} jobs need more hosts than either site has, e.g. {too_big[0]}")
    rng = random.Random(config.seed)
    reads = {t.id: rng.random() < config.reads_share for t in trace}
    holds = {"a": frozenset({DATASET}), "b": frozenset()}
    free = {s: [gpn] * n for s, n in sizes.items()}
    capacity = {s: [gpn] * n for s, n in sizes.items()}
    leaf_of = {s: [h // hpl for h in range(n)] for s, n in sizes.items()}
    running: dict[str, list[RunningJob]] = {s: [] for s in SITES}
    queue: dict[str, list[Job]] = {s: [] for s in SITES}
    estimator = RecentMedianEstimator()
    policy = make_policy("fifo")
    cycle = CycleConfig(backfill="easy", hosts_per_leaf=hpl, explain=False)
    by_id = {t.id: t for t in trace}
    runtime_at: dict[str, float] = {}
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    placed = {s: 0 for s in SITES}
    copies = 0
    ends: list[tuple[float, str, str]] = []
    arrivals = sorted(trace, key=lambda t: (t.submit_s, t.id))
    i = 0

    def features(t: TraceJob) -> JobFeatures:
        return JobFeatures(tenant=t.tenant, num_gpus=t.gpus, submit_time=t.submit_s, name=t.name)

    def route(job: Job, now: float) -> str:
        if strategy == "first":
            return "a"
        if strategy == "most-free":
            return max(SITES, key=lambda s: (sum(free[s]) - sum(q.gpus for q in queue[s]), s == "a"))
        views = [
            Site(
                name=s,
                cluster=FreeCapacity(free=list(free[s]), capacity=capacity[s], leaf_of=leaf_of[s]),
                running=running[s],
                queue=queue[s],
                datasets=holds[s],
                hosts_per_leaf=hpl,
            )
            for s in SITES
        ]
        dataset = DATASET if reads[job.id] else None
        chosen = choose_site(job, views, now, dataset=dataset, transfer_s=config.transfer_s)
        assert chosen.site is not None  # every job fits both sites (checked above)
        return chosen.site

    while len(finished) < len(arrivals):
        now = min(arrivals[i].submit_s if i < len(arrivals) else float("inf"), ends[0][0] if ends else float("inf"))
        while ends and ends[0][0] <= now:
            _, s, job_id = heapq.heappop(ends)
            run = next(r for r in running[s] if r.job.id == job_id)
            running[s].remove(run)
            for h, g in run.hosts:
                free[s][h] += g
            finished[job_id] = now
            estimator.observe(features(by_id[job_id]), by_id[job_id].duration_s)
        while i < len(arrivals) and arrivals[i].submit_s <= now:
            t = arrivals[i]
            i += 1
            job = Job(
                id=t.id,
                tenant=t.tenant,
                gpus=t.gpus,
                hosts=gang_nodes(t.gpus, gpn),
                submit_time=t.submit_s,
                requested_runtime_s=t.duration_s if config.exact_runtimes else None,
                predicted=None if config.exact_runtimes else estimator.predict(features(t)),
            )
            site = route(job, now)
            copy = reads[t.id] and DATASET not in holds[site]
            copies += copy
            runtime_at[t.id] = t.duration_s + (config.transfer_s if copy else 0.0)
            queue[site].append(job)
            placed[site] += 1
        for s in SITES:
            if not queue[s] or not any(free[s]):
                continue
            reply = schedule(
                SchedulingRequest(
                    now=now,
                    queue=queue[s],
                    running=running[s],
                    cluster=FreeCapacity(free=free[s], capacity=capacity[s], leaf_of=leaf_of[s]),
                    policy=policy,
                    config=cycle,
                )
            )
            if not reply.starts:
                continue
            waiting = {j.id: j for j in queue[s]}
            for start in reply.starts:
                job = waiting.pop(start.job_id)
                for h, g in start.hosts:
                    free[s][h] -= g
                running[s].append(
                    RunningJob(job=job, hosts=tuple(start.hosts), started_at=now, planned_end=start.planned_end)
                )
                started[job.id] = now
                heapq.heappush(ends, (now + runtime_at[job.id], s, job.id))
            queue[s] = list(waiting.values())
    jct = [finished[t.id] - t.submit_s for t in arrivals]
    return TwoSiteResult(
        strategy=strategy,
        jobs=len(arrivals),
        avg_jct_s=statistics.fmean(jct) if jct else 0.0,
        median_jct_s=statistics.median(jct) if jct else 0.0,
        avg_queue_s=statistics.fmean(started[t.id] - t.submit_s for t in arrivals) if arrivals else 0.0,
        placed=placed,
        copies=copies,
    )
